package indexer

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
)

func eng(pod string, rank int) kvevents.EngineID {
	return kvevents.EngineID{Model: "m", Pod: pod, DPRank: rank}
}

func stored(keys ...uint64) kvevents.Event {
	return kvevents.Event{Kind: kvevents.BlockStored, Hashes: keys, BlockSize: 16}
}

func storedIn(medium string, group int, keys ...uint64) kvevents.Event {
	ev := stored(keys...)
	ev.Medium, ev.GroupIdx = medium, group
	return ev
}

func removed(keys ...uint64) kvevents.Event {
	return kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: keys}
}

func removedIn(medium string, group int, keys ...uint64) kvevents.Event {
	ev := removed(keys...)
	ev.Medium, ev.GroupIdx = medium, group
	return ev
}

func mustNew(t testing.TB, opts Options) *Index {
	t.Helper()
	ix, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return ix
}

func query(t testing.TB, ix *Index, q *Query) Result {
	t.Helper()
	var res Result
	if err := ix.LongestPrefix(q, &res); err != nil {
		t.Fatal(err)
	}
	return res
}

// matched summarises a result as "pod/rank:blocks" in result order.
func matched(res Result) []string {
	var out []string
	for _, p := range res.Pods {
		out = append(out, fmt.Sprintf("%s:%d", p.Engine, p.MatchedBlocks))
	}
	return out
}

func TestLongestPrefixBasics(t *testing.T) {
	ix := mustNew(t, Options{})
	ix.Apply(eng("a", 0), 1, []kvevents.Event{stored(1, 2, 3, 4)})
	ix.Apply(eng("b", 0), 1, []kvevents.Event{stored(1, 2)})
	ix.Apply(eng("b", 1), 1, []kvevents.Event{stored(1, 2, 3)})
	ix.Apply(eng("c", 0), 1, []kvevents.Event{stored(2, 3, 4)}) // no block 0: useless
	ix.Apply(eng("cold", 0), 1, nil)
	tests := []struct {
		name  string
		keys  []uint64
		cands []string
		want  []string
	}{
		{"full", []uint64{1, 2, 3, 4, 5}, nil, []string{"a:4", "b/1:3", "b:2", "c:0", "cold:0"}},
		{"first block only", []uint64{1, 9}, nil, []string{"a:1", "b:1", "b/1:1", "c:0", "cold:0"}},
		{"unknown first", []uint64{9, 1, 2}, nil, []string{"a:0", "b:0", "b/1:0", "c:0", "cold:0"}},
		{"candidates: every rank of a pod", []uint64{1, 2, 3}, []string{"b"}, []string{"b/1:3", "b:2"}},
		{"candidates: unknown pod ignored", []uint64{1, 2, 3}, []string{"zz", "c", "c"}, []string{"c:0"}},
		{"empty query", nil, nil, []string{"a:0", "b:0", "b/1:0", "c:0", "cold:0"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := query(t, ix, &Query{Model: "m", BlockHashes: tc.keys, Candidates: tc.cands})
			if got := matched(res); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			if res.BlocksTotal != len(tc.keys) || res.BlockSize != 16 {
				t.Errorf("totals %d/%d", res.BlocksTotal, res.BlockSize)
			}
			for _, p := range res.Pods {
				if p.MatchedTokens != 16*p.MatchedBlocks {
					t.Errorf("%v: %d tokens for %d blocks", p.Engine, p.MatchedTokens, p.MatchedBlocks)
				}
			}
		})
	}
	// An unknown model is an empty answer, not an error.
	if res := query(t, ix, &Query{Model: "other", BlockHashes: []uint64{1}}); len(res.Pods) != 0 || res.BlocksTotal != 1 {
		t.Errorf("unknown model: %+v", res)
	}
}

