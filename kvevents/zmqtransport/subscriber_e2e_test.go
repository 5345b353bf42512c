package zmqtransport_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/enginesim/simzmq"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// mirrorSink keeps, per engine, a reference count per block key: what an
// index would believe each engine holds.
type mirrorSink struct {
	mu      sync.Mutex
	blocks  map[kvevents.EngineID]map[uint64]int
	lastSeq map[kvevents.EngineID]uint64
	applied map[kvevents.EngineID]int
	resets  map[kvevents.EngineID][]kvevents.ResetReason
}

func newMirrorSink() *mirrorSink {
	return &mirrorSink{
		blocks:  map[kvevents.EngineID]map[uint64]int{},
		lastSeq: map[kvevents.EngineID]uint64{},
		applied: map[kvevents.EngineID]int{},
		resets:  map[kvevents.EngineID][]kvevents.ResetReason{},
	}
}

func (m *mirrorSink) Apply(e kvevents.EngineID, seq uint64, events []kvevents.Event) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.blocks[e]
	if b == nil {
		b = map[uint64]int{}
		m.blocks[e] = b
	}
	for _, ev := range events {
		switch ev.Kind {
		case kvevents.BlockStored:
			for _, h := range ev.Hashes {
				b[h]++
			}
		case kvevents.BlockRemoved:
			for _, h := range ev.Hashes {
				if b[h]--; b[h] <= 0 {
					delete(b, h)
				}
			}
		case kvevents.AllBlocksCleared:
			clear(b)
		}
	}
	m.lastSeq[e] = seq
	m.applied[e]++
}

func (m *mirrorSink) Reset(e kvevents.EngineID, reason kvevents.ResetReason) {
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.blocks[e])
	m.resets[e] = append(m.resets[e], reason)
	delete(m.lastSeq, e)
}

func (m *mirrorSink) caughtUp(e kvevents.EngineID, seq uint64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	last, ok := m.lastSeq[e]
	return ok && last == seq
}

// check compares the mirror with the engine's true cache.
func (m *mirrorSink) check(t *testing.T, eng *simzmq.Engine) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	e := eng.EngineID()
	total := 0
	for k, n := range m.blocks[e] {
		total += n
		if eng.LookupKeys([]uint64{k}) != 1 {
			t.Errorf("%s: the index believes block %x is cached; the engine does not hold it", e, k)
		}
	}
	if got := eng.CachedBlocks(); total != got {
		t.Errorf("%s: the index counts %d cached blocks, the engine holds %d", e, total, got)
	}
}

// awaitBound bounds every wait for a condition.
const awaitBound = 15 * time.Second

func streamStats(s *zmqtransport.Subscriber, e kvevents.EngineID) (kvevents.StreamStats, bool) {
	for _, st := range s.Streams() {
		if st.Engine == e {
			return st, true
		}
	}
	return kvevents.StreamStats{}, false
}

// settledStats returns e's stats once no replay is outstanding.
func settledStats(t *testing.T, s *zmqtransport.Subscriber, e kvevents.EngineID) kvevents.StreamStats {
	t.Helper()
	var st kvevents.StreamStats
	testutil.Await(t, awaitBound, e.String()+" settled", func() bool {
		var ok bool
		st, ok = streamStats(s, e)
		return ok && !st.Replaying
	})
	return st
}

