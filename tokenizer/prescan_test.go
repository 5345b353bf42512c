package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// scanPieces is the scanner's split of text, as regexPieces gives
// regexp2's.
func scanPieces(p scanPattern, text string) []string {
	runes := []rune(text)
	var out []string
	for i := 0; i < len(runes); {
		j := p.next(runes, i)
		if j <= i || j > len(runes) {
			panic("scanner: empty or overlong match")
		}
		out = append(out, string(runes[i:j]))
		i = j
	}
	return out
}

// compiledScannedPatterns compiles each pattern the scanner recognises.
func compiledScannedPatterns(t testing.TB) map[scanPattern]*regexp2.Regexp {
	res := map[scanPattern]*regexp2.Regexp{}
	for pattern, p := range scannedPatterns {
		re, err := compileHFRegex(pattern)
		if err != nil {
			t.Fatalf("%s: %v", pattern, err)
		}
		res[p] = re
	}
	return res
}

// checkScanner fails unless the scanner and regexp2 cut text alike for
// every scanned pattern.
func checkScanner(t *testing.T, res map[scanPattern]*regexp2.Regexp, text string) {
	t.Helper()
	for p, re := range res {
		want := regexPieces(t, re, text)
		if got := scanPieces(p, text); !slices.Equal(got, want) {
			t.Fatalf("pattern %s, text %q:\nscanner %q\nregexp2 %q", re, text, got, want)
		}
	}
}

// scannerSeeds are the inputs where the patterns' alternatives and
// backtracking differ, and the characters at their classes' edges.
var scannerSeeds = []string{
	"", "a", " ", "'", "''", "'s", "'S", "'x", " 's", "x's", "''s'",
	"I'M HE'S they'Re WE'VE you'LL it'D don'T 'r 'v 'l 'lL 'Ll 'rE",
	"x'LL'VE'Re's'd'm't", "it's It'S IT'S 'sup 'Sup", "I'Mx HE'Sa 'REd 'VEry 'LLx 'Dx 'Tx",
	"a\r\nb\r\n\r\nc\n\r\n", "\r\n", "\r", "\n\n\n", "end.\r\n", " ?!\r\n\n x",
	"a  \n  b \n\n c", " \n", "\n ", "  \n  ", "\t\n\t", "x \n", "x\n ",
	"word   ", "  trailing  ", "   lead", "a  b   c", " a", "  a", "\t a",
	"1234567 12 x9999 ٣٤٥٦ ²³ Ⅻ½ 1,000.5",
	"e\u0301 \u0301a \u0301\u0301 a\u0301b",
	"𝒜𝒷𝒸 𐐀𐐨 𝟙𝟚𝟛 \U0001F600x",
	"a\xffb\xc3 \xe2\x82", "\xff's",
	"\ta\t\tb\u00a0c \u00a0d\u00a0 \u00a0\u00a0x",
	"😀 👍🏽 ❤️ 🇫🇷!", " 😀😀 x",
	"\u3000中文\u3000，。 日本語のテキスト", "ǅ ſ K İ",
	"a\u0085b\u0085\u0085", "\v\f x", "\u2028\u2029a", "\u200b\ufeffa",
	"!!!\n\n", "...\r\r\n", " !!! ", "(x) [y] {z}", "a.b,c;d",
	"func main() {\n\tfmt.Println(\"hi\")\n}\n",
	"HELLOworld helloWORLD HelloWorld camelCase ABC'S xY's Don'T",
	"ǅungla Ǆ ʰa aʰB ABCʰDEF 中文ABC aḀb \u0301\u0301A A\u0301\u0301b",
	"a/b\n//c ./\r\n/ x /// //\n",
}

// FuzzPreTokenizeScanner: the scanner's pieces are regexp2's, for every
// pattern it recognises.
//
//	go test -run '^$' -fuzz '^FuzzPreTokenizeScanner$' -fuzztime 3m ./tokenizer
func FuzzPreTokenizeScanner(f *testing.F) {
	for _, s := range scannerSeeds {
		f.Add(s)
	}
	res := compiledScannedPatterns(f)
	f.Fuzz(func(t *testing.T, text string) {
		if len(text) > 4000 {
			return
		}
		checkScanner(t, res, text)
	})
}

