package tokenizer

import (
	"hash/maphash"
	"strings"
	"sync/atomic"
	"unicode"
	"unicode/utf8"
)

// The segment cache makes re-tokenizing a text that repeats earlier text
// cost time in proportion to what is new: a conversation resent each turn
// with one more message, or a completion prompt that grows by appending.
//
// What is cached. Local.encode cuts the text at added tokens, normalises
// each piece between them, cuts that again at normalised added tokens, and
// pre-tokenizes and encodes each resulting segment independently of the
// others (preTokenize sees nothing but the segment). A segment's ids are
// therefore a function of its (normalised) text alone, and are cached under
// a keyed 128-bit hash of that text. Caching after normalisation, rather
// than on the raw text, keeps the argument free of normaliser and added-token
// rules, at the price of normalising (mostly: checking that the text is
// already normal) the whole text on every call, which costs far less than
// encoding it (BenchmarkChatTurn/normalize).
//
// Chunks. A chat message is one segment, so whole segments suffice for the
// chat form; a long completion prompt is one segment that changes at its
// end every time. Long segments are therefore cut further into chunks, at
// positions p where encoding seg[:p] and seg[p:] separately provably gives
// the ids of the whole (boundaryRule), and each chunk is cached. Cuts are
// content-defined: the first boundary at least chunkMinBytes after the
// previous cut, a choice that depends only on the text before the boundary
// and the one character after it. A text that extends an earlier one thus
// has the same cuts up to the earlier text's last chunk, and re-encodes only
// that chunk and what follows.
//
// Why the boundary rule is exact. A boundary is a position p with
// seg[p-1] = '\n' and seg[p] an ASCII letter or digit; for GPT-2's pattern
// also the rune before that '\n' must be a letter, mark, number,
// punctuation or symbol (so not white space in any regex engine's sense:
// every White_Space character is in Z or Cc).
//
// Only the first pre-tokenizer step that splits sees the whole segment: a
// Split step's pieces, or the ByteLevel step's own GPT-2 split when there
// is no Split step. Every later step (more Splits, ByteLevel's prefix space
// and split, the BPE model) runs on each piece alone. So it suffices that
// the first step's pieces of seg are its pieces of seg[:p] followed by those
// of seg[p:], and that nothing is added to the start of seg[p:] that is not
// added to a piece anyway: ByteLevel's add_prefix_space with no Split before
// it adds a space to the segment's start only, so chunking is off for it.
//
// The first step's regex, one of chunkPatterns, is applied left to right,
// each match starting where the previous one ended; the pieces are the
// matches and the text between them. For each of those patterns:
//
//  1. No alternative matches a string holding '\n' followed by an ASCII
//     letter or digit. Letters, digits and contractions exclude '\n'
//     ([^\r\n\p{L}\p{N}]? in front, " ?" in GPT-2's); the punctuation runs
//     exclude white space and end with at most [\r\n]* or [\r\n/]*, with
//     nothing after; the white-space alternatives match white space only.
//     So every match starting before p ends at or before p.
//  2. A match attempt at s < p therefore reads text from p on only to fail
//     (a path that consumes seg[p] never completes) or in a look-ahead at
//     p. The only look-ahead is (?!\S) after \s+, so it is reached at p
//     only by \s+ matching a white-space run from s to p.
//     (a) cl100k, Qwen2 and o200k try \s*[\r\n]+ before it, which matches
//     at every position of a white-space run ending with '\n' (up to p, in
//     seg and in seg[:p] alike), and nothing before it matches there: those
//     alternatives need a letter, digit, apostrophe or punctuation, at the
//     position or after one space or other character that is not \r or \n,
//     and in the run only p-1 is followed by such a character but holds
//     '\n'. So the look-ahead is never tried at p.
//     (b) GPT-2's pattern has no such alternative, hence its stricter rule:
//     the run is the '\n' alone, from p-1, where every alternative that
//     matches at all matches exactly "\n" (non-empty, ending by p); the
//     look-ahead only decides which alternative that is.
//     Either way the matches starting before p, and the failed attempts,
//     are the same in seg and in seg[:p].
//  3. At p an alternative matches (every pattern matches a letter or a
//     digit alone), so no text between matches spans p; from p on, attempts
//     read only seg[p:], the same as in seg[p:] (no pattern looks behind).
//
// Hence the pieces of seg are those of seg[:p] then those of seg[p:].
// FuzzPreTokenizeChunks checks this for every pattern of chunkPatterns, and
// FuzzSegmentCache checks the ids against encoding without the cache.
//
// Normalisation does not enter: chunks are cut in normalised text. Added
// tokens do not either: they are cut out before a segment exists.

// boundaryRule says where a segment may be cut into chunks.
type boundaryRule uint8

const (
	noChunks        boundaryRule = iota // pattern not analysed: cache whole segments
	afterNewline                        // "\n" then an ASCII letter or digit
	afterNonSpaceNL                     // the same, after a rune that is not white space
)

// chunkPatterns are the first-step pre-tokenizer regexes, as written in
// tokenizer.json, whose matches the boundary rules provably respect (see
// above). Another pattern disables chunking: whole segments are still
// cached.
var chunkPatterns = map[string]boundaryRule{
	// ByteLevel with use_regex, HuggingFace's fixed pattern.
	gpt2Pattern:   afterNonSpaceNL,
	cl100kPattern: afterNewline,
	qwen2Pattern:  afterNewline,
	o200kPattern:  afterNewline,
}

