package tokenizer

import "math"

// bpe is a byte-level BPE model: HuggingFace's merge algorithm over ids.
//
// Why not tiktoken-go's CoreBPE (the approach first tried for this
// package): it ranks a candidate merge by the id of the concatenated token,
// which equals HuggingFace's result only when the vocabulary's ids are
// ordered like its merge list and no token is reachable by two different
// splits; it looks whole pieces up in the vocabulary, which HF does only
// when model.ignore_merges is set; it drops text the pre-tokenizer regex
// does not match (HF keeps it as its own piece); it matches special tokens
// leftmost-first in random map order (HF: leftmost-longest); it loops
// forever when there are no special tokens; its merge loop is quadratic in
// the piece length (one 100 KB whitespace run is a denial of service); and
// its exported Encode panics on disallowed specials and allocates sets per
// call. Following the tokenizer.json merges exactly removes the first three
// sources of drift, and the code below is shorter than the workarounds.
type bpe struct {
	// byteID[b] is the id of the single-byte token b.
	byteID [256]uint32

	// merges maps a pair (left id << 32 | right id) to its merge
	// (rank << 32 | merged id); a lower rank merges first.
	merges map[uint64]uint64

	// whole maps the raw bytes of every vocabulary token to its id. It is
	// set only for models with ignore_merges, which emit a piece found in
	// the vocabulary as one token without merging.
	whole map[string]uint32
}

// noMerge is the rank of a pair that has no merge.
const noMerge = math.MaxUint32

// heapMinLen is the piece length from which the O(n log n) heap merge is
// used; shorter pieces (nearly all of them) take the simpler O(n²) scan,
// which is faster for them. Both give identical results (TestBPEScanHeap).
const heapMinLen = 48

// bpeScratch is per-call working memory, reused through a pool.
type bpeScratch struct {
	ids   []uint32
	pairs []uint64 // pairs[i]: merge of (ids[i], ids[i+1]), or noMerge<<32
	prev  []int32
	next  []int32
	heap  []mergeCand
}

// mergeCand is a candidate merge of the symbol at pos with its successor.
type mergeCand struct {
	rank uint32
	pos  int32
}

func (m *bpe) pair(left, right uint32) uint64 {
	if v, ok := m.merges[uint64(left)<<32|uint64(right)]; ok {
		return v
	}
	return noMerge << 32
}

// encode appends the ids of one pre-tokenized piece (raw bytes) to dst.
func (m *bpe) encode(dst []uint64, piece []byte, s *bpeScratch) []uint64 {
	switch n := len(piece); {
	case n == 0:
		return dst
	case n == 1:
		return append(dst, uint64(m.byteID[piece[0]]))
	case m.whole != nil:
		if id, ok := m.whole[string(piece)]; ok {
			return append(dst, uint64(id))
		}
	}
	if len(piece) >= heapMinLen {
		return m.encodeHeap(dst, piece, s)
	}
	return m.encodeScan(dst, piece, s)
}

// encodeScan merges by repeatedly scanning the pairs for the lowest rank,
// leftmost first, exactly the order HuggingFace's priority queue yields.
func (m *bpe) encodeScan(dst []uint64, piece []byte, s *bpeScratch) []uint64 {
	n := len(piece)
	ids := grow(s.ids, n)
	pairs := growU64(s.pairs, n)
	for i, b := range piece {
		ids[i] = m.byteID[b]
	}
	for i := 0; i < n-1; i++ {
		pairs[i] = m.pair(ids[i], ids[i+1])
	}
	pairs = pairs[:n-1]
	for len(ids) > 1 {
		best, at := uint64(noMerge)<<32, -1
		for i, p := range pairs {
			if p>>32 < best>>32 {
				best, at = p, i
			}
		}
		if at < 0 {
			break
		}
		ids[at] = uint32(best)
		copy(ids[at+1:], ids[at+2:])
		ids = ids[:len(ids)-1]
		copy(pairs[at:], pairs[at+1:])
		pairs = pairs[:len(pairs)-1]
		if at < len(pairs) {
			pairs[at] = m.pair(ids[at], ids[at+1])
		}
		if at > 0 {
			pairs[at-1] = m.pair(ids[at-1], ids[at])
		}
	}
	for _, id := range ids {
		dst = append(dst, uint64(id))
	}
	s.ids, s.pairs = ids, pairs
	return dst
}

// encodeHeap merges with a doubly linked list of symbols and a min-heap of
// candidate merges ordered by (rank, position), skipping stale candidates.
// A symbol keeps the position of its first byte, so position order is text
// order, as in HuggingFace's Word::merge_all.
func (m *bpe) encodeHeap(dst []uint64, piece []byte, s *bpeScratch) []uint64 {
	n := len(piece)
	ids := grow(s.ids, n)
	prev := growI32(s.prev, n)
	next := growI32(s.next, n)
	h := s.heap[:0]
	for i, b := range piece {
		ids[i] = m.byteID[b]
		prev[i] = int32(i - 1)
		next[i] = int32(i + 1)
	}
	next[n-1] = -1
	for i := 0; i < n-1; i++ {
		if p := m.pair(ids[i], ids[i+1]); p>>32 != noMerge {
			h = heapPush(h, mergeCand{uint32(p >> 32), int32(i)})
		}
	}
	for len(h) > 0 {
		var c mergeCand
		c, h = heapPop(h)
		nx := next[c.pos]
		if ids[c.pos] == noMerge || nx < 0 {
			continue
		}
		p := m.pair(ids[c.pos], ids[nx])
		if uint32(p>>32) != c.rank {
			continue // stale: a neighbour merged since this was queued
		}
		ids[c.pos] = uint32(p)
		ids[nx] = noMerge // dead
		next[c.pos] = next[nx]
		if next[nx] >= 0 {
			prev[next[nx]] = c.pos
			if q := m.pair(ids[c.pos], ids[next[nx]]); q>>32 != noMerge {
				h = heapPush(h, mergeCand{uint32(q >> 32), c.pos})
			}
		}
		if pv := prev[c.pos]; pv >= 0 {
			if q := m.pair(ids[pv], ids[c.pos]); q>>32 != noMerge {
				h = heapPush(h, mergeCand{uint32(q >> 32), pv})
			}
		}
	}
	for i := int32(0); i >= 0; i = next[i] {
		dst = append(dst, uint64(ids[i]))
	}
	s.ids, s.prev, s.next, s.heap = ids, prev, next, h
	return dst
}

func candLess(a, b mergeCand) bool {
	return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos)
}

func heapPush(h []mergeCand, c mergeCand) []mergeCand {
	h = append(h, c)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !candLess(h[i], h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	return h
}

func heapPop(h []mergeCand) (mergeCand, []mergeCand) {
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	i := 0
	for {
		l, r, small := 2*i+1, 2*i+2, i
		if l < len(h) && candLess(h[l], h[small]) {
			small = l
		}
		if r < len(h) && candLess(h[r], h[small]) {
			small = r
		}
		if small == i {
			return top, h
		}
		h[i], h[small] = h[small], h[i]
		i = small
	}
}

func grow(b []uint32, n int) []uint32 {
	if cap(b) < n {
		return make([]uint32, n, 2*n)
	}
	return b[:n]
}

func growU64(b []uint64, n int) []uint64 {
	if cap(b) < n {
		return make([]uint64, n, 2*n)
	}
	return b[:n]
}

func growI32(b []int32, n int) []int32 {
	if cap(b) < n {
		return make([]int32, n, 2*n)
	}
	return b[:n]
}
