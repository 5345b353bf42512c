package indexer

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/kvindex/kvindex/kvevents"
)

// namespace is the index of one model: its engines and its shards.
type namespace struct {
	model  string
	shards [numShards]shard
	media  mediaTable // medium names, per namespace: id 0 is the GPU

	engMu   sync.Mutex // serialises changes to engines
	engines atomic.Pointer[engineTable]

	bytes     atomic.Int64 // accounted bytes of shards and engines
	blockSize atomic.Int64 // last block size engines reported, for queries without a Hasher
}

// engineKey identifies an engine inside its model's namespace.
type engineKey struct {
	pod  string
	rank int
}

// engineTable is an immutable view of a namespace's engines, replaced
// whole when an engine joins or leaves (rare), so queries read it with one
// atomic load.
type engineTable struct {
	byID  []*engine // indexed by engine id; nil for free ids
	byKey map[engineKey]*engine
	byPod map[string][]uint32 // pod -> engine ids, by rank
	n     int
	pos   []uint32 // engine id -> position in (pod, rank) order
	order []uint32 // engine ids in (pod, rank) order
}

// index computes the (pod, rank) order of the table's engines, which
// queries use to sort their answers without comparing strings.
func (t *engineTable) index() *engineTable {
	t.order = t.order[:0]
	for id, e := range t.byID {
		if e != nil {
			t.order = append(t.order, uint32(id))
		}
	}
	slices.SortFunc(t.order, func(a, b uint32) int { return compareEngineID(t.byID[a].eid, t.byID[b].eid) })
	t.pos = make([]uint32, len(t.byID))
	for i, id := range t.order {
		t.pos[id] = uint32(i)
	}
	return t
}

func newNamespace(model string) *namespace {
	ns := &namespace{model: model}
	ns.media.init()
	var b int64 = int64(unsafe.Sizeof(*ns))
	for i := range ns.shards {
		b += ns.shards[i].init()
	}
	ns.bytes.Store(b)
	ns.engines.Store(&engineTable{byKey: map[engineKey]*engine{}, byPod: map[string][]uint32{}})
	return ns
}

func (ns *namespace) engine(pod string, rank int) *engine {
	return ns.engines.Load().byKey[engineKey{pod, rank}]
}

// addEngine returns the engine (pod, rank), registering it with the
// smallest free id when it is new; nil if the namespace is full.
func (ns *namespace) addEngine(id kvevents.EngineID, mk func(uint32) *engine) *engine {
	ns.engMu.Lock()
	defer ns.engMu.Unlock()
	old := ns.engines.Load()
	k := engineKey{id.Pod, id.DPRank}
	if e := old.byKey[k]; e != nil {
		return e
	}
	slot := slices.Index(old.byID, nil)
	if slot < 0 {
		slot = len(old.byID)
	}
	if slot >= maxEngines {
		return nil
	}
	e := mk(uint32(slot))
	nt := &engineTable{
		byID:  slices.Clone(old.byID),
		byKey: make(map[engineKey]*engine, len(old.byKey)+1),
		byPod: make(map[string][]uint32, len(old.byPod)+1),
		n:     old.n + 1,
	}
	if slot == len(nt.byID) {
		nt.byID = append(nt.byID, e)
	} else {
		nt.byID[slot] = e
	}
	for kk, v := range old.byKey {
		nt.byKey[kk] = v
	}
	nt.byKey[k] = e
	for p, ids := range old.byPod {
		nt.byPod[p] = ids
	}
	ids := append(slices.Clone(old.byPod[id.Pod]), e.id)
	slices.SortFunc(ids, func(a, b uint32) int { return cmp.Compare(nt.byID[a].eid.DPRank, nt.byID[b].eid.DPRank) })
	nt.byPod[id.Pod] = ids
	ns.engines.Store(nt.index())
	ns.bytes.Add(e.bytes())
	return e
}

// dropEngine unregisters e; its id becomes free. Its holdings must be gone.
func (ns *namespace) dropEngine(e *engine) {
	ns.engMu.Lock()
	defer ns.engMu.Unlock()
	old := ns.engines.Load()
	k := engineKey{e.eid.Pod, e.eid.DPRank}
	if old.byKey[k] != e {
		return
	}
	nt := &engineTable{
		byID:  slices.Clone(old.byID),
		byKey: make(map[engineKey]*engine, len(old.byKey)),
		byPod: make(map[string][]uint32, len(old.byPod)),
		n:     old.n - 1,
	}
	nt.byID[e.id] = nil
	for len(nt.byID) > 0 && nt.byID[len(nt.byID)-1] == nil {
		nt.byID = nt.byID[:len(nt.byID)-1]
	}
	for kk, v := range old.byKey {
		if kk != k {
			nt.byKey[kk] = v
		}
	}
	for p, ids := range old.byPod {
		if p == e.eid.Pod {
			ids = slices.DeleteFunc(slices.Clone(ids), func(x uint32) bool { return x == e.id })
			if len(ids) == 0 {
				continue
			}
		}
		nt.byPod[p] = ids
	}
	ns.engines.Store(nt.index())
	ns.bytes.Add(-e.bytes())
}

