package indexer

import (
	"cmp"
	"slices"
	"sync/atomic"

	"github.com/kvindex/kvindex/kvevents"
)

// Memory budget: entries the index cannot vouch for go first. An engine
// whose reported hashes did not match kvindex's (HashMismatch, fallback
// mode) is keyed through a map of its own, which only grows; when the
// index is over budget, such engines are cleared, largest first, then the
// engines whose stream is not healthy (Index.Health), before any healthy
// engine's entry is evicted (shedUnvouched), so a misconfigured, broken or
// hostile engine never pushes a healthy engine's entries out. Next go the
// engines' digest LRUs, state beside the entries that only helps
// verification (trimDigests).
//
// Then entries are evicted by fair share (evictPass): what may stay is
// split max-min fairly among the engines holding entries (counted in
// holder-blocks, from the engines' counters), and only the engines above
// their share lose entries, each down to it, its least recently stored
// first; a block goes when its last holder does. So one engine storing
// without end evicts its own entries, never those of an engine within
// its share. Every slot carries the generation of its block's last store
// (the Index counts stored blocks; a generation is genSpan of them, about
// a sixteenth of what the budget holds); the victims' holdings by age are
// counted in one shard in evictSampleStride (keys are spread evenly over
// the shards), which gives each victim the oldest generations that hold
// its quota, and one sweep of every shard drops those holdings and
// shrinks the emptied tables. The sweep works in chunks of slots per
// write section, so queries are never held up for long. Generations wrap
// after numGens; a block not stored for that long looks young again,
// which only matters if the index stayed under budget all that time.

func (ix *Index) maybeEvict() {
	budget := ix.opts.MemoryBudget
	if budget <= 0 || ix.bytes() <= budget {
		return
	}
	if !ix.evictMu.TryLock() {
		return // another Apply is evicting
	}
	defer ix.evictMu.Unlock()
	if ix.shedUnvouched(budget-budget/10) || ix.trimDigests(budget-budget/10, budget/digestShareDiv) {
		return
	}
	for pass := 0; pass < 4; pass++ {
		cur := ix.bytes()
		if cur <= budget {
			return
		}
		if ix.evictPass(cur, budget-budget/10) == 0 {
			return
		}
	}
}

// evictPass frees about the share of holder-blocks that must go for the
// index to shrink from cur to target bytes, fairly: the engines' shares
// are a max-min fair allocation of what may stay (fairLevel), so only the
// engines holding more than their share lose entries, each down to the
// share, its least-recently-stored first. One engine flooding the index
// thus evicts its own entries, not a small engine's. It returns the
// holder-blocks dropped.
func (ix *Index) evictPass(cur, target int64) uint64 {
	models := *ix.models.Load()
	type holder struct {
		ns *namespace
		e  *engine
		n  int64
	}
	var holders []holder
	var sizes []int64
	var total int64
	for _, ns := range models {
		for _, e := range ns.engines.Load().byID {
			if e == nil {
				continue
			}
			if n := e.holderBlocks.Load(); n > 0 {
				holders = append(holders, holder{ns, e, n})
				sizes = append(sizes, n)
				total += n
			}
		}
	}
	if total == 0 {
		return 0
	}
	need := max(1, int64(float64(total)*float64(cur-target)/float64(cur)))
	level := fairLevel(sizes, total-need)
	plans := map[*namespace]*evictPlan{}
	for _, h := range holders {
		if h.n <= level {
			continue
		}
		p := plans[h.ns]
		if p == nil {
			p = newEvictPlan(len(h.ns.engines.Load().byID))
			plans[h.ns] = p
		}
		p.add(h.e, h.n-level, level)
	}
	gen := ix.stored.Load() / ix.genSpan & genMask
	var evicted uint64
	for ns, p := range plans {
		if testHookEvictShard != nil {
			testHookEvictShard(-1)
		}
		ns.sampleAges(p, gen)
		p.cut()
		evicted += ns.evictOver(p, gen)
	}
	ix.evictions.Add(evicted)
	return evicted
}

// fairLevel returns the max-min fair share of capacity among holders of
// the given sizes: the largest level such that the sizes capped at it
// add up to at most capacity (every size when they fit). Holders above
// the level are the ones to evict from, each down to it.
func fairLevel(sizes []int64, capacity int64) int64 {
	s := slices.Sorted(slices.Values(sizes))
	left := max(capacity, 0)
	for i, x := range s {
		n := int64(len(s) - i)
		if x*n > left {
			return left / n
		}
		left -= x
	}
	return s[len(s)-1]
}

