package indexer

import (
	"cmp"
	"math"
	"math/bits"
	"runtime"
	"slices"
	"sync/atomic"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/kvevents"
)

// queryScratch is the reusable working storage of one query (pooled).
type queryScratch struct {
	keys    []uint64
	hashes  []blockhash.Hash // hashes computed by this query, from keySource.memoHave
	fps     []memoKey        // fps[b]: chain fingerprint of the first b blocks
	buf     []byte
	alive   []uint64 // candidates holding every block so far, by engine id
	next    []uint64
	nz      []int32 // words of alive that are not zero
	cand    []uint32
	matched []int32  // by engine id
	missGPU []int32  // by engine id: matched blocks not held in GPU
	tiers   []int32  // by engine id * media + medium: matched blocks held there
	ex      []uint64 // detail holdings of alive engines in a medium other than GPU (countTiers)
	// Stamps of countTiers' current block: tierSeen by engine id * media
	// + medium, gpuSeen by engine id, hold stamp once that tier or that
	// engine's missing GPU copy is counted for the block.
	stamp    uint32
	tierSeen []uint32
	gpuSeen  []uint32
	hs       holderSet
	hv       [walkWindow]uint64 // mixed keys of the window being walked
	win      [walkWindow]windowRead
	order    []uint64
}

// walkWindow is how many blocks' slots a walk loads ahead at once.
const walkWindow = 16

// prefetch loads the home slots of a window of keys, then the record
// headers they point to, so that the misses of the window overlap (the
// loads are independent; the CPU issues them together). It leaves the
// mixed keys in s.hv. Atomic loads: the slots may be changing.
func (s *queryScratch) prefetch(ns *namespace, keys []uint64) uint64 {
	var sum uint64
	var vals [walkWindow]uint64
	var datas [walkWindow]*shardData
	for j, k := range keys {
		h := mixKey(k)
		s.hv[j] = h
		d := ns.shards[shardIndex(h)].data.Load()
		datas[j] = d
		vals[j] = atomic.LoadUint64(&d.slots[home(placeBits(h), len(d.slots))].val)
	}
	for j, v := range vals[:len(keys)] {
		if valKind(v) == kindRecord {
			if a := datas[j].arena; int(uint32(v)) < len(a) {
				sum += atomic.LoadUint64(&a[uint32(v)])
			}
		}
		sum += v
	}
	return sum
}

// windowRead is what the first pass of a window read for one block.
type windowRead struct {
	sh       *shard
	d        *shardData
	seq      uint64
	h        uint64
	key, val uint64 // of the block's home slot
}

// readWindow opens a seqlock read of each block's shard and loads the
// block's home slot (and its record's header), for a whole window before
// any block is decoded: the loads are independent, so their cache misses
// overlap.
func (s *queryScratch) readWindow(ns *namespace, keys []uint64) uint64 {
	var sum uint64
	for j, k := range keys {
		w := &s.win[j]
		w.h = mixKey(k)
		w.sh = &ns.shards[shardIndex(w.h)]
		w.seq = w.sh.stableSeq()
		w.d = w.sh.data.Load()
		sl := &w.d.slots[home(placeBits(w.h), len(w.d.slots))]
		w.val = atomic.LoadUint64(&sl.val)
		w.key = atomic.LoadUint64(&sl.key)
	}
	for j := range keys {
		w := &s.win[j]
		if valKind(w.val) == kindRecord {
			if a := w.d.arena; int(uint32(w.val)) < len(a) {
				sum += atomic.LoadUint64(&a[uint32(w.val)])
			}
		}
	}
	return sum
}

// readAttempts bounds optimistic reads of a shard that a writer changed
// under the reader before the reader falls back to the shard's mutex
// (only when writers keep the shard busy).
const readAttempts = 16

// stableSeq returns the shard's sequence number once no writer is in the
// middle of a change: readers wait out a write section (short, or one
// chunk of a sweep) without taking the mutex, which a sweep holds across
// all its chunks.
func (sh *shard) stableSeq() uint64 {
	for spins := 0; ; spins++ {
		if seq := sh.seq.Load(); seq&1 == 0 {
			return seq
		}
		if spins >= 32 {
			runtime.Gosched()
		}
	}
}