// add adds refs references of the holding (e, g, m) to key, stamping the
// block with generation gen. newHolding reports a holding that did not
// exist before.
func (ns *namespace) add(e uint32, key uint64, g, m int, refs uint32, gen uint64) (newHolding, saturated bool) {
	h := mixKey(key)
	sh := &ns.shards[shardIndex(h)]
	sh.mu.Lock()
	d := sh.data.Load()
	if sh.needRebuild(d) {
		sh.rebuild(1, rebuildLoad)
		d = sh.data.Load()
	}
	i, found := d.findSlot(key, h)
	simple := g == 0 && m == mediumGPU && refs == 1 && e <= maxInlineID
	if !found {
		old := d.slots[i].val
		sh.beginWrite()
		atomic.StoreUint64(&d.slots[i].key, key)
		if simple {
			// The overwhelmingly common case: a new block with one
			// GPU holder.
			v := uint64(kindInline)<<kindShift | gen<<genShift | uint64(e+1)
			sh.hist[gen]++
			sh.used++
			atomic.StoreUint64(&d.slots[i].val, v)
		} else {
			hs := &sh.hs
			hs.reset()
			_, _, saturated = hs.add(e, g, m, refs)
			sh.store(i, old, hs, gen)
		}
		sh.endWrite()
		sh.noteAssoc(e, placeBits(h))
		sh.holdings++
		newHolding = true
	} else {
		old := d.slots[i].val
		if simple && valKind(old) == kindInline {
			if f, ok := inlineAddField(old, e); ok {
				// A further GPU holder with a free inline field.
				v := old&^(uint64(genMask)<<genShift) | gen<<genShift | uint64(e+1)<<(16*f)
				sh.beginWrite()
				sh.hist[valGen(old)]--
				sh.hist[gen]++
				atomic.StoreUint64(&d.slots[i].val, v)
				sh.endWrite()
				sh.noteAssoc(e, placeBits(h))
				sh.holdings++
				ns.accountShard(sh)
				sh.mu.Unlock()
				return true, false
			}
		}
		hs := sh.decodeW(d, old)
		var newAssoc bool
		newHolding, newAssoc, saturated = hs.add(e, g, m, refs)
		if !hs.recordFits() {
			sh.mu.Unlock()
			return false, true
		}
		sh.beginWrite()
		sh.store(i, old, hs, gen)
		sh.endWrite()
		if newAssoc {
			sh.noteAssoc(e, placeBits(h))
		}
		if newHolding {
			sh.holdings++
		}
	}
	ns.accountShard(sh)
	sh.mu.Unlock()
	return newHolding, saturated
}

// prefetch touches the home slots of keys so that the cache misses of a
// batch overlap instead of adding up (the loads are independent; the
// CPU issues them together). Atomic loads: the slots may be changing.
func (ns *namespace) prefetch(keys []uint64) uint64 {
	var sum uint64
	for _, k := range keys {
		h := mixKey(k)
		d := ns.shards[shardIndex(h)].data.Load()
		sum += atomic.LoadUint64(&d.slots[home(placeBits(h), len(d.slots))].val)
	}
	return sum
}

// inlineAddField returns the free field for engine e in inline value v, or
// false if e is already there or no field is free.
func inlineAddField(v uint64, e uint32) (int, bool) {
	free := -1
	for f := 0; f < 3; f++ {
		switch uint32(v >> (16 * f) & 0xffff) {
		case e + 1:
			return 0, false
		case 0:
			if free < 0 {
				free = f
			}
		}
	}
	return free, free >= 0
}

