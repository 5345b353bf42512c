package tokenizer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/dlclark/regexp2"
)

// TestChunkBoundary pins the boundary rules on the cases they must refuse:
// a cut only between "\n" and an ASCII letter or digit, and for GPT-2's
// pattern only after a rune that is not white space.
func TestChunkBoundary(t *testing.T) {
	cases := []struct {
		name, before, after string // the cut is between them
		loose, strict       bool   // want, for afterNewline and afterNonSpaceNL
	}{
		{"letter", "end.\n", "Next", true, true},
		{"digit", "x\n", "1. item", true, true},
		{"after_letter", "word\n", "word", true, true},
		{"after_cjk", "中文\n", "abc", true, true},
		{"after_combining_mark", "e\u0301\n", "x", true, true},
		{"after_emoji", "😀\n", "x", true, true},
		{"after_symbol", "}\n", "func", true, true},
		{"space_newline", "a \n", "b", true, false},
		{"tab_newline", "a\t\n", "b", true, false},
		{"crlf", "a\r\n", "b", true, false},
		{"blank_line", "a\n\n", "b", true, false},
		{"nbsp_newline", "a\u00a0\n", "b", true, false},
		{"ideographic_space_newline", "a\u3000\n", "b", true, false},
		{"nel_newline", "a\u0085\n", "b", true, false},
		{"zwsp_newline", "a\u200b\n", "b", true, false}, // format character: refused too
		{"indentation", "a\n", "  b", false, false},
		{"tab_indent", "a\n", "\tb", false, false},
		{"contraction", "a\n", "'s", false, false},
		{"punctuation", "a\n", "-b", false, false},
		{"non_ascii_letter", "a\n", "é", false, false},
		{"non_ascii_digit", "a\n", "①", false, false},
		{"combining_next", "a\n", "\u0301", false, false},
		{"no_newline", "ab", "c", false, false},
		{"start", "\n", "a", false, false},
		{"end", "a\n", "", false, false},
		{"carriage_return", "a\r", "b", false, false},
		{"vertical_tab", "a\v", "b", false, false},
		{"line_separator", "a\u2028", "b", false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			text, p := tc.before+tc.after, len(tc.before)
			for _, r := range []struct {
				rule boundaryRule
				want bool
			}{{afterNewline, tc.loose}, {afterNonSpaceNL, tc.strict}, {noChunks, false}} {
				if got := r.rule.isBoundary(text, p); got != r.want {
					t.Errorf("rule %d: isBoundary(%q|%q) = %v, want %v", r.rule, tc.before, tc.after, got, r.want)
				}
			}
		})
	}
}

// TestNextCut: cuts are content-defined, at the first boundary at least
// the minimum after the previous cut, so a text that extends another keeps
// its cuts.
func TestNextCut(t *testing.T) {
	seg := "aaaa\nbbbb\ncc \ndddd\n eeee\nffff"
	var cuts []int
	for from := 0; from < len(seg); {
		from = afterNonSpaceNL.nextCut(seg, from, 6)
		cuts = append(cuts, from)
	}
	// 10 (5 is too close), then 25: 14 is too close and follows " \n",
	// 19 is before " ".
	if want := []int{10, 25, len(seg)}; !slices.Equal(cuts, want) {
		t.Errorf("cuts %v, want %v", cuts, want)
	}
	if got := afterNonSpaceNL.nextCut(seg[:12], 0, 6); got != 10 {
		t.Errorf("prefix cut %d, want 10", got)
	}
}