// keySource yields a query's block keys: the given BlockHashes, or keys
// hashed from the tokens on demand (in growing chunks, so a walk that
// stops early does not pay for the rest) after whatever prefix the memo
// knows.
type keySource struct {
	ix     *Index
	s      *queryScratch
	tokens []uint64
	extras *blockhash.Extras
	n      int // blocks in the query
	have   int // keys known
	chunk  int
	parent blockhash.Hash // hash of block have-1 (zero at 0)

	memoHave int // keys that came from the memo
	tail     *memoSeg
	alias    memoKey
	aliasHit bool
	seed     memoKey
	fpsHave  int // fps computed for b in [0, fpsHave]
}

func (k *keySource) initTokens(ix *Index, s *queryScratch, tokens []uint64, x *blockhash.Extras) {
	bs := ix.hasher.BlockSize()
	*k = keySource{ix: ix, s: s, tokens: tokens, extras: x, n: len(tokens) / bs, chunk: 16, fpsHave: -1}
	s.keys, s.hashes = s.keys[:0], s.hashes[:0]
	if k.n == 0 {
		return
	}
	k.seed, s.buf = extrasSeed(x, s.buf)
	k.alias = aliasKey(tokenBytes(tokens[:k.n*bs]), k.seed)
	if seg, ok := ix.memo.c.Get(k.alias); ok && seg.end <= k.n {
		k.aliasHit = true
		k.adopt(seg)
		return
	}
	k.fingerprints(k.n)
	try := func(b int) bool {
		seg, ok := ix.memo.c.Get(s.fps[b])
		if ok && seg.end == b {
			k.adopt(seg)
			return true
		}
		return false
	}
	b := k.n
	for ; b >= 1 && b > k.n-memoProbeTail; b-- {
		if try(b) {
			return
		}
	}
	for b = b / memoCheckpoint * memoCheckpoint; b >= memoCheckpoint; b -= memoCheckpoint {
		if try(b) {
			return
		}
	}
}

func (k *keySource) adopt(seg *memoSeg) {
	k.s.keys = seg.materialize(k.s.keys)
	k.have, k.memoHave, k.tail, k.parent = seg.end, seg.end, seg, seg.last
}

// fingerprints computes s.fps[0..upto].
func (k *keySource) fingerprints(upto int) {
	s := k.s
	if k.fpsHave < 0 {
		s.fps = append(s.fps[:0], k.seed)
		k.fpsHave = 0
	}
	bs := k.ix.hasher.BlockSize()
	tb := tokenBytes(k.tokens[:k.n*bs])
	for b := k.fpsHave + 1; b <= upto; b++ {
		s.fps = append(s.fps, fpStep(s.fps[b-1], tb[(b-1)*bs*8:b*bs*8]))
	}
	k.fpsHave = max(k.fpsHave, upto)
}

// ensure makes key i available (i < n).
func (k *keySource) ensure(i int) error {
	for i >= k.have {
		bs := k.ix.hasher.BlockSize()
		end := min(k.n, k.have+k.chunk)
		k.chunk = min(2*k.chunk, 256)
		var parent *blockhash.Hash
		if k.have > 0 {
			parent = &k.parent
		}
		start := len(k.s.hashes)
		var err error
		k.s.hashes, err = k.ix.hasher.Chain(k.s.hashes, parent, k.have, k.tokens[k.have*bs:end*bs], k.extras)
		if err != nil {
			k.s.hashes = k.s.hashes[:start]
			return err
		}
		for _, h := range k.s.hashes[start:] {
			k.s.keys = append(k.s.keys, h.Key)
		}
		k.have = end
		k.parent = k.s.hashes[len(k.s.hashes)-1]
	}
	return nil
}

// finish memoizes what the query hashed.
func (k *keySource) finish() {
	if k.n == 0 || k.have == k.memoHave && k.aliasHit {
		return
	}
	m := k.ix.memo.c
	seg := k.tail
	if k.have > k.memoHave {
		k.fingerprints(k.have)
		// One allocation for the new keys and one for the segments.
		keys := slices.Clone(k.s.keys[k.memoHave:k.have])
		segs := make([]memoSeg, 0, (k.have-k.memoHave)/memoCheckpoint+2)
		prev := k.memoHave
		for b := k.memoHave + 1; b <= k.have; b++ {
			if b%memoCheckpoint != 0 && b != k.have {
				continue
			}
			segs = append(segs, memoSeg{
				parent: seg,
				end:    b,
				keys:   keys[prev-k.memoHave : b-k.memoHave : b-k.memoHave],
				last:   k.s.hashes[b-1-k.memoHave],
			})
			seg = &segs[len(segs)-1]
			m.Add(k.s.fps[b], seg)
			prev = b
		}
	}
	if seg != nil {
		m.Add(k.alias, seg)
	}
}

