package server

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestIDList(t *testing.T) {
	tests := []struct {
		in   string
		want []uint64
		err  string
	}{
		{`[]`, []uint64{}, ""},
		{` [ 1 , 2,3 ] `, []uint64{1, 2, 3}, ""},
		{`[0, 18446744073709551615]`, []uint64{0, 1<<64 - 1}, ""},
		{`[9007199254740993]`, []uint64{9007199254740993}, ""}, // above 2^53: exact
		{`[18446744073709551616]`, nil, "tokens[0]: 18446744073709551616 does not fit in 64 bits"},
		{`[1, -1]`, nil, "tokens[1]: -1 is negative"},
		{`[1.5]`, nil, "tokens[0]: 1.5 is not an integer"},
		{`[1e3]`, nil, "tokens[0]: 1e3 is not an integer"},
		{`[1, "2"]`, nil, "tokens[1]: a string is not an integer"},
		{`[null]`, nil, "tokens[0]: null is not an integer"},
		{`[[1]]`, nil, "tokens[0]: an array is not an integer"},
		{`"1,2"`, nil, "tokens must be an array"},
		{`{}`, nil, "tokens must be an array"},
		{`12`, nil, "tokens must be an array"},
	}
	for _, tc := range tests {
		l := idList{name: "tokens"}
		err := l.UnmarshalJSON([]byte(tc.in))
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want %q", tc.in, err, tc.err)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.in, err)
		case !slices.Equal(l.ids, tc.want) || !l.set:
			t.Errorf("%s: %v (set %v), want %v", tc.in, l.ids, l.set, tc.want)
		}
	}
}

// The list reuses its buffer.
func TestIDListReuse(t *testing.T) {
	buf := make([]uint64, 0, 8)
	l := idList{name: "tokens", ids: buf}
	if err := json.Unmarshal([]byte(`[4,5,6]`), &l); err != nil {
		t.Fatal(err)
	}
	if &l.ids[0] != &buf[:1][0] {
		t.Error("decoding did not reuse the buffer")
	}
}

// FuzzIDList checks that the decoder never panics and agrees with
// encoding/json wherever encoding/json decodes into []uint64.
func FuzzIDList(f *testing.F) {
	for _, s := range []string{`[]`, `[1,2,3]`, `[-1]`, `[1.0]`, `[18446744073709551615]`, `["a"]`, `[1,]`, `[ 1 ]`, `[01]`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !json.Valid([]byte(s)) {
			return // encoding/json validates before UnmarshalJSON runs
		}
		var l idList
		err := l.UnmarshalJSON([]byte(s))
		var ref []uint64
		refErr := json.Unmarshal([]byte(s), &ref)
		if refErr == nil && strings.TrimSpace(s) != "null" {
			if err != nil {
				t.Fatalf("%q: %v; encoding/json decodes %v", s, err, ref)
			}
			if !slices.Equal(l.ids, ref) && !(len(l.ids) == 0 && len(ref) == 0) {
				t.Fatalf("%q: %v, encoding/json %v", s, l.ids, ref)
			}
		}
		if err == nil && refErr != nil {
			t.Fatalf("%q: accepted %v; encoding/json: %v", s, l.ids, refErr)
		}
	})
}

// BenchmarkIDList decodes the body of an HTTP longest-prefix query of
// 16,384 token ids (1,024 blocks of 16) with the server's JSON decoder
// settings: "idList" into the pooled buffer the handler reuses,
// "encoding-json" into a fresh []uint64 as encoding/json would. The
// justification of idList (jsonids.go) rests on this comparison.
func BenchmarkIDList(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	ids := make([]uint64, 16384)
	for i := range ids {
		ids[i] = uint64(rng.IntN(150_000))
	}
	body, err := json.Marshal(map[string]any{"model": "m", "tokens": ids})
	if err != nil {
		b.Fatal(err)
	}
	decode := func(v any) {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(v); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("idList", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		var v struct {
			Model  string `json:"model"`
			Tokens idList `json:"tokens"`
		}
		for b.Loop() {
			v.Tokens = idList{name: "tokens", ids: v.Tokens.ids[:0]}
			decode(&v)
		}
		if !slices.Equal(v.Tokens.ids, ids) {
			b.Fatal("decoded ids differ")
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		var v struct {
			Model  string    `json:"model"`
			Tokens *[]uint64 `json:"tokens"`
		}
		for b.Loop() {
			v.Tokens = nil
			decode(&v)
		}
		if v.Tokens == nil || !slices.Equal(*v.Tokens, ids) {
			b.Fatal("decoded ids differ")
		}
	})
}
