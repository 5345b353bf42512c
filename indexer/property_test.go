package indexer

import (
	"bytes"
	"cmp"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
)

// refModel is the deliberately simple reference: per engine, per block
// key, a map from (group, medium) to a reference count.
type refModel struct {
	engines map[kvevents.EngineID]map[uint64]map[refHolding]int
}

type refHolding struct {
	group  int
	medium string
}

func newRefModel() *refModel {
	return &refModel{engines: map[kvevents.EngineID]map[uint64]map[refHolding]int{}}
}

func normMedium(m string) string {
	if m == "" {
		return kvevents.MediumGPU
	}
	return m
}

// apply mirrors Index.Apply for well-formed events without verification.
func (r *refModel) apply(id kvevents.EngineID, events []kvevents.Event) {
	if r.engines[id] == nil {
		r.engines[id] = map[uint64]map[refHolding]int{}
	}
	blocks := r.engines[id]
	for _, ev := range events {
		h := refHolding{ev.GroupIdx, normMedium(ev.Medium)}
		switch ev.Kind {
		case kvevents.BlockStored:
			for _, k := range ev.Hashes {
				if blocks[k] == nil {
					blocks[k] = map[refHolding]int{}
				}
				blocks[k][h]++
			}
		case kvevents.BlockRemoved:
			for _, k := range ev.Hashes {
				if blocks[k][h] > 0 {
					blocks[k][h]--
					if blocks[k][h] == 0 {
						delete(blocks[k], h)
						if len(blocks[k]) == 0 {
							delete(blocks, k)
						}
					}
				}
			}
		case kvevents.AllBlocksCleared:
			clear(blocks)
		}
	}
}

func (r *refModel) reset(id kvevents.EngineID) {
	if blocks := r.engines[id]; blocks != nil {
		clear(blocks)
	}
}

func (r *refModel) removeEngine(id kvevents.EngineID) { delete(r.engines, id) }

func (r *refModel) holdings(id kvevents.EngineID) int {
	n := 0
	for _, hs := range r.engines[id] {
		n += len(hs)
	}
	return n
}

// tiers returns the engine's holdings by medium, as EngineInfo.Tiers
// lists them: media holding nothing left out, in the order ids (the order
// the model first saw each medium) gives.
func (r *refModel) tiers(id kvevents.EngineID, ids func(string) int) []TierCount {
	n := map[string]int{}
	for _, hs := range r.engines[id] {
		for h := range hs {
			n[h.medium]++
		}
	}
	var out []TierCount
	for m, c := range n {
		out = append(out, TierCount{Medium: m, Blocks: c})
	}
	slices.SortFunc(out, func(a, b TierCount) int { return cmp.Compare(ids(a.Medium), ids(b.Medium)) })
	return out
}

func (r *refModel) longestPrefix(model string, keys []uint64, pods []string, bs int) Result {
	res := Result{BlocksTotal: len(keys), BlockSize: bs}
	for id, blocks := range r.engines {
		if id.Model != model || len(pods) > 0 && !slices.Contains(pods, id.Pod) {
			continue
		}
		pm := PodMatch{Engine: id}
		tiers := map[string]int{}
		for _, k := range keys {
			if len(blocks[k]) == 0 {
				break
			}
			pm.MatchedBlocks++
			media := map[string]bool{}
			for h := range blocks[k] {
				media[h.medium] = true
			}
			for m := range media {
				tiers[m]++
			}
		}
		pm.MatchedTokens = pm.MatchedBlocks * bs
		if n := tiers[kvevents.MediumGPU]; n > 0 {
			pm.Tiers = append(pm.Tiers, TierCount{kvevents.MediumGPU, n})
		}
		var others []TierCount
		for m, n := range tiers {
			if m != kvevents.MediumGPU {
				others = append(others, TierCount{m, n})
			}
		}
		slices.SortFunc(others, func(a, b TierCount) int { return cmp.Compare(a.Medium, b.Medium) })
		pm.Tiers = append(pm.Tiers, others...)
		res.Pods = append(res.Pods, pm)
	}
	slices.SortFunc(res.Pods, comparePods)
	return res
}