func TestQueryErrors(t *testing.T) {
	ix := mustNew(t, Options{})
	var res Result
	err := ix.LongestPrefix(&Query{Model: "m", Tokens: []uint64{1, 2, 3}}, &res)
	if !errors.Is(err, ErrNoHasher) {
		t.Fatalf("tokens without a Hasher: %v", err)
	}
	if _, err := ix.Lookup(&Query{Model: "m", Tokens: []uint64{1}}); !errors.Is(err, ErrNoHasher) {
		t.Fatalf("lookup: %v", err)
	}
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 16})
	ix = mustNew(t, Options{Hasher: h})
	ix.Apply(eng("a", 0), 1, []kvevents.Event{stored(1)})
	// Empty BlockHashes: the tokens count.
	res = query(t, ix, &Query{Model: "m", Tokens: testutil.Seq(0, 40), BlockHashes: []uint64{}})
	if res.BlocksTotal != 2 || !slices.Equal(matched(res), []string{"a:0"}) {
		t.Errorf("empty BlockHashes: %+v", res)
	}
	res = query(t, ix, &Query{Model: "m", Tokens: testutil.Seq(0, 15)}) // no full block
	if res.BlocksTotal != 0 || res.BlockSize != 16 || !slices.Equal(matched(res), []string{"a:0"}) {
		t.Errorf("partial block: %+v", res)
	}
	// SGLang hashing has no extra keys: the hasher's error surfaces.
	sg := blockhash.MustNew(blockhash.Config{Algo: blockhash.SGLang, BlockSize: 16})
	ix = mustNew(t, Options{Hasher: sg})
	ix.Apply(eng("a", 0), 1, []kvevents.Event{stored(1)})
	err = ix.LongestPrefix(&Query{Model: "m", Tokens: testutil.Seq(0, 32), Extras: &blockhash.Extras{LoRAName: "x"}}, &res)
	if !errors.Is(err, blockhash.ErrUnsupported) {
		t.Errorf("sglang with extras: %v", err)
	}
	for _, o := range []Options{{MemoryBudget: -1}, {VerifyFirst: -1}, {VerifyEvery: -2}, {MemoEntries: -1}, {DigestEntries: -1}} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
}

