package tokenizer

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// tinyDoc returns a small byte-level BPE tokenizer.json as a map, for tests
// that edit it: the 256 byte tokens (id = byte), merges building "hello"
// and " world", one added token and a BOS template.
func tinyDoc() map[string]any {
	vocab := map[string]any{}
	for b := 0; b < 256; b++ {
		vocab[string(byteRune[b])] = b
	}
	var merges []any
	for i, m := range [][2]string{{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}, {"o", "r"}, {"Ġw", "or"}, {"l", "d"}, {"Ġwor", "ld"}} {
		vocab[m[0]+m[1]] = 256 + i
		merges = append(merges, m[0]+" "+m[1])
	}
	return map[string]any{
		"version": "1.0",
		"added_tokens": []any{
			map[string]any{"id": 265, "content": "<|end|>", "special": true},
			map[string]any{"id": 266, "content": "<s>", "special": true},
		},
		"normalizer":    map[string]any{"type": "NFC"},
		"pre_tokenizer": map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
		"post_processor": map[string]any{
			"type":           "TemplateProcessing",
			"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>"}}, map[string]any{"Sequence": map[string]any{"id": "A"}}},
			"special_tokens": map[string]any{"<s>": map[string]any{"id": "<s>", "ids": []any{266}}},
		},
		"model": map[string]any{"type": "BPE", "vocab": vocab, "merges": merges},
	}
}

func encodeDoc(t testing.TB, doc map[string]any) []byte {
	t.Helper()
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestTinyTokenizer(t *testing.T) {
	tok, err := Load(bytes.NewReader(encodeDoc(t, tinyDoc())))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		text    string
		special bool
		want    []uint64
	}{
		{"hello world", false, []uint64{259, 264}},
		{"hello world", true, []uint64{266, 259, 264}},
		{"hello<|end|>", false, []uint64{259, 265}},
		{"", true, []uint64{266}},
		{"", false, nil},
		{"hel", false, []uint64{256, 'l'}},
		{"\xff", false, []uint64{0xEF, 0xBF, 0xBD}}, // invalid UTF-8 reads as U+FFFD
	} {
		got := tok.Encode(tc.text, tc.special)
		if !slices.Equal(got, tc.want) {
			t.Errorf("Encode(%q, %v) = %v, want %v", tc.text, tc.special, got, tc.want)
		}
	}
	if n := tok.VocabSize(); n != 267 {
		t.Errorf("VocabSize %d, want 267", n)
	}
}

func TestMergesAsPairs(t *testing.T) {
	// tokenizers >= 0.20 writes merges as ["a","b"] pairs; escapes must
	// decode in both forms.
	strs := tinyDoc()
	pairs := tinyDoc()
	var ps []any
	for _, m := range strs["model"].(map[string]any)["merges"].([]any) {
		l, r, _ := strings.Cut(m.(string), " ")
		ps = append(ps, []any{l, r})
	}
	pairs["model"].(map[string]any)["merges"] = ps
	a, err := Load(bytes.NewReader(encodeDoc(t, strs)))
	if err != nil {
		t.Fatal(err)
	}
	escaped := bytes.ReplaceAll(encodeDoc(t, pairs), []byte(`"Ġ"`), []byte(`"\u0120"`))
	b, err := Load(bytes.NewReader(escaped))
	if err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{"hello world", " world world", "hello<|end|>", "wor ld"} {
		if x, y := a.Encode(text, false), b.Encode(text, false); !slices.Equal(x, y) || len(x) == 0 {
			t.Errorf("%q: strings %v, pairs %v", text, x, y)
		}
	}
	var m mergeJSON
	if err := json.Unmarshal([]byte(`"\u0120w or"`), &m); err != nil || m.left != "Ġw" || m.right != "or" {
		t.Errorf("escaped merge: %+v %v", m, err)
	}
}