// remove drops one reference of (e, g, m) from key.
func (ns *namespace) remove(e uint32, key uint64, g, m int) (found, removed, assocGone bool) {
	h := mixKey(key)
	sh := &ns.shards[shardIndex(h)]
	sh.mu.Lock()
	d := sh.data.Load()
	i := d.find(key, h)
	if i < 0 {
		sh.mu.Unlock()
		return false, false, false
	}
	old := d.slots[i].val
	if g == 0 && m == mediumGPU && valKind(old) == kindInline {
		for f := 0; f < 3; f++ {
			if uint32(old>>(16*f)&0xffff) != e+1 {
				continue
			}
			// The common case: a GPU holder leaves an inline block.
			v := old &^ (0xffff << (16 * f))
			sh.holdings--
			sh.assocs--
			sh.beginWrite()
			if v&payloadMask == 0 {
				sh.deleteAt(d, i, old)
			} else {
				atomic.StoreUint64(&d.slots[i].val, v)
			}
			sh.endWrite()
			if v&payloadMask == 0 {
				sh.maybeShrink()
			}
			sh.maybeRebuildRev()
			ns.accountShard(sh)
			sh.mu.Unlock()
			return true, true, true
		}
		sh.mu.Unlock()
		return false, false, false
	}
	hs := sh.decodeW(d, old)
	found, removed, assocGone = hs.remove(e, g, m)
	if found {
		if removed {
			sh.holdings--
		}
		if assocGone {
			sh.assocs--
		}
		sh.beginWrite()
		sh.store(i, old, hs, valGen(old))
		sh.endWrite()
		sh.maybeShrink()
		sh.maybeRebuildRev()
		ns.accountShard(sh)
	}
	sh.mu.Unlock()
	return found, removed, assocGone
}

// holds reports whether engine e holds key in any group or medium.
func (ns *namespace) holds(e uint32, key uint64) bool {
	h := mixKey(key)
	sh := &ns.shards[shardIndex(h)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	d := sh.data.Load()
	i := d.find(key, h)
	if i < 0 {
		return false
	}
	return sh.decodeW(d, d.slots[i].val).hasEngine(e)
}

// clearEngine removes every holding of engine e, shard by shard: for each
// entry of its reverse list it scans the probe run from that home slot
// for the keys e holds there. Work is chunked into short write sections
// so that readers are never held up for long. It counts the holdings
// removed in b.
func (ns *namespace) clearEngine(e uint32, b *batch) {
	for si := range ns.shards {
		sh := &ns.shards[si]
		sh.mu.Lock()
		if int(e) >= len(sh.rev) || len(sh.rev[e]) == 0 {
			sh.mu.Unlock()
			continue
		}
		list := sh.rev[e]
		n := len(sh.data.Load().slots) // no rehash happens below
		var sink uint64
		for k := 0; k < len(list); {
			sh.beginWrite()
			for end := k + sweepChunk; k < end && k < len(list); k++ {
				if k%16 == 0 {
					// Touch the next 16 home slots at once so that their
					// cache misses overlap (see queryScratch.readWindow).
					d := sh.data.Load()
					for _, p := range list[k:min(k+16, len(list))] {
						sink += d.slots[home(p, n)].val
					}
				}
				p := list[k]
				for i := home(p, n); ; {
					d := sh.data.Load() // storing may grow the arena
					s := d.slots[i]
					if s.val == 0 {
						break
					}
					if valKind(s.val) == kindInline && inlineHolds(s.val, e) && placeBits(mixKey(s.key)) == p {
						// The common case: clear e's field.
						v := s.val
						for f := 0; f < 48; f += 16 {
							if v>>f&0xffff == uint64(e+1) {
								v &^= 0xffff << f
							}
						}
						sh.holdings--
						sh.assocs--
						b.hold(mediumGPU, -1)
						if v&payloadMask == 0 {
							sh.deleteAt(d, i, s.val)
							continue // a shifted key may now sit in slot i
						}
						atomic.StoreUint64(&d.slots[i].val, v)
					} else if placeBits(mixKey(s.key)) == p && sh.holdsSlot(d, s.val, e) {
						hs := sh.decodeW(d, s.val)
						c := hs.removeEngine(e, &b.tiers)
						sh.holdings -= c
						sh.assocs--
						b.holdings -= int64(c)
						sh.store(i, s.val, hs, valGen(s.val))
						continue // a shifted key may now sit in slot i
					}
					if i++; i == n {
						i = 0
					}
				}
			}
			sh.endWrite()
		}
		_ = sink
		sh.revLen -= len(list)
		sh.revCap -= cap(list)
		sh.rev[e] = nil
		sh.maybeShrink()
		ns.accountShard(sh)
		sh.mu.Unlock()
	}
}

// holdsSlot reports whether engine e holds the block of slot value v.
func (sh *shard) holdsSlot(d *shardData, v uint64, e uint32) bool {
	if valKind(v) == kindInline {
		return inlineHolds(v, e)
	}
	hs := &sh.scanHS
	hs.decode(d.arena, v)
	return hs.hasEngine(e)
}

// accountShard folds the shard's byte change into the namespace. mu held.
func (ns *namespace) accountShard(sh *shard) {
	if d := sh.account(); d != 0 {
		ns.bytes.Add(d)
	}
}

// counts returns the namespace's holder-blocks and distinct blocks.
func (ns *namespace) counts() (holdings, blocks int64) {
	for i := range ns.shards {
		sh := &ns.shards[i]
		sh.mu.Lock()
		holdings += int64(sh.holdings)
		blocks += int64(sh.used)
		sh.mu.Unlock()
	}
	return holdings, blocks
}