// preTokenizers are Qwen2.5's tokenizer with the pre-tokenizer set to each
// configuration the segment cache distinguishes: every pattern of
// chunkPatterns in front (the vocabulary does not enter the argument, so
// Qwen's serves them all), ByteLevel's own split with and without its
// prefix space, a prefix space after a Split, and a pattern outside the set.
var preTokenizers = []struct {
	name string
	pre  string // pre_tokenizer JSON; "" keeps Qwen2.5's
	rule boundaryRule
}{
	{"qwen2", "", afterNewline},
	{"cl100k", splitPre(`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`, false), afterNewline},
	{"o200k", splitPre(`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`, false), afterNewline},
	{"gpt2", `{"type":"ByteLevel","add_prefix_space":false,"use_regex":true}`, afterNonSpaceNL},
	{"split_prefix_space", splitPre(`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`, true), afterNewline},
	{"two_splits", `{"type":"Sequence","pretokenizers":[` +
		`{"type":"Split","pattern":{"Regex":` + jsonString(gpt2Pattern) + `},"behavior":"Isolated"},` +
		`{"type":"Split","pattern":{"Regex":"\\s+"},"behavior":"Isolated"},` +
		`{"type":"ByteLevel","add_prefix_space":false,"use_regex":false}]}`, afterNonSpaceNL},
	{"gpt2_prefix_space", `{"type":"ByteLevel","add_prefix_space":true,"use_regex":true}`, noChunks},
	{"no_regex", `{"type":"ByteLevel","add_prefix_space":false,"use_regex":false}`, noChunks},
	{"unknown_pattern", splitPre(`[\s\S]{1,4}`, false), noChunks}, // windows of 4 runes, which cuts would shift
	{"string_pattern", `{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"String":"\n"},"behavior":"Isolated"},{"type":"ByteLevel","add_prefix_space":false,"use_regex":false}]}`, noChunks},
}