func TestTiersGroupsRefcounts(t *testing.T) {
	type want struct {
		blocks int
		tiers  []TierCount
	}
	tests := []struct {
		name   string
		events []kvevents.Event
		want   want
	}{
		{"gpu", []kvevents.Event{stored(1, 2, 3)}, want{3, []TierCount{{"GPU", 3}}}},
		{"explicit GPU medium", []kvevents.Event{storedIn("GPU", 0, 1, 2, 3)}, want{3, []TierCount{{"GPU", 3}}}},
		{"cpu only", []kvevents.Event{storedIn("CPU", 0, 1, 2)}, want{2, []TierCount{{"CPU", 2}}}},
		{"gpu then cpu offload of a prefix", []kvevents.Event{stored(1, 2, 3), storedIn("CPU", 0, 1, 2)},
			want{3, []TierCount{{"GPU", 3}, {"CPU", 2}}}},
		{"mixed media chain", []kvevents.Event{storedIn("CPU", 0, 1), stored(2), storedIn("STORAGE", 0, 3)},
			want{3, []TierCount{{"GPU", 1}, {"CPU", 1}, {"STORAGE", 1}}}},
		{"group 1 counts as held", []kvevents.Event{storedIn("", 1, 1, 2)}, want{2, []TierCount{{"GPU", 2}}}},
		{"two groups count once", []kvevents.Event{stored(1, 2), storedIn("", 1, 1, 2), storedIn("CPU", 1, 1), storedIn("CPU", 2, 1)},
			want{2, []TierCount{{"GPU", 2}, {"CPU", 1}}}},
		{"refcount: stored twice removed once", []kvevents.Event{stored(1, 2), stored(1, 2), removed(2)}, want{2, []TierCount{{"GPU", 2}}}},
		{"refcount: stored twice removed twice", []kvevents.Event{stored(1, 2), stored(1, 2), removed(2), removed(2)}, want{1, []TierCount{{"GPU", 1}}}},
		{"remove in another medium keeps gpu", []kvevents.Event{stored(1, 2), storedIn("CPU", 0, 2), removedIn("CPU", 0, 2)},
			want{2, []TierCount{{"GPU", 2}}}},
		{"remove in another group keeps group 0", []kvevents.Event{stored(1, 2), storedIn("", 3, 2), removedIn("", 3, 2), removedIn("", 3, 2)},
			want{2, []TierCount{{"GPU", 2}}}},
		{"gpu evicted, cpu copy remains", []kvevents.Event{stored(1, 2), storedIn("CPU", 0, 2), removed(2)},
			want{2, []TierCount{{"GPU", 1}, {"CPU", 1}}}},
		{"cleared", []kvevents.Event{stored(1, 2), storedIn("CPU", 0, 1), {Kind: kvevents.AllBlocksCleared}}, want{0, nil}},
		{"cleared then stored", []kvevents.Event{stored(1, 2), {Kind: kvevents.AllBlocksCleared}, stored(1)}, want{1, []TierCount{{"GPU", 1}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ix := mustNew(t, Options{})
			ix.Apply(eng("a", 0), 1, tc.events)
			// Another engine holding everything must not change a's answer.
			ix.Apply(eng("b", 0), 1, []kvevents.Event{stored(1, 2, 3), storedIn("CPU", 0, 1, 2, 3)})
			res := query(t, ix, &Query{Model: "m", BlockHashes: []uint64{1, 2, 3}, Candidates: []string{"a"}})
			if len(res.Pods) != 1 {
				t.Fatalf("pods %+v", res.Pods)
			}
			p := res.Pods[0]
			if p.MatchedBlocks != tc.want.blocks || !reflect.DeepEqual(slices.Clip(p.Tiers), tc.want.tiers) && len(p.Tiers)+len(tc.want.tiers) > 0 {
				t.Errorf("got %d %v, want %d %v", p.MatchedBlocks, p.Tiers, tc.want.blocks, tc.want.tiers)
			}
			checkInvariants(t, ix)
		})
	}
}

// TestEngineTiers follows one engine's holder-blocks by medium
// (EngineInfo.Tiers) through the operations that change them; each step
// starts from the state the previous ones left.
func TestEngineTiers(t *testing.T) {
	a := eng("a", 0)
	apply := func(evs ...kvevents.Event) func(*Index) {
		return func(ix *Index) { ix.Apply(a, 1, evs) }
	}
	steps := []struct {
		name string
		do   func(*Index)
		want []TierCount
	}{
		{"stored", apply(stored(1, 2, 3), storedIn("CPU", 0, 1, 2), storedIn("DISK", 1, 9)), []TierCount{{"GPU", 3}, {"CPU", 2}, {"DISK", 1}}},
		{"removed", apply(removed(3), removedIn("CPU", 0, 1)), []TierCount{{"GPU", 2}, {"CPU", 1}, {"DISK", 1}}},
		{"a second group and a second reference", apply(storedIn("CPU", 1, 2), stored(1)), []TierCount{{"GPU", 2}, {"CPU", 2}, {"DISK", 1}}},
		{"a medium emptied is left out", apply(removedIn("DISK", 1, 9)), []TierCount{{"GPU", 2}, {"CPU", 2}}},
		{"restored from a snapshot", func(ix *Index) {
			var buf bytes.Buffer
			if err := ix.Snapshot(&buf); err != nil {
				t.Fatal(err)
			}
			if err := ix.Restore(&buf); err != nil {
				t.Fatal(err)
			}
		}, []TierCount{{"GPU", 2}, {"CPU", 2}}},
		{"cleared", apply(kvevents.Event{Kind: kvevents.AllBlocksCleared}), nil},
		{"stored again, the model's media order kept", apply(storedIn("DISK", 0, 4), storedIn("CPU", 0, 4)), []TierCount{{"CPU", 1}, {"DISK", 1}}},
		{"reset", func(ix *Index) { ix.Reset(a, kvevents.ResetRestart) }, nil},
		{"stored after the reset", apply(stored(5)), []TierCount{{"GPU", 1}}},
	}
	ix := mustNew(t, Options{})
	// Another engine's holdings in the same blocks and media stay apart.
	ix.Apply(eng("b", 0), 1, []kvevents.Event{stored(1, 2, 3, 4, 5), storedIn("CPU", 0, 1, 2, 4)})
	for _, st := range steps {
		st.do(ix)
		info := engineInfo(t, ix, a)
		if !reflect.DeepEqual(info.Tiers, st.want) {
			t.Fatalf("%s: tiers %v, want %v", st.name, info.Tiers, st.want)
		}
		if b := engineInfo(t, ix, eng("b", 0)); !reflect.DeepEqual(b.Tiers, []TierCount{{"GPU", 5}, {"CPU", 3}}) {
			t.Fatalf("%s: the other engine's tiers %v", st.name, b.Tiers)
		}
		checkInvariants(t, ix)
	}
	ix.RemoveEngine(a)
	checkInvariants(t, ix)
}

func TestLookupHolders(t *testing.T) {
	ix := mustNew(t, Options{})
	ix.Apply(eng("b", 1), 1, []kvevents.Event{stored(1, 2), stored(2), storedIn("CPU", 0, 2), storedIn("", 3, 1)})
	ix.Apply(eng("a", 0), 1, []kvevents.Event{stored(1)})
	got, err := ix.Lookup(&Query{Model: "m", BlockHashes: []uint64{1, 2, 3}})
	if err != nil {
		t.Fatal(err)
	}
	want := []BlockHolders{
		{Index: 0, Key: 1, Holders: []Holder{
			{Engine: eng("a", 0), Medium: "GPU", Refs: 1},
			{Engine: eng("b", 1), Medium: "GPU", Refs: 1},
			{Engine: eng("b", 1), Medium: "GPU", GroupIdx: 3, Refs: 1},
		}},
		{Index: 1, Key: 2, Holders: []Holder{
			{Engine: eng("b", 1), Medium: "CPU", Refs: 1},
			{Engine: eng("b", 1), Medium: "GPU", Refs: 2},
		}},
		{Index: 2, Key: 3},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	got, _ = ix.Lookup(&Query{Model: "m", BlockHashes: []uint64{1}, Candidates: []string{"a"}})
	if len(got[0].Holders) != 1 || got[0].Holders[0].Engine.Pod != "a" {
		t.Errorf("candidates: %+v", got)
	}
	got, _ = ix.Lookup(&Query{Model: "nope", BlockHashes: []uint64{7}})
	if len(got) != 1 || got[0].Key != 7 || got[0].Holders != nil {
		t.Errorf("unknown model: %+v", got)
	}
}

// TestManyHolders crosses the inline limit (three holders) and the
// 64-engine bitmap word, in both directions.
func TestManyHolders(t *testing.T) {
	ix := mustNew(t, Options{})
	chain := testutil.Seq(100, 40)
	var all []string
	for i := range 200 {
		id := eng(fmt.Sprintf("p%03d", i), 0)
		n := len(chain) - i%7 // staggered depths
		ix.Apply(id, 1, []kvevents.Event{stored(chain[:n]...)})
		all = append(all, fmt.Sprintf("p%03d:%d", i, n))
	}
	checkInvariants(t, ix)
	res := query(t, ix, &Query{Model: "m", BlockHashes: chain})
	got := matched(res)
	slices.Sort(got)
	slices.Sort(all)
	if !slices.Equal(got, all) {
		t.Fatalf("got %v", got)
	}
	if res.Pods[0].MatchedBlocks != 40 || res.Pods[len(res.Pods)-1].MatchedBlocks != 34 {
		t.Errorf("order: first %+v last %+v", res.Pods[0], res.Pods[len(res.Pods)-1])
	}
	// Everyone but three engines leaves: blocks go back inline.
	for i := 3; i < 200; i++ {
		ix.Apply(eng(fmt.Sprintf("p%03d", i), 0), 2, []kvevents.Event{removed(chain...)})
	}
	checkInvariants(t, ix)
	ns := ix.namespace("m", false)
	for _, k := range chain[:34] {
		h := mixKey(k)
		sh := &ns.shards[shardIndex(h)]
		d := sh.data.Load()
		if v := d.slots[d.find(k, h)].val; valKind(v) != kindInline {
			t.Fatalf("key %d: kind %d with three holders", k, valKind(v))
		}
	}
	res = query(t, ix, &Query{Model: "m", BlockHashes: chain, Candidates: []string{"p000", "p001", "p002", "p150"}})
	if got := matched(res); !slices.Equal(got, []string{"p000:40", "p001:39", "p002:38", "p150:0"}) {
		t.Errorf("after removals: %v", got)
	}
	if st := ix.Stats(); st.HolderBlocks != 40+39+38 || st.Blocks != 40 || st.Engines != 200 {
		t.Errorf("stats %+v", st)
	}
}

// keysInShard returns n keys that land in the given shard.
func keysInShard(shard, n int) []uint64 {
	var out []uint64
	for k := uint64(1); len(out) < n; k++ {
		if shardIndex(mixKey(k)) == shard {
			out = append(out, k)
		}
	}
	return out
}

// TestChurnKeepsStructuresBounded stores and removes blocks of one shard
// over and over: tombstones, reverse lists and the arena must not grow
// without bound.
func TestChurnKeepsStructuresBounded(t *testing.T) {
	ix := mustNew(t, Options{})
	keys := keysInShard(7, 400)
	a, b := eng("a", 0), eng("b", 0)
	for round := range 30 {
		batch := keys[(round*37)%300 : (round*37)%300+100]
		ix.Apply(a, uint64(round), []kvevents.Event{stored(batch...), stored(batch[:50]...), storedIn("CPU", 0, batch[:10]...)})
		ix.Apply(b, uint64(round), []kvevents.Event{stored(batch[:60]...)})
		checkInvariants(t, ix)
		ix.Apply(a, uint64(round), []kvevents.Event{removed(batch...), removed(batch[:50]...), removedIn("CPU", 0, batch[:10]...)})
		ix.Apply(b, uint64(round), []kvevents.Event{removed(batch[:60]...)})
	}
	checkInvariants(t, ix)
	sh := &ix.namespace("m", false).shards[7]
	d := sh.data.Load()
	if sh.used != 0 || len(d.slots) > 4*minSlots || len(sh.rev[0]) > 2*256+100 || len(d.arena) > 1024 {
		t.Errorf("after churn: used %d, %d slots, rev %d, arena %d", sh.used, len(d.slots), len(sh.rev[0]), len(d.arena))
	}
	if st := ix.Stats(); st.HolderBlocks != 0 || st.Blocks != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestResetIsolation(t *testing.T) {
	for _, reason := range []kvevents.ResetReason{kvevents.ResetRestart, kvevents.ResetCleared, kvevents.ResetRemoved, "event", "remove-engine"} {
		t.Run(string(reason), func(t *testing.T) {
			ix := mustNew(t, Options{})
			other := mustNew(t, Options{})
			chain := testutil.Seq(1, 300)
			for _, ix := range []*Index{ix, other} {
				ix.Apply(eng("b", 0), 1, []kvevents.Event{stored(chain...), storedIn("CPU", 2, chain[:30]...)})
				ix.Apply(eng("c", 1), 1, []kvevents.Event{stored(chain[:100]...)})
				ix.Apply(kvevents.EngineID{Model: "m2", Pod: "a"}, 1, []kvevents.Event{stored(chain...)})
			}
			a := eng("a", 0)
			ix.Apply(a, 1, []kvevents.Event{stored(chain...), stored(chain[:10]...), storedIn("CPU", 1, chain...)})
			switch reason {
			case "event":
				ix.Apply(a, 2, []kvevents.Event{{Kind: kvevents.AllBlocksCleared}})
			case "remove-engine":
				ix.RemoveEngine(a)
			default:
				ix.Reset(a, reason)
			}
			checkInvariants(t, ix)
			if ix.Digest() != other.Digest() {
				t.Errorf("content differs from an index that never saw engine a")
			}
			gone := reason == kvevents.ResetRemoved || reason == "remove-engine"
			res := query(t, ix, &Query{Model: "m", BlockHashes: chain})
			want := []string{"b:300", "c/1:100", "a:0"}
			if gone {
				want = want[:2]
			}
			if got := matched(res); !slices.Equal(got, want) {
				t.Errorf("got %v, want %v", got, want)
			}
			// The engine comes back with its next batch.
			ix.Apply(a, 3, []kvevents.Event{stored(chain[:5]...)})
			if got := matched(query(t, ix, &Query{Model: "m", BlockHashes: chain, Candidates: []string{"a"}})); !slices.Equal(got, []string{"a:5"}) {
				t.Errorf("after return: %v", got)
			}
			checkInvariants(t, ix)
		})
	}
}

func TestHostileEventsIgnored(t *testing.T) {
	long := make([]byte, maxMediumLen+1)
	for i := range long {
		long[i] = 'x'
	}
	tests := []struct {
		name string
		ev   kvevents.Event
	}{
		{"no hashes", kvevents.Event{Kind: kvevents.BlockStored, BlockSize: 16}},
		{"block size 0", kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{5}}},
		{"negative block size", kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{5}, BlockSize: -16}},
		{"huge block size", kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{5}, BlockSize: 1 << 40}},
		{"tokens vs hashes", kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{5, 6}, BlockSize: 2, TokenIDs: []uint64{1, 2, 3}}},
		{"tokens vs block size", kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{5}, BlockSize: 4, TokenIDs: []uint64{1, 2, 3, 4, 5}}},
		{"extra keys length", kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{5, 6}, BlockSize: 16, ExtraKeys: []blockhash.BlockExtra{nil}}},
		{"digests length", kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{5, 6}, BlockSize: 16, Digests: [][]byte{{1}}}},
		{"negative group", kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{5}, BlockSize: 16, GroupIdx: -1}},
		{"huge group", kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{5}, BlockSize: 16, GroupIdx: 1 << 20}},
		{"medium name too long", kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{5}, BlockSize: 16, Medium: string(long)}},
		{"medium name not UTF-8", kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{5}, BlockSize: 16, Medium: "CPU\xff"}},
		{"remove nothing", kvevents.Event{Kind: kvevents.BlockRemoved}},
		{"remove bad group", kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: []uint64{1}, GroupIdx: -3}},
		{"unknown kind", kvevents.Event{Kind: 99, Hashes: []uint64{1}}},
	}
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 2})
	for _, hasher := range []*blockhash.Hasher{nil, h} {
		for _, tc := range tests {
			t.Run(fmt.Sprintf("%s/hasher=%v", tc.name, hasher != nil), func(t *testing.T) {
				ix := mustNew(t, Options{Hasher: hasher})
				a := eng("a", 0)
				ix.Apply(a, 1, []kvevents.Event{stored(1, 2, 3)})
				before := ix.Digest()
				ix.Apply(a, 2, []kvevents.Event{tc.ev})
				if ix.Digest() != before {
					t.Errorf("content changed")
				}
				info := ix.Engines()[0]
				if info.Malformed != 1 {
					t.Errorf("malformed %d, want 1 (%+v)", info.Malformed, info)
				}
				checkInvariants(t, ix)
			})
		}
	}
	// Media beyond the table's capacity are refused, the rest applied.
	ix := mustNew(t, Options{})
	var evs []kvevents.Event
	for i := range maxMedia + 10 {
		evs = append(evs, storedIn(fmt.Sprintf("tier%d", i), 0, uint64(i)))
	}
	ix.Apply(eng("a", 0), 1, evs)
	if info := ix.Engines()[0]; info.Malformed != 11 || info.HolderBlocks != maxMedia-1 {
		t.Errorf("media overflow: %+v", info)
	}
	checkInvariants(t, ix)
	// Removals of blocks never stored only count.
	ix.Apply(eng("a", 0), 2, []kvevents.Event{removed(12345), removedIn("NEVER", 0, 1)})
	if info := ix.Engines()[0]; info.RemoveMisses != 2 {
		t.Errorf("remove misses: %+v", info)
	}
}