func (r *refModel) lookup(model string, keys []uint64) []BlockHolders {
	out := make([]BlockHolders, len(keys))
	for i, k := range keys {
		out[i] = BlockHolders{Index: i, Key: k}
		for id, blocks := range r.engines {
			if id.Model != model {
				continue
			}
			for h, refs := range blocks[k] {
				out[i].Holders = append(out[i].Holders, Holder{Engine: id, Medium: h.medium, GroupIdx: h.group, Refs: refs})
			}
		}
		slices.SortFunc(out[i].Holders, func(a, b Holder) int {
			return cmp.Or(compareEngineID(a.Engine, b.Engine), cmp.Compare(a.GroupIdx, b.GroupIdx), cmp.Compare(a.Medium, b.Medium))
		})
	}
	return out
}

// normalise makes nil and empty slices compare equal.
func normalise(r Result) Result {
	for i := range r.Pods {
		if len(r.Pods[i].Tiers) == 0 {
			r.Pods[i].Tiers = nil
		}
		r.Pods[i].HashCheck = 0
	}
	if len(r.Pods) == 0 {
		r.Pods = nil
	}
	return r
}

// propWorld generates the random workload: models with engines, chains of
// keys (some real hash chains of tokens), and per-engine event streams.
type propWorld struct {
	rng     *rand.Rand
	hasher  *blockhash.Hasher
	models  []string
	engines map[string][]kvevents.EngineID
	chains  map[string][][]uint64 // per model: key chains
	tokens  map[string][][]uint64 // per model: token prompts behind real chains (same index as chains)
}

const tokModel = "tok"

func newPropWorld(seed uint64, h *blockhash.Hasher) *propWorld {
	w := &propWorld{
		rng:     rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		hasher:  h,
		models:  []string{"small", "wide", tokModel},
		engines: map[string][]kvevents.EngineID{},
		chains:  map[string][][]uint64{},
		tokens:  map[string][][]uint64{},
	}
	sizes := map[string][2]int{"small": {3, 2}, "wide": {40, 2}, tokModel: {4, 1}}
	for _, m := range w.models {
		for p := range sizes[m][0] {
			for r := range sizes[m][1] {
				w.engines[m] = append(w.engines[m], kvevents.EngineID{Model: m, Pod: fmt.Sprintf("%s-pod%02d", m, p), DPRank: r})
			}
		}
	}
	// Key chains sharing prefixes, like prompts sharing system prompts.
	for _, m := range []string{"small", "wide"} {
		for range 12 {
			var c []uint64
			if len(w.chains[m]) > 0 && w.rng.IntN(2) == 0 {
				base := w.chains[m][w.rng.IntN(len(w.chains[m]))]
				c = slices.Clone(base[:w.rng.IntN(len(base)+1)])
			}
			for range 4 + w.rng.IntN(14) {
				c = append(c, w.rng.Uint64()%5000) // small key space: collisions across chains
			}
			w.chains[m] = append(w.chains[m], c)
		}
	}
	// Real hash chains for token queries.
	bs := h.BlockSize()
	for range 6 {
		var toks []uint64
		if len(w.tokens[tokModel]) > 0 && w.rng.IntN(2) == 0 {
			base := w.tokens[tokModel][w.rng.IntN(len(w.tokens[tokModel]))]
			toks = slices.Clone(base[:bs*w.rng.IntN(len(base)/bs+1)])
		}
		for range (3 + w.rng.IntN(8)) * bs {
			toks = append(toks, uint64(w.rng.IntN(1000)))
		}
		hashes, err := h.Chain(nil, nil, 0, toks, nil)
		if err != nil {
			panic(err)
		}
		keys := make([]uint64, len(hashes))
		for i := range hashes {
			keys[i] = hashes[i].Key
		}
		w.chains[tokModel] = append(w.chains[tokModel], keys)
		w.tokens[tokModel] = append(w.tokens[tokModel], toks)
	}
	return w
}

