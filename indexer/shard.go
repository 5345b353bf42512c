package indexer

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"unsafe"
)

// A namespace's blocks live in numShards shards chosen by the top bits of
// the mixed key. Each shard is an open-addressing table of 16-byte slots
// (linear probing with backward-shift deletion: no tombstones, which
// engines' constant store/remove churn would otherwise pile up) plus an
// arena of uint64 words for the rare blocks whose holders do not fit
// inline in the slot.
//
// Concurrency: writers take the shard's mutex and bracket every change
// with two increments of seq (odd while the shard is being changed).
// Readers never lock in the common case: they read seq, read the slots and
// arena with atomic loads, and retry if seq moved (a seqlock). Every read
// is bounds-checked, so a reader that races a writer may see garbage but
// never panics, and the seq check throws the garbage away.
//
// Reverse lists: per engine, the shard keeps the 32 hash bits that place
// each key it stored (its "home" in the table) so that clearing an engine
// visits only its own keys. Those bits do not change when keys shift or
// the table is rehashed, so the lists need no upkeep besides appending on
// a new (engine, key) association; removals leave stale entries, and when
// stale entries outnumber live ones the shard rebuilds every list with one
// sequential scan of its table.
const (
	shardBits = 8
	numShards = 1 << shardBits

	// Generations: each slot carries the generation of its last store, in
	// genBits spare bits; memory-budget eviction drops the oldest ones.
	genBits = 6
	numGens = 1 << genBits
	genMask = numGens - 1

	// Table sizing. A table is rebuilt when live keys would exceed
	// maxLoad, to a capacity giving rebuildLoad; it shrinks when removals
	// leave it below shrinkLoad, and eviction compacts it to evictLoad.
	// Linear probing at 0.8 costs ~3 probes per hit and ~13 per miss, 4
	// slots per cache line; BenchmarkMemory and BenchmarkApply set these.
	minSlots    = 32
	maxLoadNum  = 13 // of 16: 0.8125
	rebuildLoad = 0.45
	shrinkLoad  = 0.2
	evictLoad   = 0.7

	// Chunk of slots (or reverse-list entries) processed per write
	// section by sweeps and resets, so readers never wait long.
	sweepChunk = 128
)

// Slot value layout:
//
//	63..62 kind: 0 empty (the whole value is 0), 1 inline, 2 record
//	61..56 generation of the last store
//	47..0  inline: three 16-bit fields, engine id + 1 (0: none), each a
//	       holding (GPU, group 0, one reference)
//	       record: offset of the block's record in the shard arena
const (
	kindShift   = 62
	kindEmpty   = 0
	kindInline  = 1
	kindRecord  = 2
	genShift    = 56
	payloadMask = 1<<48 - 1

	maxInlineID = 0xfffe // engine ids that fit an inline field
)

func valKind(v uint64) uint64 { return v >> kindShift }
func valGen(v uint64) uint64  { return v >> genShift & genMask }
func isLive(v uint64) bool    { return v != 0 }

// inlineHolds reports whether inline value v lists engine e.
func inlineHolds(v uint64, e uint32) bool {
	x := uint64(e + 1)
	return v&0xffff == x || v>>16&0xffff == x || v>>32&0xffff == x
}

// Record layout in the arena (uint64 words):
//
//	word 0: bits 0..15 number of bitmap pairs, 16..31 number of detail
//	        holdings, 32..39 capacity class (the run is 1<<class words)
//	then pairs (word index, bits) of the "simple" bitmap: engines with a
//	        (GPU, group 0, one reference) holding; sorted by word index
//	then detail holdings, packed (see packHolding): every other holding
const (
	maxClass    = 24
	minClass    = 2
	maxRecPairs = 1<<16 - 1
	maxRecD     = 1<<16 - 1
)

func recHeader(npairs, nd int, class uint8) uint64 {
	return uint64(npairs) | uint64(nd)<<16 | uint64(class)<<32
}

func classFor(words int) uint8 {
	return max(uint8(bits.Len(uint(words-1))), minClass)
}

// A holding packs engine id (24 bits), KV-cache group (12), medium id (8)
// and reference count (20).
const (
	maxEngines = 1 << 20 // per namespace; bounded well below the 24-bit field
	maxGroup   = 1<<12 - 1
	maxMedia   = 1 << 8
	maxRefs    = 1<<20 - 1
	mediumGPU  = 0
)