// TestSubscriberWithEngineSim runs simulated engines (real PUB and replay
// sockets, vLLM's byte layout) through the subscriber with lost batches, a
// cache reset and a restart, and checks that the Sink's view of every
// engine's cache equals the engine's own.
func TestSubscriberWithEngineSim(t *testing.T) {
	h, err := blockhash.New(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	var engines []*simzmq.Engine
	for i, shape := range []kvevents.Shape{kvevents.ShapeMap, kvevents.ShapeArray} {
		eng, err := simzmq.New(enginesim.Config{
			Pod: fmt.Sprintf("sim-%d", i), Model: "m", Hasher: h, CapacityBlocks: 96, Shape: shape,
			BytesHashes: i == 1,
		}, zmqtransport.PublisherConfig{Topic: "kv-events", ReplayEndpoint: "tcp://127.0.0.1:*", ReplayWithTopic: i == 0})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { eng.Close() })
		engines = append(engines, eng)
	}
	// Some history before the subscriber starts: recovered by the replay
	// it asks for on connecting.
	rng := rand.New(rand.NewPCG(7, 7))
	prompt := func() []uint64 {
		// Shared system prompts plus a unique tail, 2 to 12 blocks.
		toks := make([]uint64, 16*(2+rng.IntN(11)))
		sys := uint64(rng.IntN(4))
		for i := range toks {
			if i < 32 {
				toks[i] = sys*1000 + uint64(i)
			} else {
				toks[i] = rng.Uint64N(50_000)
			}
		}
		return toks
	}
	for _, eng := range engines {
		for range 20 {
			if _, err := eng.Process(prompt(), nil); err != nil {
				t.Fatal(err)
			}
		}
	}

	sink := newMirrorSink()
	cfg := zmqtransport.SubscriberConfig{ReplayTimeout: 5 * time.Second}
	for _, eng := range engines {
		cfg.Engines = append(cfg.Engines, zmqtransport.EngineConfig{
			Name: eng.Config().Pod, Model: "m", Endpoint: eng.PubEndpoint(), ReplayEndpoint: eng.ReplayEndpoint(), Topic: "kv-events",
		})
	}
	s, err := zmqtransport.NewSubscriber(cfg, sink, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	// The engine's PUB socket gives no sign of our subscription; keep
	// sending requests until one arrives live. Any lost on the way are
	// gaps the replay fills.
	for _, eng := range engines {
		e := eng.EngineID()
		testutil.Await(t, awaitBound, e.String()+" connected", func() bool {
			st, ok := streamStats(s, e)
			return ok && st.Connected && !st.Replaying && st.ReplaysOK >= 1
		})
		testutil.Await(t, awaitBound, e.String()+" live", func() bool {
			if _, err := eng.Process(prompt(), nil); err != nil {
				t.Fatal(err)
			}
			return sink.caughtUp(e, eng.Seq()-1)
		})
	}

	// catchUp waits until the subscriber has applied all the engine
	// published and no replay is outstanding. Before a restart this
	// matters: a replay the old process has not served yet would be
	// answered by the new one, and the old batches would be lost.
	catchUp := func(eng *simzmq.Engine) {
		testutil.Await(t, awaitBound, "caught up", func() bool { return sink.caughtUp(eng.EngineID(), eng.Seq()-1) })
		settledStats(t, s, eng.EngineID())
	}
	before := settledStats(t, s, engines[0].EngineID())
	for round := range 400 {
		for i, eng := range engines {
			switch {
			case round == 100 && i == 0:
				eng.DropNext(3) // lost on the live socket
			case round == 200 && i == 1:
				if err := eng.Clear(); err != nil {
					t.Fatal(err)
				}
			case round == 300 && i == 0:
				catchUp(eng)
				if err := eng.Restart(); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := eng.Process(prompt(), nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, eng := range engines {
		e := eng.EngineID()
		catchUp(eng)
		sink.check(t, eng)
		st := settledStats(t, s, e)
		if (st.Health == kvevents.HealthDegraded) || st.LostBatches != 0 || st.DecodeErrors != 0 {
			t.Errorf("%s: %+v; want healthy, nothing lost", e, st)
		}
	}
	st0 := settledStats(t, s, engines[0].EngineID())
	if st0.Gaps-before.Gaps != 1 || st0.Restarts != 1 {
		t.Errorf("engine 0: %+v; want 1 gap since the handshake (%d before), 1 restart", st0, before.Gaps)
	}
	if got := sink.resets[engines[0].EngineID()]; len(got) != 1 || got[0] != kvevents.ResetRestart {
		t.Errorf("engine 0 resets %v, want [restart]", got)
	}
	if st1 := settledStats(t, s, engines[1].EngineID()); st1.Resets != 1 {
		t.Errorf("engine 1: %+v; want 1 reset (its AllBlocksCleared)", st1)
	}
}
