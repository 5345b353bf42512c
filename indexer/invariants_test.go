package indexer

import (
	"slices"
	"testing"
	"unsafe"
)

// checkInvariants verifies the internal bookkeeping of every shard against
// the slots themselves. Call it while no Apply runs.
func checkInvariants(t testing.TB, ix *Index) {
	t.Helper()
	for _, ns := range *ix.models.Load() {
		et := ns.engines.Load()
		perEngine := make([]int64, len(et.byID))
		perMedium := make([]map[int]int64, len(et.byID)) // engine id -> medium id -> holdings
		var shardBytes int64
		for si := range ns.shards {
			sh := &ns.shards[si]
			sh.mu.Lock()
			d := sh.data.Load()
			used, holdings, recWords := 0, 0, 0
			var hist [numGens]int32
			assocs := 0
			var hs holderSet
			for i, s := range d.slots {
				if valKind(s.val) == kindEmpty {
					if s.val != 0 {
						t.Fatalf("shard %d slot %d: empty kind with value %#x", si, i, s.val)
					}
					continue
				}
				used++
				hist[valGen(s.val)]++
				if got := d.find(s.key, mixKey(s.key)); got != i {
					t.Fatalf("shard %d: key %d at slot %d found at %d", si, s.key, i, got)
				}
				if !hs.decode(d.arena, s.val) || hs.empty() {
					t.Fatalf("shard %d slot %d: undecodable or empty holders", si, i)
				}
				if valKind(s.val) == kindRecord {
					recWords += 1 << uint8(d.arena[uint32(s.val)]>>32)
					if _, ok := hs.inline(); ok {
						t.Fatalf("shard %d slot %d: record that fits inline", si, i)
					}
				}
				for _, x := range hs.d {
					if hRefs(x) == 0 || hGroup(x) == 0 && hMedium(x) == mediumGPU && hRefs(x) == 1 {
						t.Fatalf("shard %d slot %d: non-canonical detail holding %#x", si, i, x)
					}
				}
				holdings += hs.count()
				for _, x := range hs.holdings(nil) {
					if e := hEngine(x); int(e) < len(perEngine) {
						perEngine[e]++
						if perMedium[e] == nil {
							perMedium[e] = map[int]int64{}
						}
						perMedium[e][hMedium(x)]++
					} else {
						t.Fatalf("shard %d slot %d: unknown engine %d", si, i, e)
					}
				}
				p := placeBits(mixKey(s.key))
				hs.engines(func(e uint32) {
					assocs++
					if int(e) >= len(sh.rev) || !slices.Contains(sh.rev[e], p) {
						t.Fatalf("shard %d slot %d: engine %d missing from its reverse list", si, i, e)
					}
				})
			}
			if used != sh.used || holdings != sh.holdings || recWords != sh.recWords || hist != sh.hist {
				t.Fatalf("shard %d: counted used %d holdings %d recWords %d, shard says %d %d %d (hist equal %v)",
					si, used, holdings, recWords, sh.used, sh.holdings, sh.recWords, hist == sh.hist)
			}
			if assocs != sh.assocs {
				t.Fatalf("shard %d: %d associations, shard says %d", si, assocs, sh.assocs)
			}
			revCap, revLen, freeCap := 0, 0, 0
			for _, r := range sh.rev {
				revCap += cap(r)
				revLen += len(r)
			}
			for _, f := range sh.free {
				freeCap += cap(f)
			}
			if revCap != sh.revCap || revLen != sh.revLen || freeCap != sh.freeCap || revLen > 2*assocs+256 {
				t.Fatalf("shard %d: revCap %d/%d revLen %d/%d (assocs %d) freeCap %d/%d", si, revCap, sh.revCap, revLen, sh.revLen, assocs, freeCap, sh.freeCap)
			}
			shardBytes += sh.bytes
			sh.mu.Unlock()
		}
		var engBytes int64
		for id, e := range et.byID {
			if e == nil {
				if perEngine[id] != 0 {
					t.Fatalf("model %s: free engine id %d holds %d blocks", ns.model, id, perEngine[id])
				}
				continue
			}
			if got := e.holderBlocks.Load(); got != perEngine[id] {
				t.Fatalf("engine %v: counter %d, holds %d", e.eid, got, perEngine[id])
			}
			checkTiers(t, ns, e, perMedium[id])
			engBytes += e.bytes() + e.extraBytes + e.sampleBytes
		}
		if want := int64(unsafe.Sizeof(*ns)) + shardBytes + engBytes; ns.bytes.Load() != want {
			t.Fatalf("model %s: bytes %d, structures add up to %d", ns.model, ns.bytes.Load(), want)
		}
	}
}

// checkTiers verifies engine e's per-medium counters against a recount
// of its holdings by medium id (held) and against its holder-block
// counter.
func checkTiers(t testing.TB, ns *namespace, e *engine, held map[int]int64) {
	t.Helper()
	counters := e.tiers.load()
	var sum int64
	for m, c := range counters {
		if got := c.Load(); got != held[m] {
			t.Fatalf("engine %v: %d holdings in medium %q, counter says %d", e.eid, held[m], ns.media.name(m), got)
		}
		sum += c.Load()
	}
	for m, n := range held {
		if m >= len(counters) {
			t.Fatalf("engine %v: %d holdings in medium %q, which has no counter", e.eid, n, ns.media.name(m))
		}
	}
	if sum != e.holderBlocks.Load() {
		t.Fatalf("engine %v: media counters add up to %d, holder-blocks %d", e.eid, sum, e.holderBlocks.Load())
	}
	if len(counters) > len(*ns.media.names.Load()) {
		t.Fatalf("engine %v: %d media counters, the model has %d media", e.eid, len(counters), len(*ns.media.names.Load()))
	}
}
