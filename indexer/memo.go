package indexer

import (
	"encoding/binary"
	"math/bits"
	"unsafe"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/zeebo/xxh3"

	"github.com/kvindex/kvindex/blockhash"
)

// The memo remembers the block keys of recent prompts so that a repeated
// prompt is not hashed again and a prompt extending an earlier one (the
// next turn of a conversation or of a tool-calling loop) hashes only its new
// blocks.
//
// A prompt's key chain is stored as segments: a segment holds the keys of
// blocks [start, end) and points to the segment before it, so turns of a
// conversation share their common part. Segments are created at every
// multiple of memoCheckpoint blocks and at the end of what a query hashed,
// and found through 128-bit fingerprints of the token prefix:
//
//   - the alias key: XXH3-128 over all full blocks' tokens (one pass,
//     vectorised), seeded by the extras. An identical prompt finds its
//     segment with this one hash and one lookup.
//   - the chain key fp_b: a fingerprint of the first b blocks, chained per
//     block like the block hash itself (fp_b = mix(fp_{b-1},
//     XXH3-128(block b-1 tokens))), starting from a fingerprint of the
//     extras. A prompt that extends an earlier one finds the earlier
//     prompt's last segment by probing fp_b from its own end downwards:
//     every boundary within the last memoProbeTail blocks, then every
//     checkpoint.
//
// Collisions: a false hit needs two different prefixes with equal 128-bit
// fingerprints, probability about 2^-128 per pair for non-adversarial
// input; with 10^6 entries and 10^12 lookups that stays below 10^-20. The
// fingerprints are not keyed, so a client able to craft colliding prompts
// for XXH3-128 could make its own query answer with another prompt's keys:
// a wrong routing hint for that request, never a change to the index. The
// extras are folded in whole (LoRA name, salt, every multimodal item and
// prompt-embedding digest), so prompts that differ only in extras never
// share segments.
const (
	DefaultMemoEntries = 8192
	memoCheckpoint     = 32
	memoProbeTail      = 64
)

type memoKey struct{ a, b uint64 }

type memoSeg struct {
	parent *memoSeg
	end    int      // blocks covered from block 0
	keys   []uint64 // keys of blocks [end-len(keys), end)
	last   blockhash.Hash
}

type memo struct {
	c *lru.Cache[memoKey, *memoSeg]
}

func newMemo(entries int) *memo {
	c, _ := lru.New[memoKey, *memoSeg](entries)
	return &memo{c: c}
}

func (m *memo) purge() { m.c.Purge() }

// materialize writes the keys of blocks [0, seg.end) into dst.
func (seg *memoSeg) materialize(dst []uint64) []uint64 {
	if cap(dst) < seg.end {
		dst = make([]uint64, seg.end, max(seg.end, 2*cap(dst)))
	}
	dst = dst[:seg.end]
	for s := seg; s != nil; s = s.parent {
		copy(dst[s.end-len(s.keys):s.end], s.keys)
	}
	return dst
}

// tokenBytes views tokens as bytes for fingerprinting (host byte order:
// fingerprints never leave the process).
func tokenBytes(t []uint64) []byte {
	if len(t) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(t))), len(t)*8)
}

// extrasSeed fingerprints every hash-affecting request input besides the
// tokens. buf is scratch.
func extrasSeed(x *blockhash.Extras, buf []byte) (memoKey, []byte) {
	const none = 0x6b76696e64657821 // "kvindex!"
	if x == nil {
		return memoKey{none, ^uint64(none)}, buf
	}
	b := buf[:0]
	str := func(s string) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	str(x.LoRAName)
	str(x.CacheSalt)
	if x.LegacyMM {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(x.MM)))
	for _, it := range x.MM {
		str(it.Identifier)
		b = binary.AppendVarint(b, int64(it.Offset))
		b = binary.AppendVarint(b, int64(it.Length))
	}
	b = binary.AppendUvarint(b, uint64(len(x.PromptEmbeds)))
	for _, d := range x.PromptEmbeds {
		if d == nil {
			b = append(b, 0)
			continue
		}
		b = append(b, 1)
		b = binary.AppendUvarint(b, uint64(len(d)))
		b = append(b, d...)
	}
	u := xxh3.Hash128(b)
	return memoKey{u.Lo ^ none, u.Hi}, b
}

func aliasKey(tok []byte, seed memoKey) memoKey {
	u := xxh3.Hash128Seed(tok, seed.a)
	return memoKey{u.Lo ^ seed.b, u.Hi ^ 0x616c696173} // "alias": apart from chain keys
}

func mum(x, y uint64) uint64 {
	hi, lo := bits.Mul64(x, y)
	return hi ^ lo
}

// fpStep extends a chain fingerprint by one block's tokens.
func fpStep(st memoKey, block []byte) memoKey {
	u := xxh3.Hash128(block)
	return memoKey{
		a: mum(st.a^u.Lo^0xa0761d6478bd642f, st.b^u.Hi^0xe7037ed1a0b428db),
		b: mum(st.b^u.Lo^0x8ebc6af09c88c6e3, st.a^u.Hi^0x589965cc75374cc3),
	}
}