func splitPre(pattern string, prefixSpace bool) string {
	return fmt.Sprintf(`{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":%s},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":%v,"use_regex":false}]}`,
		jsonString(pattern), prefixSpace)
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

var (
	preTokOnce sync.Once
	preToks    map[string]*Local
)

// preTokenizerLocals builds preTokenizers once per test binary, plus the
// golden variants that change the normaliser and the added tokens.
func preTokenizerLocals(t testing.TB) map[string]*Local {
	t.Helper()
	preTokOnce.Do(func() {
		preToks = map[string]*Local{}
		for _, p := range preTokenizers {
			patch := map[string]json.RawMessage{}
			if p.pre != "" {
				patch["pre_tokenizer"] = json.RawMessage(p.pre)
			}
			preToks[p.name] = buildPatched(t, patch)
		}
		for _, v := range readGolden(t, "testdata/golden.json").Variants {
			if v.Name == "nfkc" || v.Name == "added_flags" || v.Name == "ignore_merges" {
				preToks[v.Name] = buildPatched(t, v.Patch)
			}
		}
	})
	return preToks
}

// TestChunkable: chunking is on exactly for the analysed first steps, and
// off for a prefix space added to the segment and for other patterns; off,
// a long segment is cached whole.
func TestChunkable(t *testing.T) {
	toks := preTokenizerLocals(t)
	var b strings.Builder
	for i := range 200 {
		fmt.Fprintf(&b, "Line %d of prose.\n", i) // 199 boundaries
	}
	text := b.String()
	for _, p := range preTokenizers {
		t.Run(p.name, func(t *testing.T) {
			l := toks[p.name]
			if l.chunks != p.rule {
				t.Fatalf("boundary rule %d, want %d", l.chunks, p.rule)
			}
			c := l.WithSegmentCache(1 << 20)
			c.segs.minChunk = 64
			if got, want := c.Encode(text, false), l.Encode(text, false); !slices.Equal(got, want) {
				t.Fatalf("cached ids differ:\n got %v\nwant %v", clip(got), clip(want))
			}
			entries := c.Stats().SegmentEntries
			if p.rule != noChunks && entries < 10 || p.rule == noChunks && entries != 1 {
				t.Errorf("%d cache entries for a %d-byte segment (rule %d)", entries, len(text), p.rule)
			}
		})
	}
}

// TestSegmentCacheGolden encodes the golden corpus (8k-token prompt
// included) through a cache, cold then warm, against HuggingFace's ids, for
// every golden variant.
func TestSegmentCacheGolden(t *testing.T) {
	base, _ := qwen(t)
	g := readGolden(t, "testdata/golden.json")
	for _, v := range g.Variants {
		t.Run(fmt.Sprintf("%s/special=%v", v.Name, v.AddSpecialTokens), func(t *testing.T) {
			tok := base
			if len(v.Patch) > 0 {
				tok = buildPatched(t, v.Patch)
			}
			c := tok.WithSegmentCache(64 << 20)
			c.segs.minChunk = 64
			for range 2 {
				checkGolden(t, c, g.Texts, v.IDs, v.AddSpecialTokens)
			}
			if s := c.Stats(); s.SegmentHits < s.SegmentMisses {
				t.Errorf("stats %+v: want the second pass to hit", s)
			}
		})
	}
}

// TestSegmentCacheStats: counters count lookups, the byte budget holds,
// a Local without a cache reports zeros, and enabling one leaves the
// original without it.
func TestSegmentCacheStats(t *testing.T) {
	base, _ := qwen(t)
	c := base.WithSegmentCache(1 << 20)
	if base.segs != nil || base.Stats() != (LocalStats{}) {
		t.Fatal("WithSegmentCache changed the original")
	}
	msg := strings.Repeat("Some words of a message. ", 10)
	text := "<|im_start|>user\n" + msg + "<|im_end|>\n<|im_start|>assistant\n"
	c.Encode(text, false)
	c.Encode(text, false)
	// Segments: "user\n"+msg, "\n", "assistant\n".
	if s := c.Stats(); s.SegmentHits != 3 || s.SegmentMisses != 3 || s.SegmentEntries != 3 || s.SegmentBytes <= 3*entryOverhead {
		t.Errorf("stats %+v, want 3 hits, 3 misses, 3 entries", s)
	}
	small := base.WithSegmentCache(4 << 10)
	small.segs.minChunk = 64
	var b strings.Builder
	for i := range 2000 {
		fmt.Fprintf(&b, "Line of text number %d.\n", i)
	}
	long := b.String()
	if got, want := small.Encode(long, false), base.Encode(long, false); !slices.Equal(got, want) {
		t.Fatal("ids differ under eviction")
	}
	if s := small.Stats(); s.SegmentBytes > 4<<10 || s.SegmentEntries == 0 {
		t.Errorf("stats %+v: budget of 4 KiB not kept", s)
	}
	if off := base.WithSegmentCache(0); off.segs != nil {
		t.Error("WithSegmentCache(0) enabled a cache")
	}
}

// fragments are what random texts are made of: words, white space runs
// of every kind, digits, contractions, punctuation, non-ASCII letters,
// combining marks, emoji and added tokens.
var fragments = []string{
	"the", "Hello", "x", "a1", "word", "CamelCase", "don't", "'s", "'LL",
	"\n", "\n", "\n", " ", "  ", "\t", "\r\n", "\r", "\n\n", " \n", "\u00a0", "\u3000", "\u200b", "\u0085",
	"0", "123", "4567", ".", ",", "!?", "/", "->", "{", "}", "\"", "(", "-",
	"é", "e\u0301", "\u0301", "中文", "日本語", "한국어", "😀", "Ω", "ǅ", "ﬁ", "①",
	"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\n",
	"    ", "\n    ", "\nfunc", "\n1.", "\nA", "\nz", "\n9",
}

// fragmentText builds a text from data, one fragment per byte.
func fragmentText(data []byte) (string, []int) {
	var b strings.Builder
	ends := make([]int, 0, len(data))
	for _, c := range data {
		b.WriteString(fragments[int(c)%len(fragments)])
		ends = append(ends, b.Len())
	}
	return b.String(), ends
}

// checkIncremental encodes text's growing prefixes, text itself twice and
// a text sharing a prefix with it through one cache, comparing each with
// encoding without a cache.
func checkIncremental(t *testing.T, name string, plain *Local, text string, ends []int, alt string) {
	t.Helper()
	c := plain.WithSegmentCache(1 << 20)
	c.segs.minChunk = 4
	check := func(what, s string) {
		if got, want := c.Encode(s, false), plain.Encode(s, false); !slices.Equal(got, want) {
			t.Fatalf("%s: %s of %q:\n got %v\nwant %v", name, what, s, got, want)
		}
	}
	for i, e := range ends {
		if i%3 == 0 || i == len(ends)-1 {
			check("prefix", text[:e])
		}
	}
	check("text", text)
	check("text again", text)
	for _, e := range ends {
		if e > len(text)/2 {
			check("shared prefix", text[:e]+alt)
			break
		}
	}
}

// FuzzSegmentCache: encoding through the segment cache, with tiny chunks
// so that every boundary is used, gives the ids of encoding without it,
// for every pre-tokenizer configuration, growing texts and shared
// prefixes included.
//
//	go test -run '^$' -fuzz '^FuzzSegmentCache$' -fuzztime 60s ./tokenizer
func FuzzSegmentCache(f *testing.F) {
	for _, s := range []string{
		"\x00\x09\x0a\x00",
		"\x01\x12\x3b\x14\x01\x12\x0a\x3b",
		"\x3c\x09\x3d\x0a\x3e\x09\x13\x3f",
		"\x00\x0a\x0a\x00\x0b\x00\x0c\x00\x0d\x00\x0f\x00\x10\x00\x11\x00\x12\x00\x13\x00\x14\x00",
		"\x2c\x09\x2c\x0a\x2d\x09\x2e\x09\x2f\x09\x30\x09\x31\x09\x32\x09\x33\x09\x34\x09",
		"\x35\x09\x36\x09\x37\x09\x38\x09\x39\x09\x3a\x09",
		"\x07\x09\x08\x09\x06\x09\x1a\x09\x1b\x09\x1c\x09\x1d\x09\x1e\x0a\x1f\x09",
	} {
		f.Add([]byte(s), []byte("\x01\x02\x09\x00"))
	}
	f.Fuzz(func(t *testing.T, data, alt []byte) {
		if len(data) > 400 || len(alt) > 50 {
			return
		}
		toks := preTokenizerLocals(t)
		text, ends := fragmentText(data)
		altText, _ := fragmentText(alt)
		for _, name := range slices.Sorted(maps.Keys(toks)) {
			checkIncremental(t, name, toks[name], text, ends, altText)
		}
	})
}

// TestSegmentCacheRandom runs FuzzSegmentCache's check on random texts,
// so that plain go test covers more than the seeds.
func TestSegmentCacheRandom(t *testing.T) {
	toks := preTokenizerLocals(t)
	rng := rand.New(rand.NewPCG(1, 2))
	n := 60
	if testing.Short() || raceEnabled {
		n = 10
	}
	for range n {
		data := make([]byte, 20+rng.IntN(200))
		for i := range data {
			// Newlines and words often, so that boundaries abound.
			switch rng.IntN(3) {
			case 0:
				data[i] = 9 // "\n"
			default:
				data[i] = byte(rng.IntN(len(fragments)))
			}
		}
		alt := []byte{byte(rng.IntN(len(fragments))), 9, 0}
		text, ends := fragmentText(data)
		altText, _ := fragmentText(alt)
		for name, tok := range toks {
			checkIncremental(t, name, tok, text, ends, altText)
		}
	}
}

// regexPieces is the Isolated split of one regex over text.
func regexPieces(t *testing.T, re *regexp2.Regexp, text string) []string {
	t.Helper()
	runes := []rune(text)
	var out []string
	prev := 0
	m, err := re.FindRunesMatch(runes)
	for ; m != nil && err == nil; m, err = re.FindNextMatch(m) {
		if m.Index > prev {
			out = append(out, string(runes[prev:m.Index]))
		}
		out = append(out, string(runes[m.Index:m.Index+m.Length]))
		prev = m.Index + m.Length
	}
	if err != nil {
		t.Fatal(err)
	}
	if prev < len(runes) {
		out = append(out, string(runes[prev:]))
	}
	return out
}

// FuzzPreTokenizeChunks checks the boundary rule at the pre-tokenizer
// level for every pattern of chunkPatterns: the pieces of a text are the
// pieces of its parts cut at every boundary.
//
//	go test -run '^$' -fuzz '^FuzzPreTokenizeChunks$' -fuzztime 60s ./tokenizer
func FuzzPreTokenizeChunks(f *testing.F) {
	for _, s := range []string{
		"a \nb", "a\n\nb", "x\r\ny", "a\t\nb", "a\n  b", "a\n'll", "it's\nIt'S\n's",
		"a\u00a0\nb", "a\u3000\nb", "e\u0301\nx", "中文\nabc", "12345\n678", "x.\n\n\ny",
		"end.\nNext line\n  indented\n\tTab\nA1\n9\n", "a\u0085\nb", "a\u200b\nb",
	} {
		f.Add(s)
	}
	res := compiledChunkPatterns(f)
	f.Fuzz(func(t *testing.T, text string) {
		if len(text) > 2000 {
			return
		}
		for pattern, re := range res {
			checkPieces(t, re, chunkPatterns[pattern], text)
		}
	})
}

func compiledChunkPatterns(t testing.TB) map[string]*regexp2.Regexp {
	res := map[string]*regexp2.Regexp{}
	for pattern := range chunkPatterns {
		re, err := compileHFRegex(pattern)
		if err != nil {
			t.Fatalf("%s: %v", pattern, err)
		}
		res[pattern] = re
	}
	return res
}

// checkPieces compares the pieces of text with those of its parts, cut at
// every boundary of rule.
func checkPieces(t *testing.T, re *regexp2.Regexp, rule boundaryRule, text string) {
	t.Helper()
	whole := regexPieces(t, re, text)
	var parts []string
	var cuts []int
	prev := 0
	for p := range len(text) + 1 {
		if p == len(text) || rule.isBoundary(text, p) {
			parts = append(parts, regexPieces(t, re, text[prev:p])...)
			cuts = append(cuts, p)
			prev = p
		}
	}
	if !slices.Equal(whole, parts) {
		t.Fatalf("rule %d, pattern %s:\n%q cut at %v:\nwhole %q\nparts %q", rule, re, text, cuts, whole, parts)
	}
}

// TestPreTokenizeChunksRandom runs FuzzPreTokenizeChunks' check on random
// fragment texts.
func TestPreTokenizeChunksRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	res := compiledChunkPatterns(t)
	for range 300 {
		data := make([]byte, 5+rng.IntN(60))
		for i := range data {
			if rng.IntN(3) == 0 {
				data[i] = 9
			} else {
				data[i] = byte(rng.IntN(len(fragments)))
			}
		}
		text, _ := fragmentText(data)
		for _, pattern := range slices.Sorted(maps.Keys(res)) {
			checkPieces(t, res[pattern], chunkPatterns[pattern], text)
		}
	}
}