// candidates fills s.cand and the alive bitmap with the query's engines.
func (s *queryScratch) candidates(et *engineTable, pods []string) {
	words := (len(et.byID) + 63) / 64
	s.alive = resize(s.alive, words)
	s.next = resize(s.next, words)
	clear(s.alive)
	s.cand = s.cand[:0]
	add := func(id uint32) {
		if s.alive[id>>6]&(1<<(id&63)) != 0 {
			return
		}
		s.alive[id>>6] |= 1 << (id & 63)
		s.cand = append(s.cand, id)
	}
	if len(pods) == 0 {
		for id, e := range et.byID {
			if e != nil {
				add(uint32(id))
			}
		}
	} else {
		for _, p := range pods {
			for _, id := range et.byPod[p] {
				add(id)
			}
		}
	}
	s.nz = s.nz[:0]
	for w, x := range s.alive {
		if x != 0 {
			s.nz = append(s.nz, int32(w))
		}
	}
}

func resize[T any](x []T, n int) []T {
	if cap(x) < n {
		return make([]T, n)
	}
	return x[:n]
}

// step sets s.next to the candidates still alive after a block: alive
// engines holding key. Holdings of alive engines in media other than GPU
// go to s.ex for tier counting. Lock-free
// unless writers keep the shard busy.
func (s *queryScratch) step(sh *shard, key, h uint64) {
	for attempt := 0; attempt < readAttempts; attempt++ {
		seq := sh.stableSeq()
		s.andHolders(sh.data.Load(), key, h)
		if sh.seq.Load() == seq {
			return
		}
	}
	sh.mu.Lock()
	s.andHolders(sh.data.Load(), key, h)
	sh.mu.Unlock()
}