// TestEvictionEngineReplacedMidSweep: the engine an eviction sweep
// evicts from is removed halfway through the sweep, and a new engine
// takes its id and stores. The sweep must leave the newcomer's entries
// alone and count nothing it dropped against the newcomer: its counts
// stay equal to what the index holds of it.
func TestEvictionEngineReplacedMidSweep(t *testing.T) {
	ix := mustNew(t, Options{MemoryBudget: 2 << 20})
	small, flood, newcomer := eng("small", 0), eng("flood", 0), eng("newcomer", 0)
	ix.Apply(small, 0, []kvevents.Event{stored(testutil.Seq(1, 500)...)})
	newKeys := testutil.Seq(1<<40, 300)
	var floodID, newID uint32
	fired := false
	testHookEvictShard = func(shard int) {
		if fired || shard != numShards/2 {
			return
		}
		fired = true
		floodID = ix.namespace("m", false).engine(flood.Pod, flood.DPRank).id
		ix.RemoveEngine(flood)
		ix.Apply(newcomer, 0, []kvevents.Event{storedIn("CPU", 0, newKeys...)})
		newID = ix.namespace("m", false).engine(newcomer.Pod, newcomer.DPRank).id
	}
	t.Cleanup(func() { testHookEvictShard = nil })
	next := 1 << 32
	for i := 0; !fired && i < 10000; i++ {
		ix.Apply(flood, uint64(i), []kvevents.Event{stored(testutil.Seq(next, 500)...)})
		next += 500
	}
	if !fired {
		t.Fatal("no eviction sweep ran")
	}
	if newID != floodID {
		t.Fatalf("the newcomer has id %d, the removed engine had %d: the test proves nothing", newID, floodID)
	}
	checkInvariants(t, ix)
	for _, e := range ix.Engines() {
		if e.Engine == newcomer && (e.HolderBlocks != int64(len(newKeys)) || e.Evicted != 0) {
			t.Errorf("the newcomer holds %d blocks, %d evicted; want %d, none", e.HolderBlocks, e.Evicted, len(newKeys))
		}
	}
	if got := matched(query(t, ix, &Query{Model: "m", BlockHashes: newKeys})); !slices.Contains(got, "newcomer:300") {
		t.Errorf("the newcomer's blocks: %v", got)
	}
}