// evictSampleStride: the age profile of the engines to evict from is
// estimated from one shard in evictSampleStride. Keys are mixed over the
// shards, so each holds about the same share of every engine's blocks;
// an engine whose keys dodge the sample is still evicted down to its
// quota, only in table order rather than oldest first.
const evictSampleStride = 8

// evictPlan is one namespace's share of an eviction pass: the engines
// over their fair share, how many holder-blocks each must lose, and from
// which generations.
type evictPlan struct {
	slot []int32 // engine id -> index in vs, -1 when not evicted from
	vs   []victim
	// minAge is the youngest age any victim may lose an entry at, so
	// the sweep skips younger blocks without looking at their holders.
	minAge int
}

// victim is an engine to evict from. Its holdings at least all
// generations old go; of those at least some generations old, spare more
// (its quota, less what the older generations are estimated to hold).
type victim struct {
	id uint32
	// e is the engine the plan was made for. An engine removed while the
	// sweep runs frees its id, which a new engine may take: the sweep
	// checks, shard by shard, that the id is still e's (live), and counts
	// what it dropped against e, never against whoever holds the id now.
	e     *engine
	live  bool
	quota int64
	// floor is the engine's fair share: the sweep never takes it below,
	// whatever its quota, as the engine may have shrunk since the plan
	// (a clear): its holdings now, less what the sweep dropped, decide.
	floor   int64
	dropped int64          // holdings dropped, counted against e once the sweep ends
	gone    tierDelta      // the same, by medium
	byAge   [numGens]int64 // sampled holdings by age (generations before now)
	all     int
	some    int
	spare   int64
}

func newEvictPlan(engines int) *evictPlan {
	p := &evictPlan{slot: make([]int32, engines)}
	for i := range p.slot {
		p.slot[i] = -1
	}
	return p
}

func (p *evictPlan) add(e *engine, quota, floor int64) {
	if int(e.id) < len(p.slot) {
		p.slot[e.id] = int32(len(p.vs))
		p.vs = append(p.vs, victim{id: e.id, e: e, live: true, quota: quota, floor: floor})
	}
}

// victim returns engine e's entry in the plan, or nil (also once the id
// is no longer the planned engine's: see victim.e).
func (p *evictPlan) victim(e uint32) *victim {
	if int(e) >= len(p.slot) || p.slot[e] < 0 || !p.vs[p.slot[e]].live {
		return nil
	}
	return &p.vs[p.slot[e]]
}

// recheck marks the victims whose id now belongs to another engine, or
// to none (the planned engine was removed), as no longer live. Called
// with a shard's lock held: an engine's removal clears its entries shard
// by shard under the same locks before its id is freed, so an id found
// still the planned engine's has no other engine's entries in the shard.
func (p *evictPlan) recheck(et *engineTable) {
	for i := range p.vs {
		v := &p.vs[i]
		if v.live && (int(v.id) >= len(et.byID) || et.byID[v.id] != v.e) {
			v.live = false
		}
	}
}

// testHookEvictShard, when set (by tests), runs before each shard of an
// eviction sweep, and with shard -1 once a namespace's plan is made,
// before its victims' ages are sampled; without locks held.
var testHookEvictShard func(shard int)

// cut turns each victim's sampled age profile into the generations it
// loses: the oldest ones that together hold its quota.
func (p *evictPlan) cut() {
	p.minAge = numGens
	for i := range p.vs {
		v := &p.vs[i]
		// Without a profile (too few sampled entries to cover the
		// quota), any age goes, up to the quota.
		v.all, v.some, v.spare = numGens, 0, v.quota
		var acc int64
		for age := numGens - 1; age >= 0; age-- {
			n := v.byAge[age] * evictSampleStride
			if acc+n >= v.quota {
				v.all, v.some, v.spare = age+1, age, v.quota-acc
				break
			}
			acc += n
		}
		p.minAge = min(p.minAge, v.some)
	}
}

// drop reports whether v loses its n holdings in a block age generations
// old, and counts them as dropped (and against its spare).
func (v *victim) drop(age, n int) bool {
	if v.e.holderBlocks.Load()-v.dropped-int64(n) < v.floor {
		return false
	}
	switch {
	case age >= v.all:
	case age >= v.some && v.spare > 0:
		v.spare -= int64(n)
	default:
		return false
	}
	v.dropped += int64(n)
	return true
}