// op is one step of an engine's stream.
type op struct {
	kind   int // 0 apply, 1 reset restart, 2 remove engine
	id     kvevents.EngineID
	events []kvevents.Event
}

// engineOps generates n operations for one engine.
func (w *propWorld) engineOps(id kvevents.EngineID, n int) []op {
	var ops []op
	media := []string{"", "GPU", "CPU", "STORAGE"}
	bs := w.hasher.BlockSize()
	type heldBlock struct {
		key    uint64
		group  int
		medium string
	}
	var held []heldBlock
	for range n {
		switch x := w.rng.IntN(100); {
		case x < 2:
			ops = append(ops, op{kind: 1, id: id})
			held = held[:0]
		case x < 3:
			ops = append(ops, op{kind: 2, id: id})
			held = held[:0]
		default:
			var evs []kvevents.Event
			for range 1 + w.rng.IntN(3) {
				switch y := w.rng.IntN(100); {
				case y < 60:
					ci := w.rng.IntN(len(w.chains[id.Model]))
					c := w.chains[id.Model][ci]
					a := w.rng.IntN(len(c))
					b := a + 1 + w.rng.IntN(len(c)-a)
					if w.rng.IntN(3) == 0 {
						a = 0 // stores usually start at block 0 of a prompt
					}
					ev := kvevents.Event{Kind: kvevents.BlockStored, Hashes: slices.Clone(c[a:b]), BlockSize: bs}
					if w.rng.IntN(4) == 0 {
						ev.Medium = media[w.rng.IntN(len(media))]
					}
					if w.rng.IntN(6) == 0 {
						ev.GroupIdx = 1 + w.rng.IntN(2)
					}
					if id.Model == tokModel {
						toks := w.tokens[tokModel][ci]
						ev.TokenIDs = slices.Clone(toks[a*bs : b*bs])
						if a > 0 {
							ev.HasParent, ev.Parent = true, c[a-1]
						}
					}
					evs = append(evs, ev)
					for _, k := range ev.Hashes {
						held = append(held, heldBlock{k, ev.GroupIdx, ev.Medium})
					}
				case y < 95:
					if len(held) == 0 {
						continue
					}
					// Remove one or two held blocks (sometimes one never held).
					ev := kvevents.Event{Kind: kvevents.BlockRemoved}
					for range 1 + w.rng.IntN(2) {
						i := w.rng.IntN(len(held))
						h := held[i]
						held = slices.Delete(held, i, i+1)
						ev.Hashes = []uint64{h.key}
						ev.GroupIdx, ev.Medium = h.group, h.medium
						if w.rng.IntN(20) == 0 {
							ev.Hashes[0] ^= 1 << 40
						}
						evs = append(evs, ev)
						if len(held) == 0 {
							break
						}
					}
				default:
					evs = append(evs, kvevents.Event{Kind: kvevents.AllBlocksCleared})
					held = held[:0]
				}
			}
			ops = append(ops, op{kind: 0, id: id, events: evs})
		}
	}
	return ops
}

func (w *propWorld) query() (model string, keys []uint64, toks []uint64, pods []string) {
	model = w.models[w.rng.IntN(len(w.models))]
	ci := w.rng.IntN(len(w.chains[model]))
	c := w.chains[model][ci]
	if model == tokModel && w.rng.IntN(3) > 0 {
		toks = w.tokens[model][ci]
		if w.rng.IntN(2) == 0 {
			// A partial trailing block is ignored.
			toks = append(slices.Clone(toks), 1, 2, 3)
		}
		keys = c
	} else {
		keys = slices.Clone(c[:1+w.rng.IntN(len(c))])
		if w.rng.IntN(4) == 0 {
			keys = append(keys, w.rng.Uint64()%5000)
		}
	}
	if w.rng.IntN(3) == 0 {
		for _, e := range w.engines[model] {
			if w.rng.IntN(3) == 0 && !slices.Contains(pods, e.Pod) {
				pods = append(pods, e.Pod)
			}
		}
		if w.rng.IntN(5) == 0 {
			pods = append(pods, "no-such-pod")
		}
	}
	return model, keys, toks, pods
}