// TestEvictionEngineClearedBeforeSweep: the engine an eviction pass plans
// to evict from (the one over its fair share) clears its cache and stores
// a few new blocks after the plan is made, before the sweep: it is now far
// below its share and must keep them all, though the plan's quota is
// larger than all it holds.
func TestEvictionEngineClearedBeforeSweep(t *testing.T) {
	ix := mustNew(t, Options{MemoryBudget: 2 << 20})
	small, flood := eng("small", 0), eng("flood", 0)
	ix.Apply(small, 0, []kvevents.Event{stored(testutil.Seq(1, 500)...)})
	newKeys := testutil.Seq(1<<40, 300)
	fired := false
	seq := uint64(0)
	testHookEvictShard = func(shard int) {
		if fired || shard != -1 {
			return
		}
		fired = true
		ix.Apply(flood, seq, []kvevents.Event{{Kind: kvevents.AllBlocksCleared}, storedIn("CPU", 0, newKeys...)})
		seq++
	}
	t.Cleanup(func() { testHookEvictShard = nil })
	next := 1 << 32
	for ; !fired && seq < 10000; seq++ {
		ix.Apply(flood, seq, []kvevents.Event{stored(testutil.Seq(next, 500)...)})
		next += 500
	}
	if !fired {
		t.Fatal("no eviction pass ran")
	}
	checkInvariants(t, ix)
	for _, e := range ix.Engines() {
		if e.Engine == flood && e.HolderBlocks != int64(len(newKeys)) {
			t.Errorf("the cleared engine holds %d blocks; want its %d new ones", e.HolderBlocks, len(newKeys))
		}
		if e.Engine == small && e.HolderBlocks != 500 {
			t.Errorf("the small engine holds %d blocks; want its 500", e.HolderBlocks)
		}
	}
	if got := matched(query(t, ix, &Query{Model: "m", BlockHashes: newKeys})); !slices.Contains(got, "flood:300") {
		t.Errorf("the cleared engine's new blocks: %v", got)
	}
}

