package trace

import (
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// readAll reads every record of a trace given as text.
func readAll(t *testing.T, text string, opt Options) ([]Record, string, error) {
	t.Helper()
	rd := NewReader(strings.NewReader(text), opt)
	var out []Record
	for {
		rec, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return out, rd.Format(), nil
		}
		if err != nil {
			return out, rd.Format(), err
		}
		out = append(out, rec)
	}
}

func TestReadMooncake(t *testing.T) {
	text := `{"timestamp": 0, "input_length": 655, "output_length": 52, "hash_ids": [46, 47]}

{"timestamp": 10535, "input_length": 1024, "output_length": 0, "hash_ids": [46, 48, 49]}
{"timestamp": 10535.5, "input_length": 1, "output_length": 26, "hash_ids": [50]}
`
	recs, format, err := readAll(t, text, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if format != FormatMooncake {
		t.Fatalf("format %q, want %q", format, FormatMooncake)
	}
	want := []Record{
		{Line: 1, Time: 0, Blocks: []uint64{46, 47}, Input: 655, Output: 52},
		// More ids than the input needs are allowed: the prompt is cut at
		// input_length.
		{Line: 3, Time: 10535 * time.Millisecond, Blocks: []uint64{46, 48, 49}, Input: 1024, Output: 0},
		{Line: 4, Time: 10535500 * time.Microsecond, Blocks: []uint64{50}, Input: 1, Output: 26},
	}
	if len(recs) != len(want) {
		t.Fatalf("%d records, want %d: %+v", len(recs), len(want), recs)
	}
	for i := range want {
		g, w := recs[i], want[i]
		if g.Line != w.Line || g.Time != w.Time || !slices.Equal(g.Blocks, w.Blocks) || g.Input != w.Input || g.Output != w.Output || g.Tokens != nil || g.Session != "" {
			t.Errorf("record %d: %+v, want %+v", i, g, w)
		}
	}
}

func TestReadKVIndex(t *testing.T) {
	text := `{"timestamp": 0, "session_id": "u1", "token_ids": [1, 2, 3], "output_length": 5}
{"timestamp": 5, "session_id": "u1", "text": "hello world", "output_length": 7}
{"timestamp": 9, "hash_ids": [4, 5], "input_length": 40, "output_length": 1}
{"timestamp": 9, "token_ids": [9], "output_length": 1}
`
	tokenize := func(s string) ([]uint64, error) {
		var ids []uint64
		for _, w := range strings.Fields(s) {
			ids = append(ids, uint64(len(w)))
		}
		return ids, nil
	}
	recs, format, err := readAll(t, text, Options{BlockTokens: 32, Tokenize: tokenize})
	if err != nil {
		t.Fatal(err)
	}
	if format != FormatKVIndex {
		t.Fatalf("format %q, want %q", format, FormatKVIndex)
	}
	if len(recs) != 4 {
		t.Fatalf("%d records: %+v", len(recs), recs)
	}
	if r := recs[0]; r.Session != "u1" || !slices.Equal(r.Tokens, []uint64{1, 2, 3}) || r.Input != 3 || r.Output != 5 {
		t.Errorf("token_ids line: %+v", r)
	}
	if r := recs[1]; r.Session != "u1" || !slices.Equal(r.Tokens, []uint64{5, 5}) || r.Input != 2 || r.Time != 5*time.Millisecond {
		t.Errorf("text line: %+v", r)
	}
	if r := recs[2]; r.Session != "" || !slices.Equal(r.Blocks, []uint64{4, 5}) || r.Input != 40 || r.Tokens != nil {
		t.Errorf("hash_ids line: %+v", r)
	}
}

func TestDetect(t *testing.T) {
	for _, tc := range []struct {
		line, want string
	}{
		{`{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}`, FormatMooncake},
		{`{"timestamp": 0, "session_id": "a", "hash_ids": [1], "input_length": 1, "output_length": 1}`, FormatKVIndex},
		{`{"token_ids": [1]}`, FormatKVIndex},
		{`{"text": "x"}`, FormatKVIndex},
		{`not json`, FormatMooncake},
	} {
		if got := Detect([]byte(tc.line)); got != tc.want {
			t.Errorf("Detect(%s) = %q, want %q", tc.line, got, tc.want)
		}
	}
}

// TestBadLines checks that each kind of bad line is refused with an error
// that names its line and says what is wrong.
func TestBadLines(t *testing.T) {
	const ok = `{"timestamp": 100, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}` + "\n"
	const kv = `{"timestamp": 100, "session_id": "s", "token_ids": [1], "output_length": 5}` + "\n"
	for _, tc := range []struct {
		name  string
		text  string
		line  int
		want  string
		cause error
	}{
		{"bad JSON", ok + `{"timestamp": 1,` + "\n", 2, "not a JSON object", nil},
		{"not an object", `[1, 2]`, 1, "not a JSON object but an array", nil},
		{"two values", ok + ok[:len(ok)-1] + " {}\n", 2, "more than one JSON value", nil},
		{"unknown field", `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1], "prio": 2}`, 1, `unknown field "prio" in a Mooncake trace`, nil},
		{"unknown field kvindex", kv + `{"timestamp": 100, "token_ids": [1], "output_length": 5, "model": "m"}`, 2, `unknown field "model" in a kvindex trace`, nil},
		{"missing hash_ids", ok + `{"timestamp": 200, "input_length": 600, "output_length": 5}`, 2, `missing "hash_ids"`, nil},
		{"missing input_length", `{"timestamp": 0, "output_length": 5, "hash_ids": [1]}`, 1, `missing "input_length"`, nil},
		{"missing output_length", `{"timestamp": 0, "input_length": 5, "hash_ids": [1]}`, 1, `missing "output_length"`, nil},
		{"missing timestamp", `{"input_length": 5, "output_length": 5, "hash_ids": [1]}`, 1, `missing "timestamp"`, nil},
		{"negative input", `{"timestamp": 0, "input_length": -1, "output_length": 5, "hash_ids": [1]}`, 1, `negative "input_length" -1`, nil},
		{"negative output", ok + ok + `{"timestamp": 300, "input_length": 1, "output_length": -7, "hash_ids": [1]}`, 3, `negative "output_length" -7`, nil},
		{"fractional length", `{"timestamp": 0, "input_length": 1.5, "output_length": 5, "hash_ids": [1]}`, 1, `field "input_length": number 1.5 is not of type int64`, nil},
		{"negative id", `{"timestamp": 0, "input_length": 1, "output_length": 5, "hash_ids": [-3]}`, 1, `field "hash_ids": number -3`, nil},
		{"negative timestamp", `{"timestamp": -5, "input_length": 1, "output_length": 5, "hash_ids": [1]}`, 1, "negative timestamp -5", nil},
		{"unsorted", ok + `{"timestamp": 99, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}`, 2, "timestamp 99ms is before line 1's 100ms", nil},
		{"too few ids", `{"timestamp": 0, "input_length": 1025, "output_length": 5, "hash_ids": [1, 2]}`, 1, "2 hash_ids of 512 tokens cannot make input_length 1025 (want 3", nil},
		{"empty prompt", `{"timestamp": 0, "input_length": 0, "output_length": 5, "hash_ids": []}`, 1, `"input_length" 0`, nil},
		{"kvindex field in a Mooncake trace", ok + kv, 2, `"session_id" in a Mooncake trace`, nil},
		{"two prompts", `{"timestamp": 0, "token_ids": [1], "text": "a", "output_length": 1}`, 1, "exactly one of", nil},
		{"input_length with tokens", `{"timestamp": 0, "token_ids": [1], "input_length": 1, "output_length": 1}`, 1, `"input_length" goes with "hash_ids" only`, nil},
		{"hash_ids without input_length", kv + `{"timestamp": 100, "hash_ids": [1], "output_length": 1}`, 2, `"hash_ids" without "input_length"`, nil},
		{"empty tokens", `{"timestamp": 0, "token_ids": [], "output_length": 1}`, 1, "empty prompt", nil},
		{"empty session", `{"timestamp": 0, "session_id": "", "token_ids": [1], "output_length": 1}`, 1, `empty "session_id"`, nil},
		{"text without a tokenizer", kv + `{"timestamp": 100, "text": "hi", "output_length": 1}`, 2, "a text prompt needs a tokenizer", ErrNoTokenizer},
		{"after blank lines", ok + "\n\n" + `{"timestamp": 1e13, "input_length": 1, "output_length": 1, "hash_ids": [1]}`, 4, "over the limit", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := readAll(t, tc.text, Options{})
			var le *LineError
			if !errors.As(err, &le) {
				t.Fatalf("error %v, want a *LineError", err)
			}
			prefix := "line " + strconv.Itoa(tc.line) + ": "
			if le.Line != tc.line || !strings.HasPrefix(err.Error(), prefix) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want %q... mentioning %q", err, prefix, tc.want)
			}
			if tc.cause != nil && !errors.Is(err, tc.cause) {
				t.Fatalf("error %v does not wrap %v", err, tc.cause)
			}
		})
	}
}