func TestLocalTokenize(t *testing.T) {
	tok, _ := qwen(t)
	ctx := context.Background()
	ids, err := tok.Tokenize(ctx, "any-model", Input{Prompt: "Hello world"})
	if err != nil || !slices.Equal(ids, []uint64{9707, 1879}) {
		t.Fatalf("ids %v err %v", ids, err)
	}
	_, err = tok.Tokenize(ctx, "", Input{Messages: []Message{{Role: "user", Content: "hi"}}})
	if !errors.Is(err, ErrChatTemplate) || !strings.Contains(err.Error(), "the engine's /tokenize") || !strings.Contains(err.Error(), "completion prompts only") {
		t.Fatalf("chat: err %v, want ErrChatTemplate", err)
	}
	_, err = tok.Tokenize(ctx, "", Input{Prompt: "x", Messages: []Message{{Role: "user"}}})
	if !errors.Is(err, ErrInvalidInput) {
		t.Fatalf("both forms: err %v", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := tok.Tokenize(cancelled, "", Input{Prompt: "x"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: err %v", err)
	}
}

// cancelAfter is a context whose Err turns to Canceled after n calls,
// to cancel deterministically in the middle of an encoding.
type cancelAfter struct {
	context.Context
	n int
}

func (c *cancelAfter) Err() error {
	if c.n--; c.n < 0 {
		return context.Canceled
	}
	return nil
}

func TestLocalCancelMidway(t *testing.T) {
	tok, _ := qwen(t)
	text := strings.Repeat("word ", 5*ctxCheckEvery)
	ids, err := tok.Tokenize(&cancelAfter{context.Background(), 2}, "", Input{Prompt: text})
	if !errors.Is(err, context.Canceled) || ids != nil {
		t.Fatalf("ids %d, err %v; want cancellation midway", len(ids), err)
	}
	// The pooled scratch is clean afterwards.
	if got := tok.Encode("Hello world", false); !slices.Equal(got, []uint64{9707, 1879}) {
		t.Fatalf("after cancel: %v", got)
	}
}

func TestLoadErrors(t *testing.T) {
	set := func(path string, v any) func(map[string]any) {
		return func(d map[string]any) {
			parts := strings.Split(path, ".")
			m := d
			for _, p := range parts[:len(parts)-1] {
				m = m[p].(map[string]any)
			}
			m[parts[len(parts)-1]] = v
		}
	}
	for _, tc := range []struct {
		name    string
		edit    func(map[string]any)
		raw     []byte // instead of the edited tiny doc
		want    string
		unsupp  bool // errors.Is(err, ErrUnsupported)
		gzipped bool
	}{
		{name: "not JSON", raw: []byte("<html>"), want: "not a valid tokenizer.json"},
		{name: "empty", raw: []byte{}, want: "not a valid tokenizer.json"},
		{name: "array", raw: []byte("[1,2]"), want: "not a valid tokenizer.json"},
		{name: "no model", raw: []byte(`{"added_tokens":[]}`), want: `no "model" section`},
		{name: "truncated gzip", raw: []byte{0x1f, 0x8b, 8, 0, 0, 0}, want: "EOF"},
		{name: "unigram", edit: set("model.type", "Unigram"), want: "model.type Unigram", unsupp: true},
		{name: "wordpiece", edit: set("model.type", "WordPiece"), want: "model.type WordPiece", unsupp: true},
		{name: "no type no merges", edit: func(d map[string]any) {
			m := d["model"].(map[string]any)
			delete(m, "type")
			delete(m, "merges")
		}, want: "model.type (none)", unsupp: true},
		{name: "dropout", edit: set("model.dropout", 0.1), want: "dropout", unsupp: true},
		{name: "subword prefix", edit: set("model.continuing_subword_prefix", "##"), want: "continuing_subword_prefix", unsupp: true},
		{name: "word suffix", edit: set("model.end_of_word_suffix", "</w>"), want: "end_of_word_suffix", unsupp: true},
		{name: "vocab missing a byte", edit: func(d map[string]any) {
			delete(d["model"].(map[string]any)["vocab"].(map[string]any), "Ġ")
		}, want: "no token for byte 0x20", unsupp: true},
		{name: "empty vocab", edit: set("model.vocab", map[string]any{}), want: "model.vocab is empty"},
		{name: "negative id", edit: func(d map[string]any) {
			d["model"].(map[string]any)["vocab"].(map[string]any)["x"] = -1
		}, want: "not a valid tokenizer.json"},
		{name: "merge not in vocab", edit: set("model.merges", []any{"q z"}), want: `model.merges[0] "q" "z": token not in model.vocab`},
		{name: "merge malformed", edit: set("model.merges", []any{"abc"}), want: "not two space-separated tokens"},
		{name: "merge wrong shape", edit: set("model.merges", []any{[]any{"a", "b", "c"}}), want: "is not a pair"},
		{name: "metaspace", edit: set("pre_tokenizer", map[string]any{"type": "Metaspace", "replacement": "▁"}), want: "pre_tokenizer Metaspace", unsupp: true},
		{name: "no pre-tokenizer", edit: set("pre_tokenizer", nil), want: "no pre_tokenizer", unsupp: true},
		{name: "split only", edit: set("pre_tokenizer", map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "\\s+"}, "behavior": "Isolated"}),
			want: "no ByteLevel step", unsupp: true},
		{name: "split removed", edit: set("pre_tokenizer", map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "\\s+"}, "behavior": "Removed"},
			map[string]any{"type": "ByteLevel"}}}), want: `Split behavior "Removed"`, unsupp: true},
		{name: "split inverted", edit: set("pre_tokenizer", map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "\\s+"}, "behavior": "Isolated", "invert": true},
			map[string]any{"type": "ByteLevel"}}}), want: "invert", unsupp: true},
		{name: "bad regex", edit: set("pre_tokenizer", map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "(?<"}, "behavior": "Isolated"},
			map[string]any{"type": "ByteLevel"}}}), want: `Split regex "(?<"`, unsupp: true},
		{name: "split after bytelevel", edit: set("pre_tokenizer", map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "ByteLevel"},
			map[string]any{"type": "Split", "pattern": map[string]any{"String": " "}, "behavior": "Isolated"}}}), want: "Split after ByteLevel", unsupp: true},
		{name: "lowercase normalizer", edit: set("normalizer", map[string]any{"type": "Lowercase"}), want: "normalizer Lowercase", unsupp: true},
		{name: "nested normalizer", edit: set("normalizer", map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "NFC"}, map[string]any{"type": "Prepend", "prepend": "▁"}}}), want: "normalizer Prepend", unsupp: true},
		{name: "unknown post-processor", edit: set("post_processor", map[string]any{"type": "Fancy"}), want: "post_processor Fancy", unsupp: true},
		{name: "template with B", edit: set("post_processor", map[string]any{"type": "TemplateProcessing",
			"single": []any{map[string]any{"Sequence": map[string]any{"id": "B"}}}}), want: `sequence "B"`, unsupp: true},
		{name: "template unknown special", edit: set("post_processor", map[string]any{"type": "TemplateProcessing",
			"single": []any{map[string]any{"SpecialToken": map[string]any{"id": "<x>"}}, map[string]any{"Sequence": map[string]any{"id": "A"}}}}),
			want: `special token "<x>" is not in special_tokens`},
		{name: "added token without id", edit: set("added_tokens", []any{map[string]any{"content": "<x>"}}), want: `added_tokens[0] "<x>" has no id`},
		{name: "gzipped unigram", edit: set("model.type", "Unigram"), want: "model.type Unigram", unsupp: true, gzipped: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := tc.raw
			if data == nil {
				d := tinyDoc()
				tc.edit(d)
				data = encodeDoc(t, d)
			}
			if tc.gzipped {
				var buf bytes.Buffer
				zw := gzip.NewWriter(&buf)
				zw.Write(data)
				zw.Close()
				data = buf.Bytes()
			}
			path := filepath.Join(t.TempDir(), "tokenizer.json")
			if err := os.WriteFile(path, data, 0o644); err != nil {
				t.Fatal(err)
			}
			tok, err := LoadFile(path)
			if err == nil {
				t.Fatalf("loaded (%d tokens), want error %q", tok.VocabSize(), tc.want)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.want) || !strings.Contains(msg, path) {
				t.Errorf("error %q: want it to name %q and the path", msg, tc.want)
			}
			if errors.Is(err, ErrUnsupported) != tc.unsupp {
				t.Errorf("errors.Is(ErrUnsupported) = %v, want %v (%v)", !tc.unsupp, tc.unsupp, err)
			}
		})
	}
	if _, err := LoadFile("/nonexistent/tokenizer.json"); err == nil || !strings.Contains(err.Error(), "/nonexistent/tokenizer.json") {
		t.Errorf("missing file: %v", err)
	}
}