func applyOp(ix *Index, ref *refModel, o op) {
	switch o.kind {
	case 0:
		ix.Apply(o.id, 0, o.events)
		if ref != nil {
			ref.apply(o.id, o.events)
		}
	case 1:
		ix.Reset(o.id, kvevents.ResetRestart)
		if ref != nil {
			ref.reset(o.id)
		}
	case 2:
		ix.RemoveEngine(o.id)
		if ref != nil {
			ref.removeEngine(o.id)
		}
	}
}

func checkAgainstRef(t *testing.T, ix *Index, ref *refModel, w *propWorld, queries int) {
	t.Helper()
	checkInvariants(t, ix)
	var res Result
	for qi := range queries {
		model, keys, toks, pods := w.query()
		q := &Query{Model: model, Candidates: pods}
		if toks != nil {
			q.Tokens = toks
		} else {
			q.BlockHashes = keys
		}
		if err := ix.LongestPrefix(q, &res); err != nil {
			t.Fatalf("query %d: %v", qi, err)
		}
		want := ref.longestPrefix(model, keys, pods, w.hasher.BlockSize())
		if got := normalise(res); !reflect.DeepEqual(got, normalise(want)) {
			t.Fatalf("query %d (model %s, %d keys, tokens %v, pods %v): %s", qi, model, len(keys), toks != nil, pods, diffResults(got, normalise(want)))
		}
		if qi%4 == 0 {
			got, err := ix.Lookup(&Query{Model: model, BlockHashes: keys})
			if err != nil {
				t.Fatal(err)
			}
			if want := ref.lookup(model, keys); !reflect.DeepEqual(got, want) {
				t.Fatalf("lookup %d (model %s):\n got %+v\nwant %+v", qi, model, got, want)
			}
		}
	}
	// Totals agree too.
	var holdings int64
	for id := range ref.engines {
		holdings += int64(ref.holdings(id))
	}
	if st := ix.Stats(); st.HolderBlocks != holdings || st.Engines != len(ref.engines) {
		t.Fatalf("stats %+v, reference has %d holdings, %d engines", st, holdings, len(ref.engines))
	}
	var perEngine int64
	for _, e := range ix.Engines() {
		perEngine += e.HolderBlocks
		if want := int64(ref.holdings(e.Engine)); e.HolderBlocks != want {
			t.Fatalf("engine %v: %d holder-blocks, reference %d", e.Engine, e.HolderBlocks, want)
		}
		checkEngineTiers(t, ix, ref, e)
	}
	if perEngine != holdings {
		t.Fatalf("engines sum to %d holder-blocks, want %d", perEngine, holdings)
	}
}

// checkRestore restores a snapshot of ix into a fresh index and checks
// that the copy's engines hold as many blocks, by medium too.
func checkRestore(t testing.TB, ix *Index) {
	t.Helper()
	var buf bytes.Buffer
	if err := ix.Snapshot(&buf); err != nil {
		t.Fatal(err)
	}
	cp := mustNew(t, Options{})
	if err := cp.Restore(&buf); err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, cp)
	want, got := ix.Engines(), cp.Engines()
	if len(got) != len(want) {
		t.Fatalf("restored %d engines, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].Engine != want[i].Engine || got[i].HolderBlocks != want[i].HolderBlocks || !reflect.DeepEqual(got[i].Tiers, want[i].Tiers) {
			t.Fatalf("restored engine %v holds %d %v, want %v: %d %v", got[i].Engine, got[i].HolderBlocks, got[i].Tiers, want[i].Engine, want[i].HolderBlocks, want[i].Tiers)
		}
	}
}