func TestEmptyTrace(t *testing.T) {
	for _, text := range []string{"", "\n\n  \n"} {
		_, _, err := readAll(t, text, Options{})
		if err == nil || !strings.Contains(err.Error(), "no requests") {
			t.Errorf("%q: error %v, want one saying the trace holds no requests", text, err)
		}
	}
}

// TestReaderStopsAtTheFirstError checks that a refused line ends the
// reading: Next keeps returning its error.
func TestReaderStopsAtTheFirstError(t *testing.T) {
	rd := NewReader(strings.NewReader("{}\n"+`{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}`), Options{})
	_, err1 := rd.Next()
	_, err2 := rd.Next()
	if err1 == nil || err1 != err2 {
		t.Fatalf("errors %v then %v, want the same error twice", err1, err2)
	}
}

// FuzzDecodeLine feeds arbitrary lines to the decoder in both formats: it
// must never panic, and a line it accepts must describe a prompt it can
// make.
func FuzzDecodeLine(f *testing.F) {
	for _, s := range []string{
		`{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59]}`,
		`{"timestamp": 0, "session_id": "u42", "text": "You are a helpful assistant.", "output_length": 120}`,
		`{"timestamp": 850, "session_id": "u42", "token_ids": [151644, 8948, 198], "output_length": 64}`,
		`{"timestamp": 1e3, "hash_ids": [1], "input_length": 512, "output_length": 0}`,
		`{"timestamp": 0, "input_length": -1}`, `[]`, `null`, `{"hash_ids": null}`, `{}`, `"x"`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	tokenize := func(s string) ([]uint64, error) { return []uint64{uint64(len(s))}, nil }
	f.Fuzz(func(t *testing.T, line []byte, kvindex bool) {
		format := FormatMooncake
		if kvindex {
			format = FormatKVIndex
		}
		opt := Options{Tokenize: tokenize}
		rec, err := DecodeLine(line, format, opt)
		if err != nil {
			return
		}
		if rec.Time < 0 || rec.Input < 1 || rec.Output < 0 {
			t.Fatalf("accepted %q as %+v", line, rec)
		}
		if rec.Blocks != nil && len(rec.Blocks)*MooncakeBlockTokens < rec.Input || rec.Blocks == nil && len(rec.Tokens) != rec.Input {
			t.Fatalf("accepted %q whose prompt cannot be made: %+v", line, rec)
		}
		if format == FormatMooncake && (rec.Blocks == nil || rec.Session != "") {
			t.Fatalf("accepted %q as a Mooncake line without block ids or with a session: %+v", line, rec)
		}
		// As a whole file: the reader neither panics nor loops.
		rd := NewReader(strings.NewReader(string(line)+"\n"+string(line)), opt)
		for range 3 {
			if _, err := rd.Next(); err != nil {
				break
			}
		}
	})
}