// sampleAges counts, in one shard in evictSampleStride, the victims'
// holdings by age.
func (ns *namespace) sampleAges(p *evictPlan, gen uint64) {
	for si := 0; si < numShards; si += evictSampleStride {
		sh := &ns.shards[si]
		sh.mu.Lock()
		d := sh.data.Load()
		for _, s := range d.slots {
			v := s.val
			if !isLive(v) {
				continue
			}
			age := (gen - valGen(v)) & genMask
			if valKind(v) == kindInline {
				for f := 0; f < 48; f += 16 {
					if id := uint32(v >> f & 0xffff); id != 0 {
						if vc := p.victim(id - 1); vc != nil {
							vc.byAge[age]++
						}
					}
				}
				continue
			}
			hs := &sh.scanHS
			hs.decode(d.arena, v)
			for j := 0; j < len(hs.s); j += 2 {
				for x := hs.s[j+1]; x != 0; x &= x - 1 {
					if vc := p.victim(uint32(hs.s[j])<<6 | uint32(trailingZeros(x))); vc != nil {
						vc.byAge[age]++
					}
				}
			}
			for _, x := range hs.d {
				if vc := p.victim(hEngine(x)); vc != nil {
					vc.byAge[age]++
				}
			}
		}
		sh.mu.Unlock()
	}
}

// evictOver sweeps every shard once, dropping the victims' holdings that
// their plan gives up (other engines' holdings stay, and a block goes
// when its last holder does), then shrinks the emptied tables. It returns
// the holder-blocks dropped.
func (ns *namespace) evictOver(p *evictPlan, gen uint64) uint64 {
	var ids []uint32
	var evicted uint64
	for si := range ns.shards {
		if testHookEvictShard != nil {
			testHookEvictShard(si)
		}
		sh := &ns.shards[si]
		sh.mu.Lock()
		p.recheck(ns.engines.Load())
		d := sh.data.Load()
		// Deleting slot i shifts a later key into it: look at i again.
		// A key that wraps from the table's start to its end is looked
		// at twice, which is harmless: what went is gone.
		for i := 0; i < len(d.slots); {
			sh.beginWrite()
			for end := i + sweepChunk; i < end && i < len(d.slots); {
				d = sh.data.Load()
				v := d.slots[i].val
				age := int((gen - valGen(v)) & genMask)
				if !isLive(v) || age < p.minAge {
					i++
					continue
				}
				if valKind(v) == kindInline {
					nv := v
					for f := 0; f < 48; f += 16 {
						id := uint32(v >> f & 0xffff)
						if vc := p.victim(id - 1); id != 0 && vc != nil && vc.drop(age, 1) {
							nv &^= 0xffff << f
							vc.gone.add(mediumGPU, -1)
							sh.holdings--
							sh.assocs--
							evicted++
						}
					}
					switch {
					case nv == v:
						i++
					case nv&payloadMask == 0:
						sh.deleteAt(d, i, v) // a shifted key may now sit in slot i
					default:
						atomic.StoreUint64(&d.slots[i].val, nv)
						i++
					}
					continue
				}
				hs := sh.decodeW(d, v)
				ids = ids[:0]
				hs.engines(func(e uint32) {
					if p.victim(e) != nil {
						ids = append(ids, e)
					}
				})
				dropped := 0
				for _, e := range ids {
					vc := p.victim(e)
					n := 0
					for _, x := range hs.d {
						if hEngine(x) == e {
							n++
						}
					}
					if hs.hasBit(e) {
						n++
					}
					if !vc.drop(age, n) {
						continue
					}
					hs.removeEngine(e, &vc.gone)
					sh.holdings -= n
					sh.assocs--
					dropped += n
				}
				if dropped == 0 {
					i++
					continue
				}
				evicted += uint64(dropped)
				empty := hs.empty()
				sh.store(i, v, hs, valGen(v))
				if !empty {
					i++
				}
			}
			sh.endWrite()
		}
		// Emptied tables shrink to a compact load, so the bytes go too.
		if d := sh.data.Load(); len(d.slots) > minSlots && float64(sh.used) < evictLoad*float64(len(d.slots)) {
			sh.rebuild(0, evictLoad)
		}
		sh.maybeRebuildRev()
		ns.accountShard(sh)
		sh.mu.Unlock()
	}
	et := ns.engines.Load()
	for k := range p.vs {
		// Counted against the planned engine, unless it was removed
		// meanwhile (its counters count no more): never against another
		// engine that took its id.
		v := &p.vs[k]
		if n, e := v.dropped, v.e; n != 0 && int(v.id) < len(et.byID) && et.byID[v.id] == e {
			e.holderBlocks.Add(-n)
			// The counters exist already (the engine held those
			// media): nothing grows, but were it to, it is counted.
			if grew := e.tiers.add(&v.gone); grew != 0 {
				ns.bytes.Add(grew)
			}
			e.evicted.Add(uint64(n))
		}
	}
	return evicted
}