// TestSegmentCacheCancel: a segment whose encoding was cancelled midway is
// not cached, so the next call encodes it whole.
func TestSegmentCacheCancel(t *testing.T) {
	tok, _ := qwen(t)
	c := tok.WithSegmentCache(1 << 20)
	text := strings.Repeat("word ", 5*ctxCheckEvery)
	if _, err := c.Tokenize(&cancelAfter{context.Background(), 2}, "", Input{Prompt: text}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want cancellation midway", err)
	}
	if s := c.Stats(); s.SegmentEntries != 0 {
		t.Fatalf("stats %+v: a cancelled segment was cached", s)
	}
	if got, want := c.Encode(text, false), tok.Encode(text, false); !slices.Equal(got, want) {
		t.Fatalf("after cancel: %d ids, want %d", len(got), len(want))
	}
}

// TestSegmentCacheConcurrent encodes overlapping texts from several
// goroutines through one cache (run with -race).
func TestSegmentCacheConcurrent(t *testing.T) {
	tok, _ := qwen(t)
	c := tok.WithSegmentCache(64 << 10)
	c.segs.minChunk = 32
	var texts []string
	for i := range 8 {
		var b strings.Builder
		for j := range 40 {
			fmt.Fprintf(&b, "Line %d of text %d.\n<|im_end|>\n", j, i%3)
		}
		texts = append(texts, b.String())
	}
	want := make([][]uint64, len(texts))
	for i, s := range texts {
		want[i] = tok.Encode(s, false)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for k := range 20 {
				i := (g + k) % len(texts)
				if got := c.Encode(texts[i], false); !slices.Equal(got, want[i]) {
					t.Errorf("goroutine %d, text %d: ids differ", g, i)
					return
				}
			}
		})
	}
	wg.Wait()
}
