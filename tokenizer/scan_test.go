package tokenizer

import (
	"slices"
	"strings"
	"testing"

	"golang.org/x/text/unicode/norm"
)

// FuzzNormalize: normalize, which checks only what follows the text's
// ASCII prefix, gives what each form applied in turn to the whole text
// gives, for every form and pair of forms.
//
//	go test -run '^$' -fuzz '^FuzzNormalize$' -fuzztime 60s ./tokenizer
func FuzzNormalize(f *testing.F) {
	for _, s := range []string{"", "plain ascii text", "e\u0301", "abcdefgh\u0301", "abcdefghi\u0301", "\u0301", "x\xff\u00e9", "\uFB01 ligature", "\u1100\u1161\u11a8", "abcdefg\u1100\u1161", strings.Repeat("a", 17) + "\u0327\u0301", "caf\u00e9 and na\u0131ve e\u0301 then \u00e9e\u0301", "\u00e9 x \u0301 y \u1100\u1161 z \u00c5\u030a", "ok \u00e9 ok \u212b"} {
		f.Add(s)
	}
	forms := []norm.Form{norm.NFC, norm.NFD, norm.NFKC, norm.NFKD}
	f.Fuzz(func(t *testing.T, s string) {
		for _, a := range forms {
			for _, b := range append([]norm.Form{-1}, forms...) {
				l := &Local{forms: []norm.Form{a}}
				want := a.String(s)
				if b >= 0 {
					l.forms = append(l.forms, b)
					want = b.String(want)
				}
				if got := l.normalize(s); got != want {
					t.Fatalf("forms %v: normalize(%q) = %q, want %q", l.forms, s, got, want)
				}
			}
		}
		if got := asciiPrefix(s); got != len(s) && (s[got] < 0x80 || strings.IndexFunc(s[:got], func(r rune) bool { return r >= 0x80 }) >= 0) {
			t.Fatalf("asciiPrefix(%q) = %d", s, got)
		}
	})
}

// FuzzAddedSplit: a set of added tokens sharing their first byte, which
// looks for it with strings.IndexByte, splits text as the byte-by-byte
// scan does.
//
//	go test -run '^$' -fuzz '^FuzzAddedSplit$' -fuzztime 60s ./tokenizer
func FuzzAddedSplit(f *testing.F) {
	f.Add("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<|im_start|>", "<|im_end|>", true)
	f.Add("a <<|x|> <|x|>< |x| <tool_call>", "<|x|>", "<tool_call>", false)
	f.Add("<<<", "<", "<<", true)
	f.Fuzz(func(t *testing.T, text, a, b string, strip bool) {
		if a == "" || b == "" || a[0] != b[0] {
			return
		}
		set := newAddedSet([]addedToken{{content: a, id: 1, lstrip: strip}, {content: b, id: 2, rstrip: strip, singleWord: strip}})
		if set.only != int(a[0]) {
			t.Fatalf("only = %d, want %d", set.only, a[0])
		}
		got := set.split(nil, text)
		set.only = -1
		if want := set.split(nil, text); !slices.Equal(got, want) {
			t.Fatalf("split(%q) with IndexByte %v, byte by byte %v", text, got, want)
		}
	})
}

// TestAddedSetOnly: only is the first byte the tokens share, or -1 when
// they have several.
func TestAddedSetOnly(t *testing.T) {
	cases := []struct {
		tokens []string
		want   int
	}{
		{[]string{"<|a|>", "<b>", "</c>"}, '<'},
		{[]string{"<|a|>", "[INST]"}, -1},
		{[]string{"x"}, 'x'},
	}
	for _, c := range cases {
		var toks []addedToken
		for i, s := range c.tokens {
			toks = append(toks, addedToken{content: s, id: uint32(i)})
		}
		if got := newAddedSet(toks).only; got != c.want {
			t.Errorf("%q: only = %d, want %d", c.tokens, got, c.want)
		}
	}
}
