package indexer

import (
	"cmp"
	"slices"

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
// verification (trimDigests). Then every slot carries the generation of its block's last
// store (the Index counts stored blocks; a generation is genSpan of them,
// about a sixteenth of what the budget holds). When Apply finds the index
// over budget, one caller at a time sums the shards' per-generation block
// counts, picks the oldest generations that together free enough to get
// back to 90% of the budget, and sweeps every shard once, dropping those
// blocks with all their holders (least-recently-stored first, at the
// granularity of a generation), then shrinks the emptied tables. The sweep
// works in chunks of slots per write section, so queries are never held up
// for long. Generations wrap after numGens; a block not stored for that
// long looks young again, which only matters if the index stayed under
// budget all that time.

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

// evictPass evicts the oldest generations holding about the share of
// blocks that must go for the index to shrink from cur to target bytes.
func (ix *Index) evictPass(cur, target int64) uint64 {
	models := *ix.models.Load()
	gen := ix.stored.Load() / ix.genSpan & genMask
	var byAge [numGens]int64
	var blocks int64
	for _, ns := range models {
		for si := range ns.shards {
			sh := &ns.shards[si]
			sh.mu.Lock()
			for g, c := range sh.hist {
				byAge[(gen-uint64(g))&genMask] += int64(c)
				blocks += int64(c)
			}
			sh.mu.Unlock()
		}
	}
	if blocks == 0 {
		return 0
	}
	need := int64(float64(blocks) * float64(cur-target) / float64(cur))
	minAge := numGens - 1
	var acc int64
	for ; minAge > 0; minAge-- {
		if acc += byAge[minAge]; acc >= need {
			break
		}
	}
	var evicted uint64
	for _, ns := range models {
		evicted += ns.evictOlder(gen, minAge)
	}
	ix.evictions.Add(evicted)
	return evicted
}

// evictOlder drops every block whose last store is at least minAge
// generations before gen, and returns the holder-blocks dropped.
func (ns *namespace) evictOlder(gen uint64, minAge int) uint64 {
	perEngine := make([]int64, len(ns.engines.Load().byID))
	count := func(e int) {
		if e >= len(perEngine) {
			perEngine = append(perEngine, make([]int64, e+1-len(perEngine))...)
		}
		perEngine[e]++
	}
	var evicted uint64
	for si := range ns.shards {
		sh := &ns.shards[si]
		sh.mu.Lock()
		d := sh.data.Load()
		// Deleting slot i shifts a later key into it: look at i again.
		// A key that wraps from the table's start to its end is looked
		// at twice, which is harmless.
		for i := 0; i < len(d.slots); {
			sh.beginWrite()
			for end := i + sweepChunk; i < end && i < len(d.slots); {
				d = sh.data.Load()
				v := d.slots[i].val
				if !isLive(v) || int((gen-valGen(v))&genMask) < minAge {
					i++
					continue
				}
				hs := sh.decodeW(d, v)
				hs.engines(func(uint32) { sh.assocs-- })
				for j := 0; j < len(hs.s); j += 2 {
					for x := hs.s[j+1]; x != 0; x &= x - 1 {
						count(int(hs.s[j])<<6 | trailingZeros(x))
					}
				}
				for _, x := range hs.d {
					count(int(hEngine(x)))
				}
				n := hs.count()
				hs.reset()
				sh.store(i, v, hs, 0)
				sh.holdings -= n
				evicted += uint64(n)
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
	for id, n := range perEngine {
		if n != 0 && id < len(et.byID) && et.byID[id] != nil {
			et.byID[id].holderBlocks.Add(-n)
			et.byID[id].evicted.Add(uint64(n))
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
			size := e.extraBytes // the fallback map and digests
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
		if !c.e.removed && c.e.holderBlocks.Load()+c.e.extraBytes > 0 {
			var b batch
			ix.clearEngine(c.ns, c.e, &b)
			c.e.holderBlocks.Add(b.holdings)
			c.ns.bytes.Add(b.bytes)
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