// Over budget, the engines holding more than their fair share lose their
// least-recently-stored entries; an engine within its share keeps all of
// its entries, however old.
func TestMemoryBudgetEvictsLeastRecentlyStored(t *testing.T) {
	const budget = 2 << 20
	ix := mustNew(t, Options{MemoryBudget: budget})
	a, b := eng("a", 0), eng("b", 0)
	// a's few blocks first, then b's stream of new ones well past the
	// budget.
	old := testutil.Seq(1, 5000)
	ix.Apply(a, 1, []kvevents.Event{stored(old...)})
	const first = 1 << 32
	var next uint64 = first
	for i := 0; ix.Stats().Evictions == 0 && i < 10000; i++ {
		ix.Apply(b, uint64(i), []kvevents.Event{stored(testutil.Seq(int(next), 500)...)})
		next += 500
	}
	st := ix.Stats()
	if st.Evictions == 0 {
		t.Fatalf("no eviction: %+v", st)
	}
	if st.Bytes > budget {
		t.Errorf("%d bytes over the budget of %d", st.Bytes, budget)
	}
	// b's oldest blocks went first; its newest and all of a's are there.
	if got := matched(query(t, ix, &Query{Model: "m", BlockHashes: testutil.Seq(first, 1)})); !slices.Equal(got, []string{"a:0", "b:0"}) {
		t.Errorf("b's oldest block survived: %v", got)
	}
	if got := matched(query(t, ix, &Query{Model: "m", BlockHashes: old})); !slices.Equal(got, []string{"a:5000", "b:0"}) {
		t.Errorf("a's blocks, within its share: %v", got)
	}
	newest := testutil.Seq(int(next-500), 500)
	if got := matched(query(t, ix, &Query{Model: "m", BlockHashes: newest})); !slices.Equal(got, []string{"b:500", "a:0"}) {
		t.Errorf("newest blocks: %v", got)
	}
	checkInvariants(t, ix)
	var sum int64
	for _, e := range ix.Engines() {
		sum += e.HolderBlocks
	}
	if sum != st.HolderBlocks {
		t.Errorf("engines hold %d, index %d", sum, st.HolderBlocks)
	}
	// b lost entries to the budget: its matches are lower bounds until
	// its entries are exact again (a reset, or AllBlocksCleared), and the
	// flag survives a snapshot. a lost none.
	evicted := func(ix *Index) map[string]uint64 {
		m := map[string]uint64{}
		for _, e := range ix.Engines() {
			m[e.Engine.Pod] = e.Evicted
		}
		return m
	}
	if ev := evicted(ix); ev["a"] != 0 || ev["b"] == 0 {
		t.Errorf("evicted per engine %v, want b's counted, none of a's", ev)
	}
	var snap bytes.Buffer
	if err := ix.Snapshot(&snap); err != nil {
		t.Fatal(err)
	}
	restored := mustNew(t, Options{})
	if err := restored.Restore(&snap); err != nil {
		t.Fatal(err)
	}
	if ev := evicted(restored); ev["a"] != 0 || ev["b"] != 1 {
		t.Errorf("restored evicted per engine %v, want b flagged (1)", ev)
	}
	ix.Reset(b, kvevents.ResetRestart)
	if ev := evicted(ix); ev["a"] != 0 || ev["b"] != 0 {
		t.Errorf("after b's reset, evicted per engine %v, want b exact again", ev)
	}
	// Keeps working at the budget.
	for i := range 100 {
		ix.Apply(b, uint64(i), []kvevents.Event{stored(testutil.Seq(int(next), 500)...)})
		next += 500
	}
	if st := ix.Stats(); st.Bytes > budget {
		t.Errorf("%d bytes over the budget of %d", st.Bytes, budget)
	}
	if info := engineInfo(t, ix, a); info.Evicted != 0 || info.HolderBlocks != 5000 {
		t.Errorf("a: %+v, want its 5000 blocks, none evicted", info)
	}
	checkInvariants(t, ix)
}

func TestApplyConcurrentWithReset(t *testing.T) {
	ix := mustNew(t, Options{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			ix.Apply(eng("a", 0), uint64(i), []kvevents.Event{stored(testutil.Seq(i*10, 50)...)})
		}
	}()
	for range 50 {
		ix.RemoveEngine(eng("a", 0))
		ix.Reset(eng("a", 0), kvevents.ResetRestart)
	}
	<-done
	checkInvariants(t, ix)
}

// Models lists the models engines have sent events for, sorted, and
// keeps a model once its engines are gone.
func TestModels(t *testing.T) {
	ix, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := ix.Models(); len(got) != 0 {
		t.Errorf("empty index: %v", got)
	}
	ix.Apply(kvevents.EngineID{Model: "m2", Pod: "a"}, 0, nil)
	ix.Apply(kvevents.EngineID{Model: "m1", Pod: "b"}, 0, nil)
	ix.RemoveEngine(kvevents.EngineID{Model: "m1", Pod: "b"})
	if got := ix.Models(); !slices.Equal(got, []string{"m1", "m2"}) {
		t.Errorf("Models = %v, want [m1 m2]", got)
	}
}