func packHolding(e uint32, g, m int, refs uint32) uint64 {
	return uint64(e)<<40 | uint64(g)<<28 | uint64(m)<<20 | uint64(refs)
}
func hEngine(x uint64) uint32 { return uint32(x >> 40) }
func hGroup(x uint64) int     { return int(x >> 28 & 0xfff) }
func hMedium(x uint64) int    { return int(x >> 20 & 0xff) }
func hRefs(x uint64) uint32   { return uint32(x & 0xfffff) }

// hSlot is the holding without its reference count: (engine, group, medium).
func hSlot(x uint64) uint64 { return x &^ 0xfffff }

// mixKey spreads block keys over shards and slots (murmur3's finaliser), so
// that non-random keys (tests, hostile engines) do not cluster.
func mixKey(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	return k
}

func shardIndex(h uint64) int { return int(h >> (64 - shardBits)) }

// placeBits are the 32 bits of the mixed key below the shard bits; they
// alone decide where a key sits in its shard's table, so reverse lists can
// hold them instead of whole keys.
func placeBits(h uint64) uint32 { return uint32(h >> (32 - shardBits)) }

// home is the first slot probed for place bits p in a table of n slots.
func home(p uint32, n int) int { return int(uint64(p) * uint64(n) >> 32) }

type slot struct{ key, val uint64 }

const slotBytes = int64(unsafe.Sizeof(slot{}))

// shardData is what readers load atomically: the table and the arena.
type shardData struct {
	slots []slot
	arena []uint64
}

type shard struct {
	seq  atomic.Uint64
	data atomic.Pointer[shardData]
	mu   sync.Mutex

	// Guarded by mu.
	used     int // live keys
	holdings int // holder-blocks: (engine, group, medium, key) holdings
	assocs   int // (engine, key) associations: what the reverse lists must hold
	revLen   int // entries in the reverse lists, stale ones included
	revCap   int // sum of cap(rev[e])
	arenaTop int // arena words ever handed out (the bump pointer)
	recWords int // words of live records (by capacity)
	free     [maxClass + 1][]uint32
	freeCap  int        // sum of cap(free[c])
	rev      [][]uint32 // per engine id: place bits of the keys it may hold
	hist     [numGens]int32
	bytes    int64 // accounted bytes of this shard's structures
	hs       holderSet
	scanHS   holderSet
	_        [64]byte // keep hot shards off each other's cache lines
}

func (sh *shard) beginWrite() { sh.seq.Add(1) }
func (sh *shard) endWrite()   { sh.seq.Add(1) }

// init gives the shard an empty table and returns its bytes.
func (sh *shard) init() int64 {
	sh.data.Store(&shardData{slots: make([]slot, minSlots)})
	return sh.account()
}

// account recomputes the shard's byte count from its running totals and
// returns the change.
func (sh *shard) account() int64 {
	d := sh.data.Load()
	b := int64(unsafe.Sizeof(*sh)) + int64(cap(d.slots))*slotBytes + int64(cap(d.arena))*8
	b += int64(cap(sh.rev))*24 + int64(sh.revCap)*4 + int64(sh.freeCap)*4
	delta := b - sh.bytes
	sh.bytes = b
	return delta
}

// find returns the slot holding key, or -1. Writer side (mu held).
func (d *shardData) find(key, h uint64) int {
	i, found := d.findSlot(key, h)
	if !found {
		return -1
	}
	return i
}

// findSlot returns the slot holding key (found), or else the empty slot
// ending its probe sequence, where it would go. Writer side (mu held).
func (d *shardData) findSlot(key, h uint64) (i int, found bool) {
	n := len(d.slots)
	i = home(placeBits(h), n)
	for {
		s := &d.slots[i]
		if s.val == 0 {
			return i, false
		}
		if s.key == key {
			return i, true
		}
		if i++; i == n {
			i = 0
		}
	}
}

// readVal returns the slot value of key (0 if absent) with atomic loads.
// Reader side: the caller validates the shard's seq afterwards.
func (d *shardData) readVal(key, h uint64) uint64 {
	slots := d.slots
	n := len(slots)
	if n == 0 {
		return 0
	}
	i := home(placeBits(h), n)
	for range n {
		s := &slots[i]
		v := atomic.LoadUint64(&s.val)
		if v == 0 {
			return 0
		}
		if atomic.LoadUint64(&s.key) == key {
			return v
		}
		if i++; i == n {
			i = 0
		}
	}
	return 0
}