func TestLoadAccepts(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(map[string]any)
		text string
		want []uint64
	}{
		{"roberta processor", func(d map[string]any) {
			d["post_processor"] = map[string]any{"type": "RobertaProcessing", "cls": []any{"<s>", 266}, "sep": []any{"<|end|>", 265}}
		}, "hello", []uint64{266, 259, 265}},
		{"no post-processor", func(d map[string]any) { d["post_processor"] = nil }, "hello", []uint64{259}},
		{"untyped BPE model", func(d map[string]any) { delete(d["model"].(map[string]any), "type") }, "hello", []uint64{266, 259}},
		{"sequence normalizer", func(d map[string]any) {
			d["normalizer"] = map[string]any{"type": "Sequence", "normalizers": []any{map[string]any{"type": "NFD"}, map[string]any{"type": "NFC"}}}
		}, "hello", []uint64{266, 259}},
		{"split string pattern", func(d map[string]any) {
			d["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
				map[string]any{"type": "Split", "pattern": map[string]any{"String": "l"}, "behavior": "Isolated"},
				map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}}}
		}, "hello", []uint64{266, 256, 'l', 'l', 'o'}},
		{"dropout zero", func(d map[string]any) { d["model"].(map[string]any)["dropout"] = 0 }, "hello", []uint64{266, 259}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tinyDoc()
			tc.edit(d)
			tok, err := Load(bytes.NewReader(encodeDoc(t, d)))
			if err != nil {
				t.Fatal(err)
			}
			if got := tok.Encode(tc.text, true); !slices.Equal(got, tc.want) {
				t.Errorf("Encode(%q) = %v, want %v", tc.text, got, tc.want)
			}
		})
	}
}

