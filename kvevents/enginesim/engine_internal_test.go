package enginesim

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/kvevents"
)

// TestDuplicateBlocks covers the case one request at a time never
// produces in this simulator but vLLM's pool can (several requests in
// flight): a block missing from the cache while its successors are still
// cached. The request then stores those successors again, vLLM does not
// de-duplicate, and every physical copy is later removed on its own.
func TestDuplicateBlocks(t *testing.T) {
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 2})
	e, err := New(Config{Hasher: h, CapacityBlocks: 6})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	seq := func(from, n int) []uint64 {
		s := make([]uint64, n)
		for i := range s {
			s[i] = uint64(from + i)
		}
		return s
	}
	a := seq(0, 6)
	hs, _ := h.Chain(nil, nil, 0, a, nil)
	ka := []uint64{hs[0].Key, hs[1].Key, hs[2].Key}
	mustProcess := func(toks []uint64, want int) {
		t.Helper()
		got, err := e.Process(toks, nil)
		if err != nil || got != want {
			t.Fatalf("Process = %d, %v; want %d", got, err, want)
		}
	}
	mustProcess(a, 0)
	// Make a0 the least recently used and evict it alone.
	e.mu.Lock()
	a0 := e.cached[ka[0]]
	e.lruRemove(a0)
	first := e.lru.next
	a0.prev, a0.next = &e.lru, first
	e.lru.next, first.prev = a0, a0
	e.mu.Unlock()
	mustProcess(seq(100, 6), 0) // three free blocks
	mustProcess(seq(200, 2), 0) // evicts a0
	if n, _ := e.Lookup(a, nil); n != 0 {
		t.Fatalf("a0 still cached")
	}
	// Keep a1 and a2 recent so that the next request evicts others.
	e.mu.Lock()
	for _, k := range ka[1:] {
		b := e.cached[k]
		e.lruRemove(b)
		e.lruPushBack(b)
	}
	e.mu.Unlock()
	mustProcess(a, 0) // a miss: stores a0, a1, a2, the last two a second time
	checkPool(t, e)

	if e.CachedBlocks() != 6 {
		t.Fatalf("CachedBlocks = %d, want 6 (a1 and a2 twice)", e.CachedBlocks())
	}
	if n, _ := e.Lookup(a, nil); n != 3 {
		t.Fatalf("Lookup = %d", n)
	}
	// Flush the pool with unrelated requests and count removals per key.
	mustProcess(seq(300, 12), 0)
	if n, _ := e.Lookup(a, nil); n != 0 {
		t.Fatalf("A survives a full flush: %d", n)
	}
	stored, removed := map[uint64]int{}, map[uint64]int{}
	var d kvevents.Decoder
	var b kvevents.Batch
	for _, en := range e.since(0) {
		if err := d.Decode(en.payload, &b); err != nil {
			t.Fatal(err)
		}
		for _, ev := range b.Events {
			for _, k := range ev.Hashes {
				if ev.Kind == kvevents.BlockStored {
					stored[k]++
				} else {
					removed[k]++
				}
			}
		}
	}
	for i, k := range ka {
		if stored[k] != removed[k] {
			t.Errorf("a%d: stored %d times, removed %d times", i, stored[k], removed[k])
		}
	}
	if got := []int{stored[ka[0]], stored[ka[1]], stored[ka[2]]}; !slices.Equal(got, []int{2, 2, 2}) {
		t.Errorf("stores of a0..a2 = %v, want [2 2 2]", got)
	}
	if removed[ka[1]] != 2 {
		t.Errorf("a1 removed %d times, want 2 (one per physical copy)", removed[ka[1]])
	}
}

// checkPool verifies the pool's bookkeeping: every block is free or
// cached, each cached block is reachable from the index exactly once and
// sits in the LRU list (nothing is pinned between calls).
func checkPool(t *testing.T, e *Engine) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	indexed := map[*block]bool{}
	for key, b := range e.cached {
		for ; b != nil; b = b.dup {
			if !b.cached || b.hash.Key != key || indexed[b] {
				t.Fatalf("index entry %d: block cached=%v key=%d seen=%v", key, b.cached, b.hash.Key, indexed[b])
			}
			indexed[b] = true
		}
	}
	inLRU := 0
	for b := e.lru.next; b != &e.lru; b = b.next {
		if !indexed[b] || b.next.prev != b {
			t.Fatalf("LRU holds a block that is not indexed or is mislinked")
		}
		inLRU++
	}
	if len(indexed) != e.nCached || inLRU != e.nCached || len(e.free)+e.nCached != len(e.pool) {
		t.Fatalf("indexed %d, in LRU %d, nCached %d, free %d, pool %d", len(indexed), inLRU, e.nCached, len(e.free), len(e.pool))
	}
}

// TestPoolInvariants runs random requests, clears and restarts, with
// random recency shuffles that produce out-of-order evictions, and checks
// the pool after every step.
func TestPoolInvariants(t *testing.T) {
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 2})
	e, err := New(Config{Hasher: h, CapacityBlocks: 12})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	rng := rand.New(rand.NewPCG(11, 12))
	for step := 0; step < 3000; step++ {
		switch r := rng.IntN(100); {
		case r < 2:
			if err := e.Clear(); err != nil {
				t.Fatal(err)
			}
		case r < 3:
			e.Restart()
		case r < 30 && e.CachedBlocks() > 0:
			// Move a random cached block to the front of the LRU list.
			e.mu.Lock()
			n := rng.IntN(e.nCached)
			b := e.lru.next
			for ; n > 0; n-- {
				b = b.next
			}
			e.lruRemove(b)
			first := e.lru.next
			b.prev, b.next = &e.lru, first
			e.lru.next, first.prev = b, b
			e.mu.Unlock()
		default:
			toks := make([]uint64, 2*(1+rng.IntN(8)))
			fam := uint64(rng.IntN(4)) * 1000
			for i := range toks {
				toks[i] = fam + uint64(i)
			}
			if _, err := e.Process(toks, nil); err != nil {
				t.Fatal(err)
			}
		}
		checkPool(t, e)
	}
}