// checkEngineTiers compares an engine's holder-blocks by medium with the
// reference's.
func checkEngineTiers(t testing.TB, ix *Index, ref *refModel, e EngineInfo) {
	t.Helper()
	ns := ix.namespace(e.Engine.Model, false)
	ids := func(m string) int {
		id, ok := ns.media.lookup(m)
		if !ok {
			t.Fatalf("engine %v: the reference holds blocks in medium %q, unknown to the index", e.Engine, m)
		}
		return id
	}
	if want := ref.tiers(e.Engine, ids); !reflect.DeepEqual(e.Tiers, want) {
		t.Fatalf("engine %v: holder-blocks by medium %v, reference %v", e.Engine, e.Tiers, want)
	}
}

func testHasher(t testing.TB) *blockhash.Hasher {
	t.Helper()
	h, err := blockhash.New(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestPropertyAgainstReference(t *testing.T) {
	seeds := uint64(4)
	if raceEnabled || testing.Short() {
		seeds = 1
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			w := newPropWorld(seed, testHasher(t))
			ix, err := New(Options{Hasher: w.hasher, VerifyFirst: 8, VerifyEvery: 3})
			if err != nil {
				t.Fatal(err)
			}
			ref := newRefModel()
			var all []op
			for _, m := range w.models {
				for _, id := range w.engines[m] {
					all = append(all, w.engineOps(id, 60)...)
				}
			}
			// Interleave engines' streams randomly (each stays in order).
			perEngine := map[kvevents.EngineID][]op{}
			var order []kvevents.EngineID
			for _, o := range all {
				if perEngine[o.id] == nil {
					order = append(order, o.id)
				}
				perEngine[o.id] = append(perEngine[o.id], o)
			}
			for step := 0; len(order) > 0; step++ {
				i := w.rng.IntN(len(order))
				id := order[i]
				applyOp(ix, ref, perEngine[id][0])
				perEngine[id] = perEngine[id][1:]
				if len(perEngine[id]) == 0 {
					order = slices.Delete(order, i, i+1)
				}
				if step%100 == 0 {
					checkAgainstRef(t, ix, ref, w, 20)
				}
			}
			checkAgainstRef(t, ix, ref, w, 200)
			checkRestore(t, ix)
			for _, e := range ix.Engines() {
				if e.Malformed != 0 || e.Mismatches != 0 || e.Dropped != 0 {
					t.Errorf("engine %v: %+v", e.Engine, e)
				}
				if e.Engine.Model == tokModel && (e.HashCheck == HashMismatch || e.Verified > 0 && e.HashCheck != HashVerified) {
					t.Errorf("engine %v: %+v", e.Engine, e)
				}
			}
		})
	}
}