// TestBPEScanHeap checks that the two merge loops agree on random pieces,
// including long ones that exercise many merges.
func TestBPEScanHeap(t *testing.T) {
	tok, _ := qwen(t)
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "b", "e", "in", "the", " ", "  ", "\n", "1", "é", "中", "😀", "ab", "er", "on"}
	var s1, s2 bpeScratch
	for i := range 3000 {
		var b strings.Builder
		n := 1 + rng.IntN(20)
		if i%10 == 0 {
			n = 100 + rng.IntN(400)
		}
		for range n {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		piece := []byte(b.String())
		scan := tok.model.encodeScan(nil, piece, &s1)
		heap := tok.model.encodeHeap(nil, piece, &s2)
		if !slices.Equal(scan, heap) {
			t.Fatalf("piece %q: scan %v heap %v", piece, scan, heap)
		}
	}
}

// vocabBytes maps ids of the Qwen2.5 tokenizer back to the bytes they
// spell, to check that encoding loses nothing.
func vocabBytes(t testing.TB, f *fileJSON) map[uint64][]byte {
	out := make(map[uint64][]byte, len(f.Model.Vocab)+len(f.AddedTokens))
	for tok, id := range f.Model.Vocab {
		b, ok := byteLevelDecode(nil, tok)
		if !ok {
			t.Fatalf("vocab token %q is not byte-level", tok)
		}
		out[uint64(id)] = b
	}
	for _, a := range f.AddedTokens {
		out[uint64(*a.ID)] = []byte(a.Content)
	}
	return out
}

var (
	decodeOnce sync.Once
	decodeMap  map[uint64][]byte
)

func decode(t testing.TB, ids []uint64) string {
	f := qwenParsed(t)
	decodeOnce.Do(func() { decodeMap = vocabBytes(t, f) })
	var b []byte
	for _, id := range ids {
		piece, ok := decodeMap[id]
		if !ok {
			t.Fatalf("id %d is not in the vocabulary", id)
		}
		b = append(b, piece...)
	}
	return string(b)
}

// expectRoundTrip is what decoding the ids of s must give: s with invalid
// UTF-8 replaced, NFC-normalised between the added tokens (which Qwen2.5's
// normalizer leaves alone).
func expectRoundTrip(tok *Local, s string) string {
	if !utf8.ValidString(s) {
		s = replaceInvalid(s)
	}
	var b strings.Builder
	for _, sp := range tok.raw.split(nil, s) {
		if sp.tok >= 0 {
			b.WriteString(tok.raw.tokens[sp.tok].content)
		} else {
			b.WriteString(norm.NFC.String(s[sp.start:sp.end]))
		}
	}
	return b.String()
}

// FuzzLocalEncode checks, for any input, that encoding does not panic,
// is deterministic, and loses nothing: the ids spell the normalised text.
func FuzzLocalEncode(f *testing.F) {
	g := readGolden(f, "testdata/golden.json")
	for _, s := range g.Texts[:120] {
		f.Add(s)
	}
	f.Add("\xff\xfe<|im_start|>\x80")
	f.Add(strings.Repeat("\u0301", 100))
	tok, _ := qwen(f)
	f.Fuzz(func(t *testing.T, s string) {
		ids := tok.Encode(s, true)
		if again := tok.Encode(s, true); !slices.Equal(ids, again) {
			t.Fatalf("nondeterministic: %v then %v", ids, again)
		}
		if got, want := decode(t, ids), expectRoundTrip(tok, s); got != want {
			t.Fatalf("round trip of %q: got %q", want, got)
		}
	})
}

// FuzzLoad feeds edited tokenizer files to the loader: it must fail
// cleanly or load something that encodes without panicking.
func FuzzLoad(f *testing.F) {
	base := encodeDoc(f, tinyDoc())
	f.Add(base)
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{},"merges":[]}}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":["a a"]},"pre_tokenizer":{"type":"ByteLevel"}}`))
	f.Add(bytes.Replace(base, []byte(`"use_regex":true`), []byte(`"use_regex":false`), 1))
	f.Fuzz(func(t *testing.T, data []byte) {
		tok, err := Load(bytes.NewReader(data))
		if err != nil {
			return
		}
		tok.Encode("hello world <|end|> \xff 中文", true)
	})
}