// shedUnvouched clears the entries kvindex cannot vouch for, until the
// index is within target bytes, and reports whether that was enough:
// first the engines in fallback mode (their hashes did not match
// kvindex's; their maps are not evictable otherwise), then, while some
// healthy engine holds entries they would otherwise push out, the engines
// whose stream is not HealthOK (as Health last said); the largest first
// within each. A cleared engine's matches are lower bounds from then on
// (EngineInfo.Evicted). Without a healthy engine to protect, the
// unhealthy ones are evicted by age like any other.
func (ix *Index) shedUnvouched(target int64) bool {
	type cand struct {
		ns   *namespace
		e    *engine
		tier int // 0: fallback, 1: not healthy
		size int64
	}
	var cands []cand
	protect := false
	for _, ns := range *ix.models.Load() {
		for _, e := range ns.engines.Load().byID {
			if e == nil {
				continue
			}
			tier := -1
			switch {
			case e.fallback.Load() || HashCheck(e.check.Load()) == HashMismatch:
				tier = 0
			case kvevents.Health(e.health.Load()) != kvevents.HealthOK:
				tier = 1
			default:
				protect = protect || e.holderBlocks.Load() > 0
				continue
			}
			e.mu.Lock()
			size := e.extraBytes + e.sampleBytes // the fallback map, digests and kept events
			e.mu.Unlock()
			// Holder-blocks weigh about a table slot each.
			cands = append(cands, cand{ns, e, tier, size + 16*e.holderBlocks.Load()})
		}
	}
	slices.SortFunc(cands, func(a, b cand) int { return cmp.Or(cmp.Compare(a.tier, b.tier), cmp.Compare(b.size, a.size)) })
	for _, c := range cands {
		if ix.bytes() <= target {
			return true
		}
		if c.tier == 1 && !protect {
			break
		}
		c.e.mu.Lock()
		if !c.e.removed && c.e.holderBlocks.Load()+c.e.extraBytes+c.e.sampleBytes > 0 {
			var b batch
			ix.clearEngine(c.ns, c.e, &b)
			b.bytes += c.e.dropSamples() // kept again from its next events
			b.commit(c.ns, c.e)
			// After clearEngine, which counts entries exact again:
			// these were dropped, not cleared by the engine.
			c.e.evicted.Add(uint64(max(-b.holdings, 1)))
			ix.evictions.Add(uint64(-b.holdings))
		}
		c.e.mu.Unlock()
	}
	return ix.bytes() <= target
}

// digestShareDiv: the engines' digest LRUs may keep budget/digestShareDiv
// bytes under pressure (trimDigests).
const digestShareDiv = 8

// trimDigests empties the engines' LRUs of verified digests (the state
// that lets a sampled event be verified against its parent's full hash),
// the largest first, while they hold more than keep bytes together, until
// the index is within target bytes, and reports whether that was enough:
// they are the engines' state beside their entries, rebuilt by the next
// verified events, and emptying them costs only some sampled
// verifications (counted as unverifiable). Within keep they stay: a
// fleet of a few engines keeps verifying under pressure.
func (ix *Index) trimDigests(target, keep int64) bool {
	type cand struct {
		ns   *namespace
		e    *engine
		size int
	}
	var cands []cand
	for _, ns := range *ix.models.Load() {
		for _, e := range ns.engines.Load().byID {
			if e == nil {
				continue
			}
			e.mu.Lock()
			if n := e.digests.Len(); n > 0 {
				cands = append(cands, cand{ns, e, n})
			}
			e.mu.Unlock()
		}
	}
	slices.SortFunc(cands, func(a, b cand) int { return cmp.Compare(b.size, a.size) })
	var total int64
	for _, c := range cands {
		total += int64(c.size) * digestEntryBytes
	}
	for _, c := range cands {
		if ix.bytes() <= target || total <= keep {
			break
		}
		c.e.mu.Lock()
		freed := int64(c.e.digests.Len()) * digestEntryBytes
		total -= freed
		c.e.digests.Purge()
		c.e.extraBytes -= freed
		c.ns.bytes.Add(-freed)
		c.e.mu.Unlock()
	}
	return ix.bytes() <= target
}