// step1 is step for a one-word alive set: it returns alive & holders.
func (s *queryScratch) step1(sh *shard, key, h, alive uint64) uint64 {
	for attempt := 0; attempt < readAttempts; attempt++ {
		seq := sh.stableSeq()
		next := s.and1(sh.data.Load(), key, h, alive)
		if sh.seq.Load() == seq {
			return next
		}
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return s.and1(sh.data.Load(), key, h, alive)
}

func (s *queryScratch) and1(d *shardData, key, h, alive uint64) uint64 {
	return s.and1v(d, d.readVal(key, h), alive)
}

// and1v is and1 for a slot value already read.
func (s *queryScratch) and1v(d *shardData, v, alive uint64) uint64 {
	s.ex = s.ex[:0]
	switch valKind(v) {
	case kindInline:
		var m uint64
		for f := 0; f < 48; f += 16 {
			// A field holds id+1; 0 (no holder) wraps out of range.
			if id := v>>f&0xffff - 1; id < 64 {
				m |= 1 << id
			}
		}
		return alive & m
	case kindRecord:
		a := d.arena
		off := int(uint32(v))
		if off >= len(a) {
			return 0
		}
		hdr := atomic.LoadUint64(&a[off])
		np, nd := int(hdr&0xffff), int(hdr>>16&0xffff)
		if off+1+2*np+nd > len(a) {
			return 0
		}
		p := a[off+1 : off+1+2*np+nd]
		var simple uint64
		for j := 0; j < 2*np; j += 2 {
			if atomic.LoadUint64(&p[j]) == 0 {
				simple = atomic.LoadUint64(&p[j+1])
			}
		}
		// gpu: alive engines holding the block in GPU, in any group or
		// with several references; only the other media's holdings go
		// to s.ex, marked when their engine is in gpu.
		gpu := alive & simple
		next := gpu
		for j := 2 * np; j < len(p); j++ {
			x := atomic.LoadUint64(&p[j])
			e := hEngine(x)
			if e >= 64 || alive&(1<<e) == 0 {
				continue
			}
			next |= 1 << e
			if hMedium(x) == mediumGPU {
				gpu |= 1 << e
				continue
			}
			s.ex = append(s.ex, hSlot(x))
		}
		for j, x := range s.ex {
			s.ex[j] = x | gpu>>hEngine(x)&1
		}
		return next
	}
	return 0
}

func (s *queryScratch) andHolders(d *shardData, key, h uint64) {
	alive, next := s.alive, s.next
	for _, w := range s.nz {
		next[w] = 0
	}
	s.ex = s.ex[:0]
	v := d.readVal(key, h)
	switch valKind(v) {
	case kindInline:
		for f := 0; f < 3; f++ {
			id := uint32(v >> (16 * f) & 0xffff)
			if id == 0 {
				continue
			}
			id--
			if w := int(id >> 6); w < len(alive) {
				next[w] |= alive[w] & (1 << (id & 63))
			}
		}
	case kindRecord:
		a := d.arena
		off := int(uint32(v))
		if off >= len(a) {
			return
		}
		hdr := atomic.LoadUint64(&a[off])
		np, nd := int(hdr&0xffff), int(hdr>>16&0xffff)
		if off+1+2*np+nd > len(a) {
			return
		}
		p := a[off+1 : off+1+2*np+nd]
		for j := 0; j < 2*np; j += 2 {
			if w := atomic.LoadUint64(&p[j]); w < uint64(len(alive)) {
				next[w] = alive[w] & atomic.LoadUint64(&p[j+1])
			}
		}
		// next holds the simple (GPU, group 0) holders: add the other
		// GPU holders, then mark which other media's holdings (in s.ex)
		// have their engine among them, then add those holders.
		for j := 2 * np; j < len(p); j++ {
			x := atomic.LoadUint64(&p[j])
			e := hEngine(x)
			if w := int(e >> 6); w < len(alive) && alive[w]&(1<<(e&63)) != 0 {
				if hMedium(x) == mediumGPU {
					next[w] |= 1 << (e & 63)
				} else {
					s.ex = append(s.ex, hSlot(x))
				}
			}
		}
		for j, x := range s.ex {
			e := hEngine(x)
			if next[e>>6]&(1<<(e&63)) != 0 {
				s.ex[j] |= 1
			}
		}
		for _, x := range s.ex {
			e := hEngine(x)
			next[e>>6] |= 1 << (e & 63)
		}
	}
}

// commit applies s.next after block i: engines dropping out matched i
// blocks. It reports whether any candidate is still alive.
func (s *queryScratch) commit(i int, media int) bool {
	for j := 0; j < len(s.nz); {
		w := s.nz[j]
		dropped := s.alive[w] &^ s.next[w]
		for dropped != 0 {
			b := bits.TrailingZeros64(dropped)
			dropped &= dropped - 1
			s.matched[int(w)<<6|b] = int32(i)
		}
		s.alive[w] = s.next[w]
		if s.alive[w] == 0 {
			s.nz[j] = s.nz[len(s.nz)-1]
			s.nz = s.nz[:len(s.nz)-1]
			continue
		}
		j++
	}
	if len(s.ex) > 0 {
		s.countTiers(media)
	}
	return len(s.nz) > 0
}

// countTiers counts, for one matched block, the media of engines with
// holdings in media other than GPU (s.ex, each marked in bit 0 when its
// engine also holds the block in GPU): such a medium counts once per
// block however many groups hold it there, and a block an engine holds
// in no GPU group counts against its GPU tier. Stamps instead of a sort
// find the repeats, as a sort of the holdings was most of a walk's time
// (BenchmarkLongestPrefixServer).
func (s *queryScratch) countTiers(media int) {
	s.stamp++
	if s.stamp == 0 { // wrapped: older stamps could come back
		clear(s.tierSeen[:cap(s.tierSeen)])
		clear(s.gpuSeen[:cap(s.gpuSeen)])
		s.stamp = 1
	}
	st := s.stamp
	for _, x := range s.ex {
		e, m := int(hEngine(x)), hMedium(x)
		if m != mediumGPU && m < media {
			if t := e*media + m; s.tierSeen[t] != st {
				s.tierSeen[t] = st
				s.tiers[t]++
			}
		}
		if x&1 == 0 && s.gpuSeen[e] != st {
			s.gpuSeen[e] = st
			s.missGPU[e]++
		}
	}
}

// querySetup validates q and finds its namespace and block count.
func (ix *Index) querySetup(q *Query) (ns *namespace, n, bs int, err error) {
	ns = ix.namespace(q.Model, false)
	switch {
	case ix.hasher != nil:
		bs = ix.hasher.BlockSize()
	case ns != nil:
		bs = int(ns.blockSize.Load())
	}
	switch {
	case len(q.BlockHashes) > 0:
		n = len(q.BlockHashes)
	case len(q.Tokens) > 0:
		if ix.hasher == nil {
			return nil, 0, 0, ErrNoHasher
		}
		n = len(q.Tokens) / bs
	}
	return ns, n, bs, nil
}

// LongestPrefix answers q into res, reusing res's storage.
//
// For every candidate engine it counts the blocks it holds contiguously
// from block 0; the walk over the blocks stops as soon as no candidate
// holds the next one. A block counts for an engine if the engine holds it
// in any KV-cache group and medium; Tiers then splits the matched blocks
// by medium (a block held in several media counts in each).
func (ix *Index) LongestPrefix(q *Query, res *Result) error {
	ns, n, bs, err := ix.querySetup(q)
	if err != nil {
		return err
	}
	res.BlocksTotal, res.BlockSize = n, bs
	res.Pods = res.Pods[:0]
	if ns == nil {
		return nil
	}
	s := ix.scratch.Get().(*queryScratch)
	defer ix.scratch.Put(s)
	et := ns.engines.Load()
	s.candidates(et, q.Candidates)
	if len(s.cand) == 0 {
		return nil
	}
	media := len(*ns.media.names.Load())
	s.matched = resize(s.matched, len(et.byID))
	s.missGPU = resize(s.missGPU, len(et.byID))
	s.tiers = resize(s.tiers, len(et.byID)*media)
	s.tierSeen = resize(s.tierSeen, len(et.byID)*media)
	s.gpuSeen = resize(s.gpuSeen, len(et.byID))
	for _, id := range s.cand {
		s.matched[id], s.missGPU[id] = 0, 0
		clear(s.tiers[int(id)*media : int(id+1)*media])
	}
	var k keySource
	keys := q.BlockHashes
	if len(keys) == 0 {
		keys = nil // by tokens, if any
		if n > 0 {
			k.initTokens(ix, s, q.Tokens, q.Extras)
		}
	}
	// Blocks are walked in windows: the window's slots (and records) are
	// loaded first, all at once, so their cache misses overlap instead of
	// adding up one block at a time.
	i := 0
walk:
	for i < n {
		end := min(n, i+walkWindow)
		var win []uint64
		if keys != nil {
			win = keys[i:end]
		} else {
			if end > k.have {
				if err := k.ensure(end - 1); err != nil {
					return err
				}
			}
			win = s.keys[i:end]
		}
		if len(s.alive) == 1 {
			// Up to 64 engines: the alive set is one word. The window's
			// home slots are read first, all at once, each inside its
			// shard's seqlock section, which the second pass closes.
			s.readWindow(ns, win)
			alive := s.alive[0]
			for j, key := range win {
				w := &s.win[j]
				v := w.val
				if w.key != key && v != 0 {
					v = w.d.readVal(key, w.h) // not in its home slot
				}
				next := s.and1v(w.d, v, alive)
				if w.sh.seq.Load() != w.seq {
					next = s.step1(w.sh, key, w.h, alive) // a writer came by: read again
				}
				for d := alive &^ next; d != 0; d &= d - 1 {
					s.matched[bits.TrailingZeros64(d)] = int32(i)
				}
				alive = next
				if len(s.ex) > 0 {
					s.countTiers(media)
				}
				if alive == 0 {
					s.alive[0], s.nz = 0, s.nz[:0]
					break walk
				}
				i++
			}
			s.alive[0] = alive
			continue
		}
		s.prefetch(ns, win)
		for j, key := range win {
			h := s.hv[j]
			s.step(&ns.shards[shardIndex(h)], key, h)
			if !s.commit(i, media) {
				break walk
			}
			i++
		}
	}
	if i == n {
		for _, w := range s.nz {
			for x := s.alive[w]; x != 0; x &= x - 1 {
				s.matched[int(w)<<6|bits.TrailingZeros64(x)] = int32(n)
			}
		}
	}
	if keys == nil && n > 0 {
		k.finish()
	}
	fillResult(res, s, ns, et, bs, media)
	return nil
}

func fillResult(res *Result, s *queryScratch, ns *namespace, et *engineTable, bs, media int) {
	// Sort by matched blocks descending, then (pod, rank): one uint64
	// per candidate, no string comparisons.
	order := s.order[:0]
	for _, id := range s.cand {
		order = append(order, uint64(math.MaxInt32-s.matched[id])<<32|uint64(et.pos[id]))
	}
	slices.Sort(order)
	s.order = order
	pods := res.Pods[:0]
	for _, o := range order {
		id := et.order[uint32(o)]
		e := et.byID[id]
		var tiers []TierCount
		if len(pods) < cap(pods) {
			tiers = pods[:len(pods)+1][len(pods)].Tiers[:0]
		}
		m := int(s.matched[id])
		if g := m - int(s.missGPU[id]); g > 0 {
			tiers = append(tiers, TierCount{Medium: kvevents.MediumGPU, Blocks: g})
		}
		first := len(tiers)
		for md := 1; md < media; md++ {
			if c := s.tiers[int(id)*media+md]; c > 0 {
				tiers = append(tiers, TierCount{Medium: ns.media.name(md), Blocks: int(c)})
			}
		}
		if len(tiers)-first > 1 {
			slices.SortFunc(tiers[first:], func(a, b TierCount) int { return cmp.Compare(a.Medium, b.Medium) })
		}
		pods = append(pods, PodMatch{
			Engine:        e.eid,
			MatchedBlocks: m,
			MatchedTokens: m * bs,
			Tiers:         tiers,
			HashCheck:     HashCheck(e.check.Load()),
			Evicted:       e.evicted.Load() != 0,
		})
	}
	res.Pods = pods
}

func comparePods(a, b PodMatch) int {
	return cmp.Or(cmp.Compare(b.MatchedBlocks, a.MatchedBlocks),
		cmp.Compare(a.Engine.Pod, b.Engine.Pod), cmp.Compare(a.Engine.DPRank, b.Engine.DPRank))
}

// readHolders decodes the holders of key into hs; false if absent.
func (sh *shard) readHolders(key, h uint64, hs *holderSet) bool {
	for attempt := 0; attempt < readAttempts; attempt++ {
		seq := sh.stableSeq()
		d := sh.data.Load()
		ok := hs.decode(d.arena, d.readVal(key, h))
		if sh.seq.Load() == seq {
			return ok
		}
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	d := sh.data.Load()
	return hs.decode(d.arena, d.readVal(key, h))
}

// Lookup returns, per block of q, its key and holders (restricted to
// q.Candidates when set), holders sorted by pod, rank, group and medium.
// An unknown model yields the keys with no holders.
func (ix *Index) Lookup(q *Query) ([]BlockHolders, error) {
	ns, n, _, err := ix.querySetup(q)
	if err != nil {
		return nil, err
	}
	s := ix.scratch.Get().(*queryScratch)
	defer ix.scratch.Put(s)
	keys := q.BlockHashes
	if len(keys) == 0 && n > 0 {
		var k keySource
		k.initTokens(ix, s, q.Tokens, q.Extras)
		if err := k.ensure(n - 1); err != nil {
			return nil, err
		}
		k.finish()
		keys = s.keys[:n]
	}
	out := make([]BlockHolders, n)
	var et *engineTable
	if ns != nil {
		et = ns.engines.Load()
		s.candidates(et, q.Candidates)
	}
	for i, key := range keys {
		out[i] = BlockHolders{Index: i, Key: key}
		if ns == nil {
			continue
		}
		h := mixKey(key)
		if !ns.shards[shardIndex(h)].readHolders(key, h, &s.hs) {
			continue
		}
		add := func(id uint32, g, m int, refs uint32) {
			if int(id) >= len(et.byID) || et.byID[id] == nil || s.alive[id>>6]&(1<<(id&63)) == 0 {
				return
			}
			out[i].Holders = append(out[i].Holders, Holder{Engine: et.byID[id].eid, Medium: ns.media.name(m), GroupIdx: g, Refs: int(refs)})
		}
		for j := 0; j < len(s.hs.s); j += 2 {
			for x := s.hs.s[j+1]; x != 0; x &= x - 1 {
				add(uint32(s.hs.s[j])<<6|uint32(bits.TrailingZeros64(x)), 0, mediumGPU, 1)
			}
		}
		for _, x := range s.hs.d {
			add(hEngine(x), hGroup(x), hMedium(x), hRefs(x))
		}
		slices.SortFunc(out[i].Holders, func(a, b Holder) int {
			return cmp.Or(compareEngineID(a.Engine, b.Engine), cmp.Compare(a.GroupIdx, b.GroupIdx), cmp.Compare(a.Medium, b.Medium))
		})
	}
	return out, nil
}
