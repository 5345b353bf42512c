package indexer

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
)

// storedChain builds the BlockStored an engine hashing with h would send
// for tokens following parent (nil: block 0 of a sequence), and returns
// the hashes it carries.
func storedChain(t testing.TB, h *blockhash.Hasher, parent *blockhash.Hash, tokens []uint64, x *blockhash.Extras) (kvevents.Event, []blockhash.Hash) {
	t.Helper()
	first := 0
	if parent != nil {
		first = 1 // any non-zero block index: only the salt depends on it
	}
	hashes, err := h.Chain(nil, parent, first, tokens, x)
	if err != nil {
		t.Fatal(err)
	}
	ev := kvevents.Event{Kind: kvevents.BlockStored, TokenIDs: tokens, BlockSize: h.BlockSize()}
	for _, hh := range hashes {
		ev.Hashes = append(ev.Hashes, hh.Key)
	}
	if parent != nil {
		ev.HasParent, ev.Parent = true, parent.Key
	}
	if x != nil {
		ev.LoRAName = x.LoRAName
	}
	return ev, hashes
}

func keysOf(hs []blockhash.Hash) []uint64 {
	var out []uint64
	for _, h := range hs {
		out = append(out, h.Key)
	}
	return out
}

func mustHasher(t testing.TB, algo blockhash.Algo, seed string, bs int) *blockhash.Hasher {
	t.Helper()
	h, err := blockhash.New(blockhash.Config{Algo: algo, Seed: seed, BlockSize: bs})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func engineInfo(t testing.TB, ix *Index, id kvevents.EngineID) EngineInfo {
	t.Helper()
	for _, e := range ix.Engines() {
		if e.Engine == id {
			return e
		}
	}
	t.Fatalf("engine %v unknown", id)
	return EngineInfo{}
}

func TestVerifiedEngine(t *testing.T) {
	h := mustHasher(t, blockhash.SHA256CBOR, "42", 16)
	ix := mustNew(t, Options{Hasher: h})
	a := eng("a", 0)
	toks := testutil.Seq(1000, 16*6)
	lora := &blockhash.Extras{LoRAName: "sql-lora"}
	ev1, h1 := storedChain(t, h, nil, toks[:48], lora)
	// The continuation names its parent by key only: verified through
	// the digests of the first event.
	ev2, h2 := storedChain(t, h, &h1[2], toks[48:], lora)
	// Explicit extra keys, as newer engines send them.
	ev2.ExtraKeys = []blockhash.BlockExtra{{blockhash.Str("sql-lora")}, {blockhash.Str("sql-lora")}, {blockhash.Str("sql-lora")}}
	ix.Apply(a, 1, []kvevents.Event{ev1, ev2})
	info := engineInfo(t, ix, a)
	if info.HashCheck != HashVerified || info.Verified != 6 || info.Mismatches != 0 || info.Fallback || info.Unverifiable != 0 {
		t.Fatalf("info %+v", info)
	}
	res := query(t, ix, &Query{Model: "m", Tokens: append(slices.Clone(toks), 7, 7), Extras: lora})
	if res.BlocksTotal != 6 || res.Pods[0].MatchedBlocks != 6 || res.Pods[0].MatchedTokens != 96 || res.Pods[0].HashCheck != HashVerified {
		t.Errorf("query by tokens: %+v", res)
	}
	// Without the LoRA the chain differs from block 0.
	if res := query(t, ix, &Query{Model: "m", Tokens: toks}); res.Pods[0].MatchedBlocks != 0 {
		t.Errorf("query without LoRA matched %+v", res.Pods)
	}
	got, err := ix.Lookup(&Query{Model: "m", Tokens: toks, Extras: lora})
	if err != nil || len(got) != 6 || got[5].Key != h2[2].Key || len(got[5].Holders) != 1 {
		t.Errorf("lookup: %+v %v", got, err)
	}
}

func TestDigestParents(t *testing.T) {
	// Engines sending 32-byte hashes also send the parent's digest.
	h := mustHasher(t, blockhash.SHA256CBOR, "0", 4)
	ix := mustNew(t, Options{Hasher: h, DigestEntries: 1})
	ev1, h1 := storedChain(t, h, nil, testutil.Seq(0, 8), nil)
	ev2, _ := storedChain(t, h, &h1[1], testutil.Seq(8, 8), nil)
	for _, hh := range h1 {
		ev1.Digests = append(ev1.Digests, slices.Clone(hh.Digest()))
	}
	ev2.ParentDigest = slices.Clone(h1[1].Digest())
	other, _ := storedChain(t, h, nil, testutil.Seq(500, 4), nil) // pushes h1 out of the one-entry digest LRU
	ix.Apply(eng("a", 0), 1, []kvevents.Event{ev1, other, ev2})
	if info := engineInfo(t, ix, eng("a", 0)); info.HashCheck != HashVerified || info.Verified != 5 || info.Unverifiable != 0 {
		t.Errorf("info %+v", info)
	}
	// A digest that is not the engine's is a mismatch.
	ev1.Digests[1][0] ^= 1
	ix.Apply(eng("b", 0), 1, []kvevents.Event{ev1})
	if info := engineInfo(t, ix, eng("b", 0)); info.HashCheck != HashMismatch || info.Mismatches != 1 || info.Verified != 1 {
		t.Errorf("info %+v", info)
	}
}

func TestMismatchedEngineFallsBack(t *testing.T) {
	right := mustHasher(t, blockhash.SHA256CBOR, "0", 16)
	wrong := mustHasher(t, blockhash.SHA256CBOR, "1", 16) // another PYTHONHASHSEED
	ix := mustNew(t, Options{Hasher: right})
	a, b := eng("a", 0), eng("b", 0)
	toks := testutil.Seq(7, 16*8)
	ev1, w1 := storedChain(t, wrong, nil, toks[:16*5], nil)
	ev2, w2 := storedChain(t, wrong, &w1[4], toks[16*5:], nil) // parent by the engine's (wrong) key
	ix.Apply(a, 1, []kvevents.Event{ev1})
	ix.Apply(a, 2, []kvevents.Event{ev2})
	// A correctly configured engine holding the first three blocks.
	evb, _ := storedChain(t, right, nil, toks[:48], nil)
	ix.Apply(b, 1, []kvevents.Event{evb})

	info := engineInfo(t, ix, a)
	if info.HashCheck != HashMismatch || !info.Fallback || info.Mismatches != 5 || info.Dropped != 0 {
		t.Fatalf("info %+v", info)
	}
	if !strings.Contains(info.Message, "hash mismatch: check the engines' prefix-caching hash algorithm and PYTHONHASHSEED against kvindex's") || !strings.Contains(info.Message, "block 0") {
		t.Errorf("message %q", info.Message)
	}
	res := query(t, ix, &Query{Model: "m", Tokens: toks})
	if got := matched(res); !slices.Equal(got, []string{"a:8", "b:3"}) {
		t.Fatalf("routing through fallback keys: %v", got)
	}
	if res.Pods[0].HashCheck != HashMismatch || res.Pods[1].HashCheck != HashVerified {
		t.Errorf("hash checks %+v", res.Pods)
	}
	// The engine's own keys are not in the index.
	if got := matched(query(t, ix, &Query{Model: "m", BlockHashes: keysOf(w1)})); !slices.Equal(got, []string{"a:0", "b:0"}) {
		t.Errorf("engine keys indexed: %v", got)
	}
	// Removals by the engine's keys work.
	ix.Apply(a, 3, []kvevents.Event{removed(w2[0].Key)})
	if got := matched(query(t, ix, &Query{Model: "m", Tokens: toks})); !slices.Equal(got, []string{"a:5", "b:3"}) {
		t.Errorf("after removal: %v", got)
	}
	// A tokenless re-announcement in another medium resolves too.
	ix.Apply(a, 4, []kvevents.Event{{Kind: kvevents.BlockStored, Hashes: keysOf(w1[:2]), BlockSize: 16, Medium: "CPU"}})
	res = query(t, ix, &Query{Model: "m", Tokens: toks, Candidates: []string{"a"}})
	if want := []TierCount{{"GPU", 5}, {"CPU", 2}}; !slices.Equal(res.Pods[0].Tiers, want) {
		t.Errorf("tiers %+v", res.Pods[0].Tiers)
	}
	checkInvariants(t, ix)
	// A child of a block the index never saw cannot be keyed.
	orphan, _ := storedChain(t, wrong, &blockhash.Hash{Key: 12345}, testutil.Seq(900, 32), nil)
	ix.Apply(a, 5, []kvevents.Event{orphan})
	if info := engineInfo(t, ix, a); info.Dropped != 2 {
		t.Errorf("dropped %d, want 2", info.Dropped)
	}
	// Clearing empties the fallback map with the entries.
	ix.Apply(a, 6, []kvevents.Event{{Kind: kvevents.AllBlocksCleared}})
	if info := engineInfo(t, ix, a); info.HolderBlocks != 0 {
		t.Errorf("after clear: %+v", info)
	}
	checkInvariants(t, ix)
	// A restart forgets the verdict; a fixed engine verifies.
	ix.Reset(a, kvevents.ResetRestart)
	if info := engineInfo(t, ix, a); info.HashCheck != HashUnknown || info.Fallback || info.Message != "" {
		t.Errorf("after restart: %+v", info)
	}
	fixed, _ := storedChain(t, right, nil, toks, nil)
	ix.Apply(a, 0, []kvevents.Event{fixed})
	if info := engineInfo(t, ix, a); info.HashCheck != HashVerified {
		t.Errorf("fixed engine: %+v", info)
	}
}

func TestBlockSizeMismatch(t *testing.T) {
	kv := mustHasher(t, blockhash.SHA256CBOR, "0", 16)
	ix := mustNew(t, Options{Hasher: kv})
	toks := testutil.Seq(3, 32*4)
	// The engine caches 32-token blocks: each is two of kvindex's.
	big := mustHasher(t, blockhash.SHA256CBOR, "0", 32)
	ev1, e1 := storedChain(t, big, nil, toks[:64], &blockhash.Extras{LoRAName: "l"})
	ev2, e2 := storedChain(t, big, &e1[1], toks[64:], &blockhash.Extras{LoRAName: "l"})
	ix.Apply(eng("a", 0), 1, []kvevents.Event{ev1, ev2})
	info := engineInfo(t, ix, eng("a", 0))
	if info.HashCheck != HashMismatch || !strings.Contains(info.Message, "block size") || !strings.Contains(info.Message, "32") {
		t.Fatalf("info %+v", info)
	}
	q := &Query{Model: "m", Tokens: toks, Extras: &blockhash.Extras{LoRAName: "l"}}
	if got := matched(query(t, ix, q)); !slices.Equal(got, []string{"a:8"}) {
		t.Errorf("fallback at half the block size: %v", got)
	}
	ix.Apply(eng("a", 0), 2, []kvevents.Event{removed(e2[0].Key)}) // engine block 2 = kvindex blocks 4, 5
	if got := matched(query(t, ix, q)); !slices.Equal(got, []string{"a:4"}) {
		t.Errorf("after removal: %v", got)
	}
	checkInvariants(t, ix)
	// Smaller engine blocks cannot be re-keyed soundly: dropped.
	small := mustHasher(t, blockhash.SHA256CBOR, "0", 8)
	ev, _ := storedChain(t, small, nil, toks[:32], nil)
	ix.Apply(eng("b", 0), 1, []kvevents.Event{ev})
	if info := engineInfo(t, ix, eng("b", 0)); info.HashCheck != HashMismatch || info.Dropped != 4 || info.HolderBlocks != 0 {
		t.Errorf("small blocks: %+v", info)
	}
}

func TestVerificationSampling(t *testing.T) {
	h := mustHasher(t, blockhash.XXHashCBOR, "0", 4)
	ix := mustNew(t, Options{Hasher: h, VerifyFirst: 2, VerifyEvery: 3})
	a := eng("a", 0)
	for i := range 10 {
		ev, _ := storedChain(t, h, nil, testutil.Seq(100*i, 8), nil) // two blocks, no parent
		ix.Apply(a, uint64(i), []kvevents.Event{ev})
	}
	// Events 1, 2 (the first two), then 5 and 8 (one in three).
	if info := engineInfo(t, ix, a); info.Verified != 8 || info.HashCheck != HashVerified {
		t.Errorf("info %+v", info)
	}
	// A sampled event whose parent is unknown defers to the next one.
	ix = mustNew(t, Options{Hasher: h, VerifyFirst: 1, VerifyEvery: 2})
	_, root := storedChain(t, h, nil, testutil.Seq(0, 4), nil)
	var evs []kvevents.Event
	first, _ := storedChain(t, h, nil, testutil.Seq(50, 4), nil)
	evs = append(evs, first)
	orphan, _ := storedChain(t, h, &root[0], testutil.Seq(4, 4), nil) // never-seen parent
	evs = append(evs, orphan, orphan)                                 // event 2 not sampled, 3 sampled but unverifiable
	fresh, _ := storedChain(t, h, nil, testutil.Seq(70, 4), nil)
	evs = append(evs, fresh) // event 4: verified in 3's stead
	ix.Apply(a, 1, evs)
	if info := engineInfo(t, ix, a); info.Verified != 2 || info.Unverifiable != 1 {
		t.Errorf("deferred: %+v", info)
	}
	// Verification off without a Hasher.
	ix = mustNew(t, Options{})
	ix.Apply(a, 1, evs)
	if info := engineInfo(t, ix, a); info.Verified != 0 || info.HashCheck != HashUnknown || info.HolderBlocks != 3 {
		t.Errorf("no hasher: %+v", info)
	}
}

func TestMismatchHints(t *testing.T) {
	h := mustHasher(t, blockhash.SHA256CBOR, "0", 4)
	ix := mustNew(t, Options{Hasher: h})
	// Right tokens and seed, but the engine hashed a LoRA name it does
	// not report: the first block differs.
	ev, _ := storedChain(t, h, nil, testutil.Seq(0, 8), &blockhash.Extras{LoRAName: "x"})
	ev.LoRAName = ""
	ix.Apply(eng("a", 0), 1, []kvevents.Event{ev})
	if info := engineInfo(t, ix, eng("a", 0)); !strings.Contains(info.Message, "algorithm or seed") {
		t.Errorf("message %q", info.Message)
	}
	// Extra keys that differ from block 1 on.
	ev, _ = storedChain(t, h, nil, testutil.Seq(0, 8), nil)
	ev.ExtraKeys = []blockhash.BlockExtra{nil, {blockhash.Str("salt")}}
	ix.Apply(eng("b", 0), 1, []kvevents.Event{ev})
	if info := engineInfo(t, ix, eng("b", 0)); !strings.Contains(info.Message, "extra keys") || info.Verified != 1 || info.Mismatches != 1 {
		t.Errorf("info %+v", info)
	}
}

// A mismatched engine flooding the index never pushes a verified engine's
// entries out: over budget, the engines in fallback mode are cleared
// first (their fallback maps with their entries), and are partial from
// then on.
func TestBudgetShedsMismatchedEnginesFirst(t *testing.T) {
	const budget = 1 << 20
	right := mustHasher(t, blockhash.SHA256CBOR, "0", 16)
	wrong := mustHasher(t, blockhash.SHA256CBOR, "1", 16)
	ix := mustNew(t, Options{Hasher: right, MemoryBudget: budget})
	good, bad := eng("good", 0), eng("bad", 0)
	evg, _ := storedChain(t, right, nil, testutil.Seq(7, 16*64), nil)
	ix.Apply(good, 1, []kvevents.Event{evg})
	for i := 0; ix.Stats().Evictions == 0; i++ {
		if i == 20_000 {
			t.Fatal("no eviction")
		}
		ev, _ := storedChain(t, wrong, nil, testutil.Seq(1<<30+i*16*64, 16*64), nil)
		ix.Apply(bad, uint64(i+1), []kvevents.Event{ev})
	}
	if info := engineInfo(t, ix, bad); !info.Fallback || info.Evicted == 0 {
		t.Errorf("the mismatched engine: %+v, want in fallback mode and evicted", info)
	}
	if info := engineInfo(t, ix, good); info.Evicted != 0 || info.HolderBlocks != 64 {
		t.Errorf("the verified engine: %+v, want its 64 blocks, none evicted", info)
	}
	if st := ix.Stats(); st.Bytes > budget {
		t.Errorf("%d bytes over the budget of %d", st.Bytes, budget)
	}
	checkInvariants(t, ix)
}

// Over budget, an engine whose stream is not healthy is shed before a
// healthy engine loses an entry; without a healthy engine to protect,
// the engines are evicted by fair share as usual: the flooding one loses
// its oldest entries, the small one none.
func TestBudgetShedsUnhealthyEnginesFirst(t *testing.T) {
	const budget = 1 << 20
	h := mustHasher(t, blockhash.SHA256CBOR, "0", 16)
	flood := func(ix *Index, e kvevents.EngineID) {
		for i := 0; ix.Stats().Evictions == 0; i++ {
			if i == 20_000 {
				t.Fatal("no eviction")
			}
			ev, _ := storedChain(t, h, nil, testutil.Seq(1<<30+i*16*64, 16*64), nil)
			ix.Apply(e, uint64(i+1), []kvevents.Event{ev})
		}
	}
	good, shaky := eng("good", 0), eng("shaky", 0)
	ix := mustNew(t, Options{Hasher: h, MemoryBudget: budget})
	ix.Health(shaky, kvevents.HealthUnconfirmed)
	evg, _ := storedChain(t, h, nil, testutil.Seq(7, 16*64), nil)
	ix.Apply(good, 1, []kvevents.Event{evg})
	flood(ix, shaky)
	if info := engineInfo(t, ix, shaky); info.Evicted == 0 {
		t.Errorf("the unhealthy engine: %+v, want evicted", info)
	}
	if info := engineInfo(t, ix, good); info.Evicted != 0 || info.HolderBlocks != 64 {
		t.Errorf("the healthy engine: %+v, want its 64 blocks, none evicted", info)
	}
	checkInvariants(t, ix)

	// Both unhealthy: the flooding engine, over its fair share, loses
	// entries; the small one keeps its own, though they are the oldest.
	ix = mustNew(t, Options{Hasher: h, MemoryBudget: budget})
	ix.Health(good, kvevents.HealthDegraded)
	ix.Health(shaky, kvevents.HealthUnconfirmed)
	ix.Apply(good, 1, []kvevents.Event{evg})
	flood(ix, shaky)
	if info := engineInfo(t, ix, good); info.Evicted != 0 || info.HolderBlocks != 64 {
		t.Errorf("without a healthy engine, the small engine: %+v, want its 64 blocks, none evicted", info)
	}
	if info := engineInfo(t, ix, shaky); info.Evicted == 0 {
		t.Errorf("without a healthy engine, the flooding engine: %+v, want evicted", info)
	}
	if info := engineInfo(t, ix, shaky); info.HolderBlocks == 0 {
		t.Errorf("without a healthy engine, the flooding engine was cleared whole: %+v", info)
	}
	checkInvariants(t, ix)
}

// Many engines' digest LRUs, state beside their entries, stay within the
// budget: over it, the largest are emptied before any entry is evicted,
// down to an eighth of the budget.
func TestBudgetTrimsDigests(t *testing.T) {
	// The entries take about 3.6 MB, the digests 3 MB more.
	const budget = 6 << 20
	h := mustHasher(t, blockhash.SHA256CBOR, "0", 16)
	ix := mustNew(t, Options{Hasher: h, MemoryBudget: budget})
	// 300 engines of 64 blocks each: their entries fit, their digests
	// (up to DefaultDigestEntries each) do not.
	for p := range 300 {
		ev, _ := storedChain(t, h, nil, testutil.Seq(p*16*64, 16*64), nil)
		ix.Apply(eng(fmt.Sprintf("pod-%03d", p), 0), 1, []kvevents.Event{ev})
	}
	st := ix.Stats()
	if st.Bytes > budget {
		t.Errorf("%d bytes over the budget of %d", st.Bytes, budget)
	}
	if st.Evictions != 0 {
		t.Errorf("%d entries evicted while the digests could go", st.Evictions)
	}
	for _, e := range ix.Engines() {
		if e.Evicted != 0 || e.HolderBlocks != 64 {
			t.Fatalf("engine %+v lost entries", e)
		}
	}
	checkInvariants(t, ix)
}