// isBoundary reports whether seg may be cut before seg[p] under rule.
func (rule boundaryRule) isBoundary(seg string, p int) bool {
	if rule == noChunks || p < 2 || p >= len(seg) || seg[p-1] != '\n' || !isASCIIAlnum(seg[p]) {
		return false
	}
	if rule == afterNewline {
		return true
	}
	r, _ := utf8.DecodeLastRuneInString(seg[:p-1])
	return unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S)
}

func isASCIIAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// chunkMinBytes is the least length of a chunk other than a segment's
// last. The last chunk of a growing text is re-encoded on every call, so
// smaller is faster per call, at the price of more lookups and more cache
// entries; BenchmarkGrowingPrompt measures the trade.
const chunkMinBytes = 1024

// nextCut returns the end of the chunk of seg that starts at from: the
// first boundary at least minBytes after from, or len(seg).
func (rule boundaryRule) nextCut(seg string, from, minBytes int) int {
	p := from + max(minBytes, 2)
	for p < len(seg) {
		i := strings.IndexByte(seg[p-1:], '\n')
		if i < 0 {
			break
		}
		p += i // seg[p-1] == '\n'
		if rule.isBoundary(seg, p) {
			return p
		}
		p++
	}
	return len(seg)
}

// segCache is a Local's cache of segment and chunk ids.
type segCache struct {
	minChunk int // chunkMinBytes, lowered by tests to reach every path

	keys   [2]maphash.Seed
	ids    *idCache
	hits   atomic.Uint64
	misses atomic.Uint64
}

func newSegCache(maxBytes int64) *segCache {
	// Entries are bounded by bytes; the entry bound only has to be large
	// enough never to bind first.
	entries := int(min(maxBytes/entryOverhead+1, 1<<30))
	return &segCache{
		minChunk: chunkMinBytes,
		keys:     [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()},
		ids:      newIDCache(entries, maxBytes),
	}
}

// key is a 128-bit keyed hash of a segment's text: the seeds are random
// per process, so clients cannot craft texts that collide.
func (c *segCache) key(s string) cacheKey {
	return cacheKey{maphash.String(c.keys[0], s), maphash.String(c.keys[1], s)}
}

// LocalStats are a Local's segment cache counters since the cache was
// enabled (WithSegmentCache); all zero without a cache.
type LocalStats struct {
	SegmentHits    uint64 // segments and chunks whose ids came from the cache
	SegmentMisses  uint64 // segments and chunks encoded and then cached
	SegmentEntries int    // entries in the cache now
	SegmentBytes   int64  // accounted bytes of the cache now
}

// Stats returns the segment cache counters, for metrics.
func (l *Local) Stats() LocalStats {
	c := l.segs
	if c == nil {
		return LocalStats{}
	}
	s := LocalStats{SegmentHits: c.hits.Load(), SegmentMisses: c.misses.Load()}
	s.SegmentEntries, s.SegmentBytes = c.ids.stats()
	return s
}

// WithSegmentCache returns a Local that shares l's tokenizer and keeps the
// ids of the segments it encodes (the text between added tokens, such as
// one chat message, and chunks of long ones) in an LRU cache of at
// most maxBytes, so that text seen before is not encoded again: a
// conversation resent with one more turn, or a prompt grown by appending,
// costs about as much as its new part (BenchmarkChatTurn,
// BenchmarkGrowingPrompt), plus rendering and a scan of the whole text.
// The ids are always those of encoding without the cache. maxBytes <= 0
// returns a Local without a cache. l itself is unchanged.
func (l *Local) WithSegmentCache(maxBytes int64) *Local {
	c := *l
	c.segs = nil
	if maxBytes > 0 {
		c.segs = newSegCache(maxBytes)
	}
	return &c
}

// cachedSegment appends the ids of one normalised segment through the
// cache. Every segment goes through it, however short: a hit costs less
// than encoding even the "\n" between two chat messages, which pays for
// the regex engine's setup (BenchmarkSegmentHit).
func (l *Local) cachedSegment(dst []uint64, seg string, s *encodeScratch) []uint64 {
	if len(seg) == 0 {
		return dst
	}
	if l.chunks == noChunks {
		return l.cachedChunk(dst, seg, s)
	}
	for from := 0; from < len(seg) && s.err == nil; {
		to := l.chunks.nextCut(seg, from, l.segs.minChunk)
		dst = l.cachedChunk(dst, seg[from:to], s)
		from = to
	}
	return dst
}

// cachedChunk appends the ids of chunk from the cache, or encodes them and
// caches them.
func (l *Local) cachedChunk(dst []uint64, chunk string, s *encodeScratch) []uint64 {
	c := l.segs
	k := c.key(chunk)
	if out, ok := c.ids.get(k, dst); ok {
		c.hits.Add(1)
		return out
	}
	n := len(dst)
	dst = l.preTokenize(dst, chunk, s)
	if s.err != nil {
		return dst
	}
	c.misses.Add(1)
	ids := make([]uint32, len(dst)-n)
	for i, id := range dst[n:] {
		ids[i] = uint32(id)
	}
	c.ids.add(k, ids)
	return dst
}