// TestPropertyConcurrent applies every engine's stream from its own
// goroutine while other goroutines query, then compares with the
// reference (the final state does not depend on how engines interleave).
func TestPropertyConcurrent(t *testing.T) {
	w := newPropWorld(99, testHasher(t))
	ix, err := New(Options{Hasher: w.hasher, VerifyFirst: 4, VerifyEvery: 2})
	if err != nil {
		t.Fatal(err)
	}
	ref := newRefModel()
	streams := map[kvevents.EngineID][]op{}
	for _, m := range w.models {
		for _, id := range w.engines[m] {
			streams[id] = w.engineOps(id, 80)
		}
	}
	for _, ops := range streams {
		for _, o := range ops {
			switch o.kind {
			case 0:
				ref.apply(o.id, o.events)
			case 1:
				ref.reset(o.id)
			case 2:
				ref.removeEngine(o.id)
			}
		}
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	queryErr := make(chan error, 4)
	for g := range 3 {
		qw := newPropWorld(99, w.hasher) // same chains, own random stream
		qw.rng = rand.New(rand.NewPCG(uint64(g), 7))
		wg.Go(func() {
			var res Result
			for {
				select {
				case <-stop:
					return
				default:
				}
				model, keys, toks, pods := qw.query()
				q := &Query{Model: model, Candidates: pods, BlockHashes: keys}
				if toks != nil {
					q.BlockHashes, q.Tokens = nil, toks
				}
				if err := ix.LongestPrefix(q, &res); err != nil {
					queryErr <- err
					return
				}
				if err := sane(&res, len(keys)); err != nil {
					queryErr <- err
					return
				}
				if _, err := ix.Lookup(&Query{Model: model, BlockHashes: keys}); err != nil {
					queryErr <- err
					return
				}
				ix.Stats()
			}
		})
	}
	var apply sync.WaitGroup
	for _, ops := range streams {
		apply.Go(func() {
			for _, o := range ops {
				applyOp(ix, nil, o)
			}
		})
	}
	apply.Wait()
	close(stop)
	wg.Wait()
	close(queryErr)
	for err := range queryErr {
		t.Fatal(err)
	}
	checkAgainstRef(t, ix, ref, w, 200)
}

// sane checks what any answer, even one racing ingest, must satisfy.
func sane(res *Result, n int) error {
	if res.BlocksTotal != n {
		return fmt.Errorf("BlocksTotal %d, want %d", res.BlocksTotal, n)
	}
	for i, p := range res.Pods {
		if p.MatchedBlocks < 0 || p.MatchedBlocks > n || p.MatchedTokens != p.MatchedBlocks*res.BlockSize {
			return fmt.Errorf("pod %+v out of range", p)
		}
		if i > 0 && comparePods(res.Pods[i-1], p) > 0 {
			return fmt.Errorf("pods not sorted: %+v", res.Pods)
		}
		for _, tc := range p.Tiers {
			if tc.Blocks <= 0 || tc.Blocks > p.MatchedBlocks {
				return fmt.Errorf("pod %+v: bad tier", p)
			}
		}
	}
	return nil
}

// diffResults describes how two results differ, pod by pod.
func diffResults(got, want Result) string {
	var out string
	if got.BlocksTotal != want.BlocksTotal || got.BlockSize != want.BlockSize {
		out += fmt.Sprintf("totals got %d/%d want %d/%d; ", got.BlocksTotal, got.BlockSize, want.BlocksTotal, want.BlockSize)
	}
	if len(got.Pods) != len(want.Pods) {
		out += fmt.Sprintf("%d pods, want %d; ", len(got.Pods), len(want.Pods))
	}
	for i := range min(len(got.Pods), len(want.Pods)) {
		if !reflect.DeepEqual(got.Pods[i], want.Pods[i]) {
			out += fmt.Sprintf("\n  pod %d got %+v\n        want %+v", i, got.Pods[i], want.Pods[i])
		}
	}
	return out
}

// TestPropertyFairShare floods the index far past its memory budget from
// some engines while small engines (each well within a fair share of the
// budget) store and remove blocks at random, some of them blocks the
// flooders also hold, some in other groups and media: the small engines
// must keep exactly what they hold (by the reference) and never be
// flagged evicted, the flooders alone pay for the budget.
func TestPropertyFairShare(t *testing.T) {
	const budget = 4 << 20
	// Holder-blocks a small engine may hold: its share of the budget at
	// a pessimistic 64 bytes each (the index's fixed structures and the
	// reverse lists' slack take a good part of a small budget).
	smallCap := func(share float64) int { return int(share * budget / 64) }
	cases := []struct {
		name     string
		flooders int
		smalls   int
		share    float64 // of the budget, per small engine
		shared   bool    // flooders also store the small engines' keys
		media    bool    // small engines also hold blocks in CPU, group 1
	}{
		{"one flooder, one small engine at 5%", 1, 1, 0.05, false, false},
		{"one flooder sharing small engines' blocks", 1, 4, 0.03, true, false},
		{"two flooders, small engines in other media", 2, 3, 0.04, false, true},
		{"three flooders sharing, many small engines", 3, 8, 0.01, true, true},
	}
	for ci, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(ci), 7))
			ix := mustNew(t, Options{MemoryBudget: budget})
			ref := newRefModel()
			var floods, smalls []kvevents.EngineID
			for i := range tc.flooders {
				floods = append(floods, eng(fmt.Sprintf("flood-%d", i), 0))
			}
			pools := map[kvevents.EngineID][]uint64{}
			for i := range tc.smalls {
				id := eng(fmt.Sprintf("small-%d", i), i%2)
				smalls = append(smalls, id)
				for k := range 2 * smallCap(tc.share) {
					pools[id] = append(pools[id], uint64(i+1)<<40|uint64(k))
				}
			}
			smallOp := func(id kvevents.EngineID) {
				pool := pools[id]
				keys := make([]uint64, 1+rng.IntN(32))
				for j := range keys {
					keys[j] = pool[rng.IntN(len(pool))]
				}
				medium, group := "", 0
				if tc.media && rng.IntN(3) == 0 {
					medium, group = "CPU", 1
				}
				ev := storedIn(medium, group, keys...)
				if rng.IntN(2) == 0 || ref.holdings(id)+len(keys) > smallCap(tc.share) {
					ev = removedIn(medium, group, keys...)
				}
				ix.Apply(id, 0, []kvevents.Event{ev})
				ref.apply(id, []kvevents.Event{ev})
			}
			check := func(step int) {
				t.Helper()
				checkInvariants(t, ix)
				for _, id := range smalls {
					info := engineInfo(t, ix, id)
					if want := int64(ref.holdings(id)); info.HolderBlocks != want || info.Evicted != 0 {
						t.Fatalf("step %d: small engine %v holds %d (reference %d), evicted %d", step, id, info.HolderBlocks, want, info.Evicted)
					}
					checkEngineTiers(t, ix, ref, info)
					var keys []uint64
					for k := range ref.engines[id] {
						keys = append(keys, k)
					}
					got, err := ix.Lookup(&Query{Model: "m", BlockHashes: keys})
					if err != nil {
						t.Fatal(err)
					}
					want := ref.lookup("m", keys)
					for i := range got {
						got[i].Holders = slices.DeleteFunc(got[i].Holders, func(h Holder) bool { return h.Engine != id })
						want[i].Holders = slices.DeleteFunc(want[i].Holders, func(h Holder) bool { return h.Engine != id })
					}
					if !reflect.DeepEqual(got, want) {
						t.Fatalf("step %d: small engine %v's blocks differ from the reference", step, id)
					}
				}
			}
			// The small engines' entries are the oldest: least recently
			// stored, they would go first by age alone.
			for _, id := range smalls {
				ev := stored(pools[id][:smallCap(tc.share)/2]...)
				ix.Apply(id, 0, []kvevents.Event{ev})
				ref.apply(id, []kvevents.Event{ev})
			}
			// The flooders store ten budgets' worth of new blocks (at 24
			// bytes a holder-block), three under the race detector.
			budgets := 10
			if raceEnabled || testing.Short() {
				budgets = 3
			}
			next := uint64(1) << 56
			var flooded int
			for step := 0; flooded < budgets*budget/24; step++ {
				if len(smalls) > 0 && rng.IntN(4) == 0 {
					smallOp(smalls[rng.IntN(len(smalls))])
				} else {
					keys := testutil.Seq(int(next), 256)
					next += 256
					if tc.shared && len(smalls) > 0 {
						pool := pools[smalls[rng.IntN(len(smalls))]]
						for j := range 16 {
							keys[j] = pool[rng.IntN(len(pool))]
						}
					}
					ev := stored(keys...)
					if tc.media && rng.IntN(4) == 0 {
						// Not the simple (GPU, group 0) form: evicted
						// from the holders' records.
						ev = storedIn("CPU", 0, keys...)
					}
					ix.Apply(floods[rng.IntN(len(floods))], 0, []kvevents.Event{ev})
					flooded += len(keys)
				}
				if step%3000 == 0 {
					check(step)
				}
			}
			check(-1)
			st := ix.Stats()
			if st.Evictions == 0 || st.Bytes > budget {
				t.Fatalf("stats %+v over a budget of %d", st, budget)
			}
			for _, id := range floods {
				if info := engineInfo(t, ix, id); info.Evicted == 0 || info.HolderBlocks == 0 {
					t.Errorf("flooder %v: %+v, want evicted (partial) but holding entries", id, info)
				}
			}
			if tc.media {
				for _, id := range floods {
					if info := engineInfo(t, ix, id); len(info.Tiers) != 2 {
						t.Errorf("flooder %v holds blocks by medium %v, want GPU and CPU", id, info.Tiers)
					}
				}
			}
			// What eviction left restores to the same counts.
			checkRestore(t, ix)
		})
	}
}

