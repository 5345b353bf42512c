package indexer

import (
	"slices"
	"testing"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/testutil"
)

// memoKeys runs the key source of a query to completion and reports how
// many keys came from the memo.
func memoKeys(t *testing.T, ix *Index, toks []uint64, x *blockhash.Extras) (keys []uint64, fromMemo int) {
	t.Helper()
	var s queryScratch
	var k keySource
	k.initTokens(ix, &s, toks, x)
	fromMemo = k.memoHave
	if k.n > 0 {
		if err := k.ensure(k.n - 1); err != nil {
			t.Fatal(err)
		}
	}
	k.finish()
	return slices.Clone(s.keys[:k.n]), fromMemo
}

func TestMemoReusesChains(t *testing.T) {
	h := mustHasher(t, blockhash.SHA256CBOR, "0", 16)
	ix := mustNew(t, Options{Hasher: h})
	want := func(toks []uint64, x *blockhash.Extras) []uint64 {
		hs, err := h.Chain(nil, nil, 0, toks, x)
		if err != nil {
			t.Fatal(err)
		}
		return keysOf(hs)
	}
	system := testutil.Seq(5000, 16*70)
	turn1 := append(slices.Clone(system), testutil.Seq(1, 16*10+5)...)
	turn2 := append(slices.Clone(turn1[:16*80]), testutil.Seq(900, 16*12)...) // next turn: old prompt + new blocks
	other := append(slices.Clone(system), testutil.Seq(77, 16*3)...)          // another conversation, same system prompt
	lora := &blockhash.Extras{LoRAName: "a"}
	steps := []struct {
		name     string
		toks     []uint64
		x        *blockhash.Extras
		fromMemo int
	}{
		{"cold", turn1, nil, 0},
		{"repeat", turn1, nil, 80},
		{"repeat with another partial block", append(slices.Clone(turn1[:16*80]), 1, 2), nil, 80},
		{"next turn hashes only its new blocks", turn2, nil, 80},
		{"next turn again", turn2, nil, 92},
		{"shorter prefix of a memoized prompt", turn2[:16*40], nil, 32}, // nearest checkpoint
		{"other conversation shares the system prompt", other, nil, 64},
		{"extras keep chains apart", turn1, lora, 0},
		{"with extras, repeat", turn1, lora, 80},
		{"no full block", testutil.Seq(1, 15), nil, 0},
	}
	for _, st := range steps {
		keys, fromMemo := memoKeys(t, ix, st.toks, st.x)
		if !slices.Equal(keys, want(st.toks, st.x)) {
			t.Fatalf("%s: wrong keys", st.name)
		}
		if fromMemo != st.fromMemo {
			t.Errorf("%s: %d keys from the memo, want %d", st.name, fromMemo, st.fromMemo)
		}
	}
	// A walk that stops early memoizes what it hashed; the rest follows.
	ix = mustNew(t, Options{Hasher: h})
	var res Result
	if err := ix.LongestPrefix(&Query{Model: "none", Tokens: turn1}, &res); err != nil || res.BlocksTotal != 80 {
		t.Fatal(err, res)
	}
	ix.Apply(eng("a", 0), 1, nil)
	if err := ix.LongestPrefix(&Query{Model: "m", Tokens: turn1}, &res); err != nil || res.Pods[0].MatchedBlocks != 0 {
		t.Fatal(err, res)
	}
	keys, fromMemo := memoKeys(t, ix, turn1, nil)
	if !slices.Equal(keys, want(turn1, nil)) || fromMemo != 16 {
		t.Errorf("after an early stop: %d from the memo", fromMemo)
	}
}