// TestPreTokenizeScannerRandom runs FuzzPreTokenizeScanner's check on
// random texts drawn from runes of every class and the seeds' tricky
// ones, so that plain go test covers more than the seeds.
func TestPreTokenizeScannerRandom(t *testing.T) {
	res := compiledScannedPatterns(t)
	var alphabet []rune
	for _, s := range scannerSeeds {
		for _, r := range s {
			if !slices.Contains(alphabet, r) {
				alphabet = append(alphabet, r)
			}
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	n := 2000
	if testing.Short() || raceEnabled {
		n = 200
	}
	var b strings.Builder
	for range n {
		b.Reset()
		for range 1 + rng.IntN(40) {
			switch rng.IntN(4) {
			case 0: // runs of one rune, for the run lengths
				b.WriteString(strings.Repeat(string(alphabet[rng.IntN(len(alphabet))]), 1+rng.IntN(5)))
			case 1:
				b.WriteString([]string{" ", "'", "\n", "\r\n", "s", "S", "ll", "re"}[rng.IntN(8)])
			default:
				b.WriteRune(alphabet[rng.IntN(len(alphabet))])
			}
		}
		checkScanner(t, res, b.String())
	}
}

// TestRuneClasses: the scanner's classes are regexp2's \p{L}, \p{N}, \s
// and [\r\n], and o200k's word classes, on every rune below U+3400 and a
// sample of the rest.
func TestRuneClasses(t *testing.T) {
	classes := []struct {
		class   runeClass
		pattern string
	}{
		{classLetter, `^\p{L}$`},
		{classNumber, `^\p{N}$`},
		{classSpace, `^[^\S\r\n]$`},
		{classNewline, `^[\r\n]$`},
		{classOther, `^[^\s\p{L}\p{N}]$`},
	}
	cases := []struct {
		bit     uint8
		pattern string
	}{
		{caseUpper, `^[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]$`},
		{caseLower, `^[\p{Ll}\p{Lm}\p{Lo}\p{M}]$`},
	}
	caseRes := make([]*regexp2.Regexp, len(cases))
	for i, c := range cases {
		caseRes[i] = regexp2.MustCompile(c.pattern, 0)
	}
	res := make([]*regexp2.Regexp, len(classes))
	for i, c := range classes {
		res[i] = regexp2.MustCompile(c.pattern, 0)
	}
	step := rune(1)
	for r := rune(0); r <= utf8.MaxRune; r += step {
		if r >= 0x3400 {
			step = 97
		}
		if r >= 0xd800 && r < 0xe000 {
			continue // not in a Go string's runes
		}
		got := classOf(r)
		for i, c := range classes {
			ok, err := res[i].MatchRunes([]rune{r})
			if err != nil {
				t.Fatal(err)
			}
			if ok != (got == c.class) {
				t.Fatalf("U+%04X: class %d, regexp2 %s says %v", r, got, c.pattern, ok)
			}
		}
		wc := wordCase(r)
		for i, c := range cases {
			ok, err := caseRes[i].MatchRunes([]rune{r})
			if err != nil {
				t.Fatal(err)
			}
			if ok != (wc&c.bit != 0) {
				t.Fatalf("U+%04X: word case %b, regexp2 %s says %v", r, wc, c.pattern, ok)
			}
		}
	}
}

// TestScannerChosen: a tokenizer.json whose Split pattern is one the
// scanner recognises, byte for byte, is cut by the scanner (Qwen2.5's
// committed file among them); any other pattern by regexp2.
func TestScannerChosen(t *testing.T) {
	toks := preTokenizerLocals(t)
	cases := []struct {
		name string
		want scanPattern
	}{
		{"qwen2", scanQwen2},
		{"cl100k", scanCL100k},
		{"two_splits", scanGPT2},
		{"o200k", scanO200k},
		{"unknown_pattern", scanNone},
		{"string_pattern", scanNone},
	}
	for _, c := range cases {
		l := toks[c.name]
		if l == nil || len(l.splits) == 0 {
			t.Fatalf("%s: no Split step", c.name)
		}
		sp := l.splits[0]
		if sp.scan != c.want || (sp.re == nil) != (c.want != scanNone) {
			t.Errorf("%s: scan %d (regex %v), want %d", c.name, sp.scan, sp.re != nil, c.want)
		}
	}
	if l := toks["gpt2"]; len(l.splits) != 0 || !l.byteLevelSplit {
		t.Errorf("gpt2: %d Split steps, ByteLevel split %v; want 0, true", len(l.splits), l.byteLevelSplit)
	}
	if l := toks["no_regex"]; l.byteLevelSplit {
		t.Error("no_regex: ByteLevel splits")
	}
}