// TestPropertyConcurrentEviction has engines store, remove and clear
// from goroutines of their own, in several media and groups, over a
// budget that keeps eviction (which changes an engine's counters without
// its lock) running beside their Apply (which adds counters for media
// new to the engine), while other goroutines read the engines' counts.
// Afterwards the counts per engine and medium must equal a recount of
// what the index holds.
func TestPropertyConcurrentEviction(t *testing.T) {
	const budget = 2 << 20
	ix := mustNew(t, Options{MemoryBudget: budget})
	batches := 400
	if raceEnabled || testing.Short() {
		batches = 120
	}
	media := []string{"", "CPU", "DISK", "NVME", "REMOTE"}
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for range 2 {
		readers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ix.Engines() // mid-flight counts prove nothing: read for the race detector
			}
		})
	}
	var writers sync.WaitGroup
	for w := range 6 {
		writers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			id := eng(fmt.Sprintf("e%d", w), w%2)
			next := uint64(w+1) << 48
			for i := range batches {
				var evs []kvevents.Event
				// Media new to the engine arrive over time.
				medium := media[rng.IntN(min(len(media), 1+i/20))]
				keys := testutil.Seq(int(next), 128)
				next += 128
				if rng.IntN(3) == 0 {
					// Shared keys: blocks several engines hold.
					keys = testutil.Seq(1, 64)
				}
				evs = append(evs, storedIn(medium, rng.IntN(2), keys...))
				if rng.IntN(4) == 0 {
					evs = append(evs, removedIn(medium, 0, keys[:16]...))
				}
				if rng.IntN(50) == 0 {
					evs = append(evs, kvevents.Event{Kind: kvevents.AllBlocksCleared})
				}
				ix.Apply(id, uint64(i), evs)
			}
		})
	}
	writers.Wait()
	close(stop)
	readers.Wait()
	checkInvariants(t, ix)
	if st := ix.Stats(); st.Evictions == 0 {
		t.Fatalf("no eviction over a budget of %d: %+v", budget, st)
	}
	// Every engine stored after its last clear, and eviction takes none
	// below its fair share: each holds blocks. Eviction may leave one
	// that stopped storing early (its entries the oldest) with a single
	// medium; most must hold several.
	several := 0
	var held []string
	for _, e := range ix.Engines() {
		if e.HolderBlocks == 0 {
			t.Errorf("engine %v holds nothing: evicted below its fair share (%+v)", e.Engine, e)
		}
		if len(e.Tiers) >= 2 {
			several++
		}
		held = append(held, fmt.Sprintf("%v: %v", e.Engine, e.Tiers))
	}
	if several < 3 {
		t.Errorf("%d of 6 engines hold blocks in several media (%s): the test meant several media", several, strings.Join(held, "; "))
	}
}

// TestFairLevel checks the max-min fair share against its definition:
// the sizes capped at the level fit the capacity, and one more would not.
func TestFairLevel(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	capped := func(sizes []int64, l int64) (sum int64) {
		for _, s := range sizes {
			sum += min(s, l)
		}
		return sum
	}
	for range 2000 {
		sizes := make([]int64, 1+rng.IntN(8))
		var total int64
		for i := range sizes {
			sizes[i] = 1 + rng.Int64N(1000)
			total += sizes[i]
		}
		capacity := rng.Int64N(total + 100)
		l := fairLevel(sizes, capacity)
		if capped(sizes, l) > capacity && l > 0 || capacity < total && capped(sizes, l+1) <= capacity {
			t.Fatalf("fairLevel(%v, %d) = %d", sizes, capacity, l)
		}
		if capacity >= total && l != slices.Max(sizes) {
			t.Fatalf("fairLevel(%v, %d) = %d, want the largest size (all fit)", sizes, capacity, l)
		}
	}
}
