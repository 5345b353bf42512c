package faultlab

import (
	"math"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api/kvindexv1"
)

// seqWrapRoom is how many batches the wrapping engine publishes before its
// sequence number passes 2^64-1: room for the warm-up's AllBlocksCleared
// batches and the baseline traffic, which must not wrap yet.
const seqWrapRoom = 1024

// seqWrap: an engine whose sequence numbers reach 2^64-1 and wrap to 0 on
// the same connection (vLLM's cannot, a peer's can), beside an engine that
// numbers its batches as vLLM does. Before the wrap kvindex reports the
// engine ok with its entries (the warm-up's AllBlocksCleared made them
// exact); the batch numbered 0 that follows 2^64-1 proves no restart, as
// a new process comes on a new connection, so kvindex must reset the
// engine and never report it ok again with entries it cannot vouch for:
// the blocks cached before the wrap are gone from the index but still in
// the engine's cache.
func seqWrap(t *testing.T) {
	wrap := newEngine(t, "pod-0", 1, engineOpts{replay: true, firstSeq: math.MaxUint64 - seqWrapRoom + 1})
	other := newEngine(t, "pod-1", 2, engineOpts{replay: true})
	engines := []*engine{wrap, other}
	k := startKvindex(t, "--engine", wrap.engineFlag(), "--engine", other.engineFlag())
	warmUp(t, k, engines)
	tr := newTraffic(1)
	tr.run(t, engines, 50)
	awaitOK(t, k, engines)
	if seq := wrap.Seq(); seq < math.MaxUint64/2 {
		t.Fatalf("%s wrapped (seq %d) before the baseline was ok: raise seqWrapRoom", wrap.name, seq)
	}
	// Across the wrap, and 50 batches on.
	for seq := wrap.Seq(); seq > math.MaxUint64/2 || seq < 50; seq = wrap.Seq() {
		if _, err := wrap.Process(tr.prompt(), nil); err != nil {
			t.Fatal(err)
		}
	}
	faultEnd := time.Now()
	tr.run(t, engines, 50)
	tail(t, tr, engines)
	r := settle(t, k, faultEnd, engines, nil, 0)
	if h := listPods(t, k)[podKey(wrap.name, 0)].GetHealth(); h != kvindexv1.EngineHealth_ENGINE_HEALTH_UNCONFIRMED {
		t.Errorf("%s is %v after its sequence wrapped on the same connection, want unconfirmed", wrap.name, h)
	}
	if r.wrongFlagged == 0 {
		t.Errorf("no answer differed from the engines' caches: the wrap cost the index nothing the engine holds, so the row tests nothing")
	}
}
