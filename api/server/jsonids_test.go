package server

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// decodeTokens decodes an HTTP longest-prefix body whose tokens are
// tokensJSON, as the server does, and returns the prompt's ids or the
// error the client would read.
func decodeTokens(tb testing.TB, s *Server, tokensJSON string) ([]uint64, string) {
	tb.Helper()
	r := httptest.NewRequest(http.MethodPost, "/v1/longest-prefix", strings.NewReader(`{"model":"m","tokens":`+tokensJSON+`}`))
	w := httptest.NewRecorder()
	var body longestPrefixRequestJSON
	if err := s.decodeBody(w, r, &body); err != nil {
		var e struct{ Error string }
		if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil {
			tb.Fatalf("answer %q is not a JSON error: %v", w.Body.Bytes(), err)
		}
		return nil, e.Error
	}
	p, err := body.toProto()
	if err != nil {
		return nil, err.Error()
	}
	ids := p.GetTokens().GetIds()
	if ids == nil {
		ids = []uint64{}
	}
	return ids, ""
}

func jsonTestServer() *Server { return &Server{cfg: Config{MaxTokens: DefaultMaxTokens}} }

// Token ids decode exactly over the whole uint64 range; anything else is
// refused with a message naming the field, what it got and what it
// wants.
func TestIDsJSON(t *testing.T) {
	s := jsonTestServer()
	const wantID = "want an integer from 0 to 18446744073709551615"
	tests := []struct {
		in   string
		want []uint64
		err  string
	}{
		{`[]`, []uint64{}, ""},
		{` [ 1 , 2,3 ] `, []uint64{1, 2, 3}, ""},
		{`[0, 18446744073709551615]`, []uint64{0, 1<<64 - 1}, ""},
		{`[9007199254740993]`, []uint64{9007199254740993}, ""}, // above 2^53: exact
		{`[18446744073709551616]`, nil, "field tokens: got number 18446744073709551616, " + wantID},
		{`[1, -1]`, nil, "field tokens: got number -1, " + wantID},
		{`[1.5]`, nil, "field tokens: got number 1.5, " + wantID},
		{`[1e3]`, nil, "field tokens: got number 1e3, " + wantID},
		{`[1, "2"]`, nil, "field tokens: got string, " + wantID},
		{`[null]`, []uint64{0}, ""}, // encoding/json's rule: null leaves the element zero
		{`[[1]]`, nil, "field tokens: got array, " + wantID},
		{`"1,2"`, nil, "field tokens: got string, want an array of integers from 0 to 18446744073709551615"},
		{`{}`, nil, "field tokens: got object, want an array of integers"},
		{`12`, nil, "field tokens: got number, want an array of integers"},
		{`null`, nil, "needs one of tokens, prompt, messages or block_hashes"}, // null is absent
	}
	for _, tc := range tests {
		ids, err := decodeTokens(t, s, tc.in)
		switch {
		case tc.err != "":
			if !strings.Contains(err, tc.err) {
				t.Errorf("%s: error %q, want %q", tc.in, err, tc.err)
			}
		case err != "":
			t.Errorf("%s: %s", tc.in, err)
		case !slices.Equal(ids, tc.want):
			t.Errorf("%s: %v, want %v", tc.in, ids, tc.want)
		}
	}
}

// referenceIDs reads a JSON value as token ids through its number
// literals (json.Number and strconv, never float64): ok is false for
// anything but an array of null or integers that fit in 64 bits.
func referenceIDs(s string) (ids []uint64, given, ok bool) {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false, false
	}
	if v == nil {
		return nil, false, true
	}
	arr, isArr := v.([]any)
	if !isArr {
		return nil, true, false
	}
	ids = []uint64{}
	for _, e := range arr {
		switch e := e.(type) {
		case nil:
			ids = append(ids, 0)
		case json.Number:
			x, err := strconv.ParseUint(string(e), 10, 64)
			if err != nil {
				return nil, true, false
			}
			ids = append(ids, x)
		default:
			return nil, true, false
		}
	}
	return ids, true, true
}

// FuzzIDsJSON holds the decoding of token ids to a reading of the JSON
// number literals that never goes through float64: the same ids are
// accepted, exactly, and everything else is refused.
func FuzzIDsJSON(f *testing.F) {
	for _, s := range []string{`[]`, `[1,2,3]`, `[-1]`, `[1.0]`, `[18446744073709551615]`, `[9007199254740993]`, `["a"]`, `[1,]`, `[ 1 ]`, `[01]`, `null`, `[null]`} {
		f.Add(s)
	}
	s := jsonTestServer()
	f.Fuzz(func(t *testing.T, in string) {
		if !json.Valid([]byte(in)) {
			return // the whole body is malformed JSON then
		}
		want, given, ok := referenceIDs(in)
		ids, err := decodeTokens(t, s, in)
		switch {
		case !ok:
			if err == "" {
				t.Fatalf("%q: accepted %v; the reference refuses it", in, ids)
			}
		case !given:
			if !strings.Contains(err, "needs one of tokens") {
				t.Fatalf("%q: %q, want the tokens treated as absent", in, err)
			}
		case err != "":
			t.Fatalf("%q: %s; the reference reads %v", in, err, want)
		case !slices.Equal(ids, want):
			t.Fatalf("%q: %v, the reference reads %v", in, ids, want)
		}
	})
}

// BenchmarkIDList decodes the body of an HTTP longest-prefix query of
// 16,384 token ids (1,024 blocks of 16) as the server does. A
// hand-written parser of the ids, measured here against encoding/json,
// was not clearly faster and was removed (api/README.md, Performance).
func BenchmarkIDList(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	ids := make([]uint64, 16384)
	for i := range ids {
		ids[i] = uint64(rng.IntN(150_000))
	}
	body, err := json.Marshal(map[string]any{"model": testModel, "tokens": ids})
	if err != nil {
		b.Fatal(err)
	}
	s := jsonTestServer()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	var v longestPrefixRequestJSON
	for b.Loop() {
		v = longestPrefixRequestJSON{}
		r := httptest.NewRequest(http.MethodPost, "/v1/longest-prefix", bytes.NewReader(body))
		if err := s.decodeBody(httptest.NewRecorder(), r, &v); err != nil {
			b.Fatal(err)
		}
	}
	if v.Tokens == nil || !slices.Equal(*v.Tokens, ids) {
		b.Fatal("decoded ids differ")
	}
}