// noteAssoc records that engine e now holds a key with place bits p.
func (sh *shard) noteAssoc(e uint32, p uint32) {
	if int(e) >= len(sh.rev) {
		n := int(e) + 1
		if n > cap(sh.rev) {
			grown := make([][]uint32, n, max(n, 2*cap(sh.rev)))
			copy(grown, sh.rev)
			sh.rev = grown
		}
		sh.rev = sh.rev[:n]
	}
	r := sh.rev[e]
	if len(r) == cap(r) {
		// Grow by a quarter rather than append's doubling: the lists
		// are a fifth of the index's memory.
		grown := make([]uint32, len(r), len(r)+len(r)/4+8)
		copy(grown, r)
		sh.revCap += cap(grown) - cap(r)
		r = grown
	}
	sh.rev[e] = append(r, p)
	sh.assocs++
	sh.revLen++
	sh.maybeRebuildRev()
}

// maybeRebuildRev rebuilds the reverse lists once stale entries outnumber
// live ones (amortised O(1) per association or removal).
func (sh *shard) maybeRebuildRev() {
	if sh.revLen > 2*sh.assocs+256 {
		sh.rebuildRev()
	}
}

// rebuildRev rebuilds every reverse list of the shard from its table in
// one sequential scan, dropping stale entries.
func (sh *shard) rebuildRev() {
	d := sh.data.Load()
	for e, r := range sh.rev {
		sh.rev[e] = r[:0]
	}
	hs := &sh.scanHS
	for _, s := range d.slots {
		v := s.val
		if v == 0 {
			continue
		}
		p := placeBits(mixKey(s.key))
		if valKind(v) == kindInline {
			for f := 0; f < 3; f++ {
				if id := uint32(v >> (16 * f) & 0xffff); id != 0 {
					sh.rev[id-1] = append(sh.rev[id-1], p)
				}
			}
			continue
		}
		hs.decode(d.arena, v)
		hs.engines(func(e uint32) { sh.rev[e] = append(sh.rev[e], p) })
	}
	sh.revLen, sh.revCap = 0, 0
	for e, r := range sh.rev {
		if cap(r) > 2*len(r)+16 {
			r = append([]uint32(nil), r...)
			sh.rev[e] = r
		}
		sh.revLen += len(r)
		sh.revCap += cap(r)
	}
	sh.assocs = sh.revLen
}

// alloc returns the offset of a free run of 1<<class words, growing the
// arena when needed (publishing the grown copy; callers are inside a
// write section).
func (sh *shard) alloc(class uint8) uint32 {
	if fl := sh.free[class]; len(fl) > 0 {
		off := fl[len(fl)-1]
		sh.free[class] = fl[:len(fl)-1]
		return off
	}
	size := 1 << class
	d := sh.data.Load()
	if sh.arenaTop+size > len(d.arena) {
		n := max(sh.arenaTop+size, len(d.arena)+len(d.arena)/2, 64)
		arena := make([]uint64, n)
		copy(arena, d.arena[:sh.arenaTop])
		sh.data.Store(&shardData{slots: d.slots, arena: arena})
	}
	off := uint32(sh.arenaTop)
	sh.arenaTop += size
	return off
}

func (sh *shard) freeRecord(arena []uint64, off uint32) {
	class := uint8(arena[off] >> 32)
	c0 := cap(sh.free[class])
	sh.free[class] = append(sh.free[class], off)
	sh.freeCap += cap(sh.free[class]) - c0
	sh.recWords -= 1 << class
}

// decodeW decodes slot value v into the writer's scratch set.
func (sh *shard) decodeW(d *shardData, v uint64) *holderSet {
	hs := &sh.hs
	hs.decode(d.arena, v)
	return hs
}

// store writes hs as the new holders of slot i (whose value is old, live
// or empty), with generation gen, and keeps the shard's counts. Inside a
// write section. An empty hs deletes the block (see deleteAt).
func (sh *shard) store(i int, old uint64, hs *holderSet, gen uint64) {
	d := sh.data.Load()
	if hs.empty() {
		sh.deleteAt(d, i, old)
		return
	}
	oldRec := valKind(old) == kindRecord
	var v uint64
	if p, ok := hs.inline(); ok {
		v = uint64(kindInline)<<kindShift | gen<<genShift | p
	} else {
		words := hs.recordWords()
		var off uint32
		var class uint8
		if oldRec {
			if oc := uint8(d.arena[uint32(old)] >> 32); 1<<oc >= words {
				off, class = uint32(old), oc
				oldRec = false // rewritten in place
			}
		}
		if class == 0 {
			class = classFor(words)
			off = sh.alloc(class)
			sh.recWords += 1 << class
			d = sh.data.Load()
		}
		a := d.arena
		atomic.StoreUint64(&a[off], recHeader(len(hs.s)/2, len(hs.d), class))
		j := int(off) + 1
		for _, x := range hs.s {
			atomic.StoreUint64(&a[j], x)
			j++
		}
		for _, x := range hs.d {
			atomic.StoreUint64(&a[j], x)
			j++
		}
		v = uint64(kindRecord)<<kindShift | gen<<genShift | uint64(off)
	}
	if oldRec {
		sh.freeRecord(d.arena, uint32(old))
	}
	if isLive(old) {
		sh.hist[valGen(old)]--
	} else {
		sh.used++
	}
	sh.hist[gen]++
	atomic.StoreUint64(&d.slots[i].val, v)
}

// deleteAt empties slot i (whose value was old) and shifts the rest of
// its probe run back over the hole, so that every key stays reachable
// from its home without tombstones. Inside a write section.
func (sh *shard) deleteAt(d *shardData, i int, old uint64) {
	if valKind(old) == kindRecord {
		sh.freeRecord(d.arena, uint32(old))
	}
	sh.hist[valGen(old)]--
	sh.used--
	n := len(d.slots)
	for j := i; ; {
		if j++; j == n {
			j = 0
		}
		s := d.slots[j]
		if s.val == 0 {
			break
		}
		// s stays if its home lies cyclically in (i, j].
		if k := home(placeBits(mixKey(s.key)), n); i <= j && i < k && k <= j || i > j && (i < k || k <= j) {
			continue
		}
		atomic.StoreUint64(&d.slots[i].key, s.key)
		atomic.StoreUint64(&d.slots[i].val, s.val)
		i = j
	}
	atomic.StoreUint64(&d.slots[i].val, 0)
	atomic.StoreUint64(&d.slots[i].key, 0)
}

// needRebuild reports whether inserting one more key needs a larger table
// first.
func (sh *shard) needRebuild(d *shardData) bool {
	return (sh.used+1)*16 > len(d.slots)*maxLoadNum
}

// rebuild rehashes the shard into a table with load factor load for its
// live keys (plus extra), compacting the arena. It builds the new
// structures while readers keep using the old ones, then publishes them
// in one short write section. The reverse lists are unaffected. mu held.
func (sh *shard) rebuild(extra int, load float64) {
	old := sh.data.Load()
	want := max(minSlots, int(float64(sh.used+extra)/load)+1)
	nd := &shardData{slots: make([]slot, want)}
	if sh.recWords > 0 {
		nd.arena = make([]uint64, sh.recWords+sh.recWords/8)
	}
	top := 0
	// The old table is walked in slot order, which is nearly the order
	// of the keys' home slots in the new one: probes stay short and
	// writes sequential.
	for _, s := range old.slots {
		v := s.val
		if v == 0 {
			continue
		}
		// Keys are unique: probe for the first empty slot only.
		n := len(nd.slots)
		i := home(placeBits(mixKey(s.key)), n)
		for nd.slots[i].val != 0 {
			if i++; i == n {
				i = 0
			}
		}
		if valKind(v) == kindRecord {
			off := uint32(v)
			hdr := old.arena[off]
			np, nd2 := int(hdr&0xffff), int(hdr>>16&0xffff)
			words := 1 + 2*np + nd2
			class := classFor(words)
			copy(nd.arena[top:], old.arena[off:int(off)+words])
			nd.arena[top] = recHeader(np, nd2, class)
			v = v&^payloadMask | uint64(top)
			top += 1 << class
		}
		nd.slots[i] = slot{s.key, v}
	}
	sh.arenaTop = top
	sh.recWords = top
	for c := range sh.free {
		sh.free[c] = nil
	}
	sh.freeCap = 0
	sh.beginWrite()
	sh.data.Store(nd)
	sh.endWrite()
}

// maybeShrink rebuilds a shard whose table is mostly empty or whose arena
// is mostly free runs. Each condition needs work proportional to the
// table since the last rebuild, so rebuilds stay amortised O(1) per
// operation.
func (sh *shard) maybeShrink() {
	d := sh.data.Load()
	n := len(d.slots)
	if n > minSlots && float64(sh.used) < shrinkLoad*float64(n) ||
		len(d.arena)-sh.recWords > max(4096, n/2) {
		sh.rebuild(0, rebuildLoad)
	}
}

func trailingZeros(x uint64) int { return bits.TrailingZeros64(x) }
