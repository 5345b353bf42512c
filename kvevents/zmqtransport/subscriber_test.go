package zmqtransport

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
)

// connectedEngine starts a test publisher and a subscriber reading it as
// engine name (connect mode, model "m"; cfg supplies other settings), and
// waits until the subscriber has settled and the publisher sees its
// subscription.
func connectedEngine(t *testing.T, opts pubOptions, cfg SubscriberConfig, name string) (*testPublisher, *recSink, *Subscriber, kvevents.EngineID) {
	t.Helper()
	pub := newTestPublisher(t, opts)
	sink := newRecSink()
	cfg.Engines = append(cfg.Engines, connectCfg(pub, name))
	s := startSubscriber(t, cfg, sink)
	e := kvevents.EngineID{Pod: name, Model: "m"}
	waitReady(t, s, e)
	pub.waitSubscribed(1)
	return pub, sink, s, e
}

func connectCfg(p *testPublisher, name string) EngineConfig {
	ec := EngineConfig{Name: name, Model: "m", Endpoint: p.PubEP, Topic: p.opts.topic}
	if !p.opts.noReplay {
		ec.ReplayEndpoint = p.ReplayEP
	}
	return ec
}

func TestSubscriberInOrder(t *testing.T) {
	pub, sink, s, e := connectedEngine(t, pubOptions{topic: "kv-events"}, SubscriberConfig{}, "pod-a")

	const n = 3000
	pub.publishN(n, 0)
	sink.waitApplied(t, e, n-1)
	sink.wantCalls(t, e, seqRange(0, n))
	sink.checkHashes(t, e)

	st := mustStream(t, s, e)
	want := kvevents.StreamStats{
		Engine: e, Endpoint: pub.PubEP, ReplayEndpoint: pub.ReplayEP,
		Batches: n, Events: n, LastSeq: n - 1, LastEventUnixNano: fixedClock().UnixNano(), Connected: true,
		ReplaysOK: 1, // the empty engine's buffer, asked for on connecting
		// The batches' stamp (1750000000.5 s) is after the fixed clock:
		// the engine's clock is ahead by half a second, less 42 ns.
		LastBatchStampUnixNano: 1_750_000_000_500_000_000,
		LastBatchLag:           fixedClock().Sub(time.Unix(1_750_000_000, 500_000_000)),
	}
	if st != want {
		t.Fatalf("stats\n got  %+v\n want %+v", st, want)
	}
	if got := pub.replays.Load(); got != 1 {
		t.Fatalf("%d replay requests for a gap-free stream, want 1 (on connect)", got)
	}
}

// TestSubscriberGoldenPayloads sends the msgspec-produced payloads of
// every wire era through a real socket.
func TestSubscriberGoldenPayloads(t *testing.T) {
	golden := loadGoldenPayloads(t)
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range golden {
			if !yield(k) {
				return
			}
		}
	})
	pub, sink, s, e := connectedEngine(t, pubOptions{}, SubscriberConfig{}, "pod-g")
	for _, name := range names {
		pub.publish(golden[name].bytes(t))
	}
	sink.waitApplied(t, e, uint64(len(names)-1))
	got := sink.entries(e)
	if len(got) != len(names) {
		t.Fatalf("%d Sink calls for %d payloads: %v", len(got), len(names), got)
	}
	wantClears := 0
	for i, name := range names {
		g := golden[name]
		var kinds []string
		var hashes []uint64
		for _, ev := range g.Events {
			kinds = append(kinds, ev.Kind)
			hashes = append(hashes, ev.Hashes...)
			if ev.Kind == "AllBlocksCleared" {
				wantClears++
			}
		}
		var gotKinds []string
		for _, k := range got[i].kinds {
			gotKinds = append(gotKinds, k.String())
		}
		if got[i].seq != uint64(i) || !slices.Equal(gotKinds, kinds) || !slices.Equal(got[i].hashes, hashes) {
			t.Errorf("%s: got seq %d %v %x; want seq %d %v %x", name, got[i].seq, gotKinds, got[i].hashes, i, kinds, hashes)
		}
	}
	st := mustStream(t, s, e)
	if st.Resets != uint64(wantClears) || st.DecodeErrors != 0 || (st.Health == kvevents.HealthDegraded) {
		t.Fatalf("resets %d (want %d AllBlocksCleared), decode errors %d, degraded %v",
			st.Resets, wantClears, st.DecodeErrors, (st.Health == kvevents.HealthDegraded))
	}
}

func TestSubscriberReplayRecoversDroppedBatches(t *testing.T) {
	for _, layout := range []struct {
		name      string
		newReplay bool
	}{{"replies [seq, payload] (vLLM < 0.26)", false}, {"replies [topic, seq, payload] (vLLM >= 0.26)", true}} {
		t.Run(layout.name, func(t *testing.T) {
			pub, sink, s, e := connectedEngine(t, pubOptions{topic: "kv@pod@m", newReplay: layout.newReplay}, SubscriberConfig{}, "pod-r")
			// Two phases, so the first replay cannot already cover
			// the second gap.
			pub.dropLive(5, 6, 7)
			pub.publishN(30, 0)
			sink.waitApplied(t, e, 29)
			pub.dropLive(40)
			const n = 60
			pub.publishN(n, 0)
			sink.waitApplied(t, e, n-1)
			sink.wantCalls(t, e, seqRange(0, n))
			sink.checkHashes(t, e)
			st := mustStream(t, s, e)
			// One replay on connect, one per gap.
			if st.Gaps != 2 || st.ReplaysOK != 3 || st.ReplaysFailed != 0 || st.LostBatches != 0 || (st.Health == kvevents.HealthDegraded) {
				t.Fatalf("stats %+v; want 2 gaps, 3 replays ok, nothing lost", st)
			}
			if got := pub.replays.Load(); got != 3 {
				t.Fatalf("%d replay requests, want 3", got)
			}
		})
	}
}

func TestSubscriberReplayUnavailable(t *testing.T) {
	tests := []struct {
		name       string
		opts       pubOptions
		wantOK     uint64 // replays on connect included
		wantFailed uint64
		wantLost   uint64
	}{
		{name: "no replay endpoint", opts: pubOptions{noReplay: true}, wantLost: 3},
		{name: "replay never answers", opts: pubOptions{silent: true}, wantFailed: 2, wantLost: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pub, sink, s, e := connectedEngine(t, tt.opts, SubscriberConfig{ReplayTimeout: 300 * time.Millisecond}, "pod-u")
			pub.dropLive(5, 6, 7)
			pub.publishN(10, 0)
			sink.waitApplied(t, e, 9)
			// Degraded, but the index state was kept: no Reset.
			sink.wantCalls(t, e, append(seqRange(0, 5), seqRange(8, 10)...))
			st := mustStream(t, s, e)
			if !(st.Health == kvevents.HealthDegraded) || st.Gaps != 1 || st.ReplaysOK != tt.wantOK || st.ReplaysFailed != tt.wantFailed ||
				st.LostBatches != tt.wantLost || st.Resets != 0 {
				t.Fatalf("stats %+v; want degraded, 1 gap, %d+%d replays ok+failed, %d lost",
					st, tt.wantOK, tt.wantFailed, tt.wantLost)
			}
			// Later batches flow as usual.
			pub.publishN(12, 0)
			sink.waitApplied(t, e, 11)
			sink.checkHashes(t, e)
		})
	}
}

func TestSubscriberRestartedPublisherResets(t *testing.T) {
	pub, sink, s, e := connectedEngine(t, pubOptions{}, SubscriberConfig{}, "pod-x")
	pub.publishN(20, 0)
	sink.waitApplied(t, e, 19)

	pub.restart() // same endpoints, seq back to 0
	pub.waitSubscribed(1)
	pub.publishN(5, 0)
	testutil.Await(t, waitTimeout, "the restarted engine's batches", func() bool {
		calls := sink.entries(e)
		return len(calls) == 26 && calls[25].seq == 4
	})
	sink.wantCalls(t, e, append(append(seqRange(0, 20), "reset:restart"), seqRange(0, 5)...))
	st := mustStream(t, s, e)
	if st.Restarts != 1 || st.Resets != 1 || (st.Health == kvevents.HealthDegraded) || st.LastSeq != 4 {
		t.Fatalf("stats %+v; want 1 restart, healthy, last seq 4", st)
	}
}

// TestSubscriberRestartWithLostStart: the subscriber misses the restarted
// engine's first batches; the smaller seq still reveals the restart and a
// bootstrap replay recovers the missed batches.
func TestSubscriberRestartWithLostStart(t *testing.T) {
	pub, sink, s, e := connectedEngine(t, pubOptions{}, SubscriberConfig{}, "pod-y")
	pub.publishN(50, 0)
	sink.waitApplied(t, e, 49)
	pub.restart()
	pub.waitSubscribed(1)
	pub.dropLive(0, 1, 2)
	pub.publishN(6, 0)
	testutil.Await(t, waitTimeout, "recovery after the restart", func() bool { return len(sink.entries(e)) == 57 })
	sink.wantCalls(t, e, append(append(seqRange(0, 50), "reset:restart"), seqRange(0, 6)...))
	sink.checkHashes(t, e)
	if st := mustStream(t, s, e); st.Restarts != 1 || (st.Health == kvevents.HealthDegraded) || st.LostBatches != 0 {
		t.Fatalf("stats %+v; want 1 restart, nothing lost", st)
	}
}

func TestSubscriberBootstrapReplayOnLateJoin(t *testing.T) {
	tests := []struct {
		name       string
		keep       int
		wantFirst  uint64
		wantHealth kvevents.Health
	}{
		{"engine still holds everything", 10_000, 0, kvevents.HealthOK},
		// The engine's first 70 batches are unknown.
		{"engine holds the last 30 batches", 30, 70, kvevents.HealthUnconfirmed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pub := newTestPublisher(t, pubOptions{keep: tt.keep})
			pub.publishN(100, 0) // nobody listens yet; the engine then idles
			sink := newRecSink()
			s := startSubscriber(t, SubscriberConfig{Engines: []EngineConfig{connectCfg(pub, "pod-b")}}, sink)
			e := kvevents.EngineID{Pod: "pod-b", Model: "m"}
			// Recovered on connect, before the engine publishes again.
			sink.waitApplied(t, e, 99)
			pub.waitSubscribed(1)
			pub.publishN(110, 0)
			sink.waitApplied(t, e, 109)
			sink.wantCalls(t, e, seqRange(tt.wantFirst, 110))
			sink.checkHashes(t, e)
			st := mustStream(t, s, e)
			if st.ReplaysOK != 1 || st.Health != tt.wantHealth || st.Gaps != 0 {
				t.Fatalf("stats %+v; want one successful bootstrap replay, %v", st, tt.wantHealth)
			}
		})
	}
}

func TestSubscriberDPRanksKeptApart(t *testing.T) {
	ep0, ep1 := freePortPair(t)
	rp0, rp1 := freePortPair(t)
	pub0 := newTestPublisher(t, pubOptions{pubAt: ep0, replayAt: rp0})
	pub1 := newTestPublisher(t, pubOptions{pubAt: ep1, replayAt: rp1})
	sink := newRecSink()
	s := startSubscriber(t, SubscriberConfig{Engines: []EngineConfig{{
		Name: "dp-pod", Model: "m", Endpoint: ep0, ReplayEndpoint: rp0, Ranks: 2,
	}}}, sink)
	e0, e1 := kvevents.EngineID{Pod: "dp-pod", Model: "m", DPRank: 0}, kvevents.EngineID{Pod: "dp-pod", Model: "m", DPRank: 1}
	waitReady(t, s, e0)
	waitReady(t, s, e1)
	pub0.waitSubscribed(1)
	pub1.waitSubscribed(1)
	pub1.dropLive(3)
	pub0.publishN(10, 0)
	pub1.publishN(25, 1)
	sink.waitApplied(t, e0, 9)
	sink.waitApplied(t, e1, 24)
	sink.wantCalls(t, e0, seqRange(0, 10))
	sink.wantCalls(t, e1, seqRange(0, 25))
	sink.checkHashes(t, e0)
	sink.checkHashes(t, e1)
	st1 := mustStream(t, s, e1)
	if st1.Endpoint != ep1 || st1.ReplayEndpoint != rp1 || st1.ReplaysOK != 2 || st1.Gaps != 1 {
		t.Fatalf("rank 1 stats %+v; want endpoint %s, replay %s, one gap replayed", st1, ep1, rp1)
	}
	if st0 := mustStream(t, s, e0); st0.Gaps != 0 {
		t.Fatalf("rank 0 saw rank 1's gap: %+v", st0)
	}
}

// TestSubscriberRankFromBatch: the batch's dp_rank wins over the port's.
func TestSubscriberRankFromBatch(t *testing.T) {
	pub, sink, s, e := connectedEngine(t, pubOptions{}, SubscriberConfig{}, "pod-k")
	pub.publishN(3, 4) // stamped dp_rank 4 on rank 0's port
	e.DPRank = 4
	sink.waitApplied(t, e, 2)
	sink.wantCalls(t, e, seqRange(0, 3))
	if got := sink.entries(kvevents.EngineID{Pod: "pod-k", Model: "m"}); len(got) != 0 {
		t.Fatalf("calls under the port's rank: %v", got)
	}
	st := mustStream(t, s, e)
	if st.RankMismatches != 3 {
		t.Fatalf("rank mismatches %d, want 3", st.RankMismatches)
	}
}

func TestSubscriberMalformedFrames(t *testing.T) {
	pub, sink, s, e := connectedEngine(t, pubOptions{noReplay: true}, SubscriberConfig{}, "pod-m")
	good := func(seq uint64) []byte { return encodeTestBatch(t, seq, 0, kvevents.ShapeMap) }
	pub.sendRaw([]byte{}, seqBytes(0), good(0))
	for _, frames := range [][][]byte{
		{[]byte{}, seqBytes(1)},                                      // two frames
		{[]byte{}, seqBytes(1), good(1), []byte("x")},                // four frames
		{[]byte{}, []byte{0, 1}, good(1)},                            // short seq frame
		{[]byte{}, []byte{}, good(1)},                                // empty seq frame
		{[]byte{}},                                                   // one frame
		{[]byte{}, seqBytes(1), good(1), {}, {}, {}, {}, {}, {}, {}}, // ten frames
	} {
		pub.sendRaw(frames...)
	}
	pub.sendRaw([]byte{}, seqBytes(1), []byte{0xc1, 0xff, 0x00}) // undecodable payload
	pub.sendRaw([]byte{}, seqBytes(2), []byte{})                 // empty payload
	pub.sendRaw([]byte{}, seqBytes(3), good(3))
	sink.waitApplied(t, e, 3)
	sink.wantCalls(t, e, []string{"0", "3"})
	st := mustStream(t, s, e)
	// The undecodable batches never reached the sequencer: seq 3 shows
	// the gap, lost without a replay endpoint.
	if st.DecodeErrors != 8 || st.Gaps != 1 || st.LostBatches != 2 || st.Batches != 2 || !(st.Health == kvevents.HealthDegraded) {
		t.Fatalf("stats %+v; want 8 decode errors, 1 gap of 2 lost batches, 2 batches, degraded", st)
	}
}

func TestSubscriberEnginesAreIndependent(t *testing.T) {
	a := newTestPublisher(t, pubOptions{})
	b := newTestPublisher(t, pubOptions{})
	sink := newRecSink()
	s := startSubscriber(t, SubscriberConfig{
		Engines: []EngineConfig{connectCfg(a, "pod-a"), connectCfg(b, "pod-b")},
		Pollers: 1, // both on one loop: the harder case
	}, sink)
	ea, eb := kvevents.EngineID{Pod: "pod-a", Model: "m"}, kvevents.EngineID{Pod: "pod-b", Model: "m"}
	waitReady(t, s, ea)
	waitReady(t, s, eb)
	a.waitSubscribed(1)
	b.waitSubscribed(1)
	a.publishN(5, 0)
	b.publishN(5, 0)
	sink.waitApplied(t, ea, 4)
	sink.waitApplied(t, eb, 4)

	a.Close() // engine a goes away
	testutil.Await(t, waitTimeout, "pod-a disconnected", func() bool { return !mustStream(t, s, ea).Connected })
	b.publishN(500, 0)
	sink.waitApplied(t, eb, 499)
	sink.wantCalls(t, eb, seqRange(0, 500))
	if !mustStream(t, s, eb).Connected {
		t.Fatal("pod-b reported disconnected")
	}
}

func TestSubscriberBindMode(t *testing.T) {
	sink := newRecSink()
	s := startSubscriber(t, SubscriberConfig{
		Listen:         "tcp://127.0.0.1:*",
		Topic:          "kv@",
		ReplayTemplate: "tcp://{pod}",
	}, sink)
	ep := s.ListenEndpoint()
	if !strings.HasPrefix(ep, "tcp://127.0.0.1:") || strings.HasSuffix(ep, "*") {
		t.Fatalf("ListenEndpoint %q", ep)
	}
	// The pods are named by their replay address, so the template
	// tcp://{pod} finds each one's replay socket; the model contains '@'.
	type engine struct {
		pub *testPublisher
		id  kvevents.EngineID
	}
	var engines []engine
	for i := range 3 {
		p := newTestPublisher(t, pubOptions{connect: ep, newReplay: i%2 == 0})
		pod := strings.TrimPrefix(p.ReplayEP, "tcp://")
		p.opts.topic = "kv@" + pod + "@org/model@v" + fmt.Sprint(i)
		engines = append(engines, engine{p, kvevents.EngineID{Pod: pod, Model: "org/model@v" + fmt.Sprint(i)}})
	}
	for _, en := range engines {
		en.pub.waitSubscribed(1)
	}
	engines[1].pub.dropLive(2)
	for round := range uint64(20) {
		for _, en := range engines {
			en.pub.publishN(round+1, 0)
		}
	}
	// A second rank of engine 0 on the same connection, told apart by
	// the batch's dp_rank.
	rank1 := engines[0].id
	rank1.DPRank = 1
	for seq := range uint64(4) {
		engines[0].pub.mu.Lock()
		_, err := engines[0].pub.pub.SendMessage([]byte(engines[0].pub.opts.topic), seqBytes(seq), encodeTestBatch(t, seq, 1, kvevents.ShapeMap))
		engines[0].pub.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, en := range engines {
		sink.waitApplied(t, en.id, 19)
		sink.wantCalls(t, en.id, seqRange(0, 20))
		sink.checkHashes(t, en.id)
	}
	sink.waitApplied(t, rank1, 3)
	sink.wantCalls(t, rank1, seqRange(0, 4))
	if st := mustStream(t, s, engines[1].id); st.ReplaysOK != 1 || st.Gaps != 1 || !st.Bind || !st.Connected {
		t.Fatalf("engine 1 stats %+v; want its gap replayed", st)
	}
	if got := len(s.Streams()); got != 4 {
		t.Fatalf("%d streams, want 4", got)
	}
	ls, ok := s.ListenerStats()
	if !ok || ls.Peers != 3 || ls.Endpoint != ep {
		t.Fatalf("listener stats %+v", ls)
	}
}

func TestSubscriberBindModeBadInput(t *testing.T) {
	sink := newRecSink()
	s := startSubscriber(t, SubscriberConfig{Listen: "tcp://127.0.0.1:*"}, sink)
	p := newTestPublisher(t, pubOptions{connect: s.ListenEndpoint(), noReplay: true})
	p.waitSubscribed(1)
	good := func(seq uint64, rank int) []byte { return encodeTestBatch(t, seq, rank, kvevents.ShapeArray) }
	p.sendRaw([]byte("kv@pod-1@m"), seqBytes(0), good(0, 0))
	p.sendRaw([]byte("kv@pod-1@m"), seqBytes(1))                              // malformed
	p.sendRaw([]byte("kv@pod-1@m"), []byte{1, 2, 3}, good(1, 0))              // malformed
	p.sendRaw([]byte("other-topic"), seqBytes(1), good(1, 0))                 // unknown topic
	p.sendRaw([]byte("kv@@m"), seqBytes(1), good(1, 0))                       // unknown topic (empty pod)
	p.sendRaw([]byte("kv@pod-1@m"), seqBytes(1), []byte("not msgpack"))       // undecodable
	p.sendRaw([]byte("kv@pod-1@m"), seqBytes(1), good(1, kvevents.MaxDPRank)) // bad rank
	p.sendRaw([]byte("kv@pod-1@m"), seqBytes(2), good(2, 0))
	e := kvevents.EngineID{Pod: "pod-1", Model: "m"}
	sink.waitApplied(t, e, 2)
	sink.wantCalls(t, e, []string{"0", "2"})
	ls, _ := s.ListenerStats()
	want := kvevents.ListenerStats{Endpoint: s.ListenEndpoint(), Peers: 1, Messages: 8, MalformedFrames: 2, UnknownTopics: 2, DecodeErrors: 1, BadRanks: 1}
	if ls != want {
		t.Fatalf("listener stats\n got  %+v\n want %+v", ls, want)
	}
	st := mustStream(t, s, e)
	if st.Gaps != 1 || st.LostBatches != 1 || !(st.Health == kvevents.HealthDegraded) {
		t.Fatalf("stream stats %+v; want the dropped seq 1 seen as a lost gap", st)
	}
}

func TestSubscriberAddRemoveEngine(t *testing.T) {
	a := newTestPublisher(t, pubOptions{})
	sink := newRecSink()
	s := startSubscriber(t, SubscriberConfig{}, sink)
	ec := connectCfg(a, "pod-dyn")
	ec.Ranks = 1
	if err := s.AddEngine(ec); err != nil {
		t.Fatal(err)
	}
	if err := s.AddEngine(ec); err == nil {
		t.Fatal("adding an engine twice succeeded")
	}
	a.waitSubscribed(1)
	a.publishN(3, 0)
	e := kvevents.EngineID{Pod: "pod-dyn", Model: "m"}
	sink.waitApplied(t, e, 2)
	if !s.RemoveEngine("pod-dyn") {
		t.Fatal("RemoveEngine reported nothing removed")
	}
	if s.RemoveEngine("pod-dyn") {
		t.Fatal("RemoveEngine removed twice")
	}
	a.publishN(10, 0) // nobody listens any more
	sink.wantCalls(t, e, []string{"0", "1", "2", "reset:removed"})
	if _, ok := streamOf(s, e); ok {
		t.Fatal("removed engine still has stats")
	}
	// Re-adding works and bootstraps from the engine's replay buffer.
	if err := s.AddEngine(ec); err != nil {
		t.Fatal(err)
	}
	a.waitSubscribed(2)
	a.publishN(11, 0)
	testutil.Await(t, waitTimeout, "the re-added engine", func() bool {
		c := sink.entries(e)
		return len(c) == 4+11 && c[len(c)-1].seq == 10
	})
	sink.wantCalls(t, e, append([]string{"0", "1", "2", "reset:removed"}, seqRange(0, 11)...))
}

func TestSubscriberCloseLeavesNoGoroutines(t *testing.T) {
	pub := newTestPublisher(t, pubOptions{})
	pub.publishN(5, 0)
	base := goroutineBaseline()
	for _, mode := range []string{"Close", "Run"} {
		sink := newRecSink()
		s, err := NewSubscriber(SubscriberConfig{
			Engines: []EngineConfig{connectCfg(pub, "pod-l"), {Name: "nowhere", Endpoint: "tcp://127.0.0.1:1", ReplayEndpoint: "tcp://127.0.0.1:11", Ranks: 3}},
			Listen:  "tcp://127.0.0.1:*",
			Pollers: 2,
		}, sink, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		e := kvevents.EngineID{Pod: "pod-l", Model: "m"}
		if mode == "Close" {
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			sink.waitApplied(t, e, 4) // bootstrap replay
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
		} else {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { done <- s.Run(ctx) }()
			sink.waitApplied(t, e, 4)
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		if sink.overlaps != 0 {
			t.Fatalf("%d overlapping Sink calls", sink.overlaps)
		}
		checkNoLeaks(t, base)
		if err := s.AddEngine(connectCfg(pub, "late")); err == nil {
			t.Fatal("AddEngine after Close succeeded")
		}
	}
}

func TestSubscriberConfigErrors(t *testing.T) {
	sink := newRecSink()
	tests := []struct {
		name string
		cfg  SubscriberConfig
		want string
	}{
		{"engine without name", SubscriberConfig{Engines: []EngineConfig{{Endpoint: "tcp://a:1"}}}, "without a name"},
		{"engine without endpoint", SubscriberConfig{Engines: []EngineConfig{{Name: "a"}}}, "no endpoint"},
		{"duplicate engine", SubscriberConfig{Engines: []EngineConfig{{Name: "a", Endpoint: "tcp://a:1"}, {Name: "a", Endpoint: "tcp://b:1"}}}, "twice"},
		{"ipc with ranks", SubscriberConfig{Engines: []EngineConfig{{Name: "a", Endpoint: "ipc:///tmp/x", Ranks: 2}}}, "cannot carry"},
		{"port overflow", SubscriberConfig{Engines: []EngineConfig{{Name: "a", Endpoint: "tcp://a:65535", Ranks: 2}}}, "cannot be offset"},
		{"too many ranks", SubscriberConfig{Engines: []EngineConfig{{Name: "a", Endpoint: "tcp://a:1", Ranks: kvevents.MaxDPRank + 1}}}, "exceed"},
		{"bad pattern", SubscriberConfig{Listen: "tcp://*:1", TopicPattern: "kv@{pod"}, "unclosed"},
		{"replay template without pod", SubscriberConfig{Listen: "tcp://*:1", ReplayTemplate: "tcp://replay:5558"}, "no {addr} or {pod}"},
		{"listen port out of range", SubscriberConfig{Listen: "tcp://127.0.0.1:99999"}, `Listen endpoint "tcp://127.0.0.1:99999": port "99999" is not in 1..65535`},
		{"ephemeral listen port for ranks", SubscriberConfig{Listen: "tcp://127.0.0.1:*", ListenRanks: 2}, "cannot be offset by the rank"},
		{"replay template port", SubscriberConfig{Listen: "tcp://*:1", ReplayTemplate: "tcp://{pod}:0"}, `port "0"`},
		{"engine at a wildcard", SubscriberConfig{Engines: []EngineConfig{{Name: "a", Endpoint: "tcp://*:5557"}}}, `Engines "a": endpoint "tcp://*:5557": "*" is not a host to connect to`},
		{"engine without port", SubscriberConfig{Engines: []EngineConfig{{Name: "a", Endpoint: "tcp://127.0.0.1"}}}, `Engines "a": endpoint "tcp://127.0.0.1": no port`},
		{"replay without port", SubscriberConfig{Engines: []EngineConfig{{Name: "a", Endpoint: "tcp://h:1", ReplayEndpoint: "tcp://h"}}}, `endpoint "tcp://h": no port`},
		{"overlapping ranks", SubscriberConfig{Engines: []EngineConfig{{Name: "a", Endpoint: "tcp://h:5557", ReplayEndpoint: "tcp://h:5558", Ranks: 2}}}, "overlap at 5558"},
		{"allow rules in connect mode", SubscriberConfig{Engines: []EngineConfig{{Name: "a", Endpoint: "tcp://h:1"}}, EngineAllow: []AllowRule{allowRule("a=10.0.0.1")}}, "bind mode"},
		{"allow rules on ipc", SubscriberConfig{Listen: "ipc:///tmp/kv", EngineAllow: []AllowRule{allowRule("a=10.0.0.1")}}, "needs a tcp Listen endpoint"},
		{"allow rules with a pod host", SubscriberConfig{Listen: "tcp://*:1", ReplayTemplate: "tcp://{pod}:5567", EngineAllow: []AllowRule{allowRule("*=10.0.0.0/8")}}, "want tcp://{addr}:PORT"},
		{"duplicate allow rule", SubscriberConfig{Listen: "tcp://*:1", EngineAllow: []AllowRule{allowRule("a=10.0.0.1"), allowRule("a=10.0.0.1/32")}}, `"a=10.0.0.1" given twice`},
		{"allow rule without network", SubscriberConfig{Listen: "tcp://*:1", EngineAllow: []AllowRule{{Pod: "a"}}}, "invalid network"},
		{"addr on ipc", SubscriberConfig{Listen: "ipc:///tmp/kv", ReplayTemplate: "tcp://{addr}:5567"}, "{addr} needs a tcp Listen endpoint"},
		{"engines sharing a port", SubscriberConfig{Engines: []EngineConfig{{Name: "a", Endpoint: "tcp://h:5557", Ranks: 2}, {Name: "b", Endpoint: "tcp://h:5558"}}}, `engine "b": event port 5558 is taken`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewSubscriber(tt.cfg, sink, nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one mentioning %q", err, tt.want)
			}
			// A configuration error, naming the setting at fault.
			ce, ok := configerr.As(err)
			if !ok || !ce.Usage() || !slices.Contains([]configerr.Field{"Engines", "Listen", "TopicPattern", "ReplayTemplate", "EngineAllow"}, ce.Field) {
				t.Fatalf("error %v (%T) is not a configuration error of a SubscriberConfig field", err, err)
			}
		})
	}
	if _, err := NewSubscriber(SubscriberConfig{}, nil, nil); err == nil {
		t.Fatal("nil Sink accepted")
	}
	s, err := NewSubscriber(SubscriberConfig{Listen: "tcp://256.0.0.1:1"}, sink, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err == nil {
		t.Fatal("binding an invalid address succeeded")
	}
}

// TestSubscriberBindModeRemovePod: removing a pod discovered on a listen
// socket resets it; if it keeps publishing it is discovered again and
// rebuilt from its replay buffer.
func TestSubscriberBindModeRemovePod(t *testing.T) {
	sink := newRecSink()
	s := startSubscriber(t, SubscriberConfig{Listen: "tcp://127.0.0.1:*", ReplayTemplate: "tcp://{pod}"}, sink)
	p := newTestPublisher(t, pubOptions{connect: s.ListenEndpoint()})
	pod := strings.TrimPrefix(p.ReplayEP, "tcp://")
	p.opts.topic = "kv@" + pod + "@m"
	p.waitSubscribed(1)
	p.publishN(5, 0)
	e := kvevents.EngineID{Pod: pod, Model: "m"}
	sink.waitApplied(t, e, 4)
	if !s.RemoveEngine(pod) {
		t.Fatal("RemoveEngine found nothing to remove")
	}
	if _, ok := streamOf(s, e); ok {
		t.Fatal("removed pod still has a stream")
	}
	p.publishN(8, 0)
	testutil.Await(t, waitTimeout, "the pod rediscovered", func() bool {
		a := sink.applied(e)
		return len(a) > 0 && a[len(a)-1] == 7
	})
	sink.wantCalls(t, e, append(append(seqRange(0, 5), "reset:removed"), seqRange(0, 8)...))
}

// TestSubscriberIdentityConflict: a listen socket never feeds the Sink
// under the identity of a configured engine, so the Sink's calls for one
// engine stay serial.
func TestSubscriberIdentityConflict(t *testing.T) {
	a := newTestPublisher(t, pubOptions{noReplay: true})
	sink := newRecSink()
	s := startSubscriber(t, SubscriberConfig{
		Engines: []EngineConfig{connectCfg(a, "pod-c")},
		Listen:  "tcp://127.0.0.1:*",
	}, sink)
	e := kvevents.EngineID{Pod: "pod-c", Model: "m"}
	waitReady(t, s, e)
	impostor := newTestPublisher(t, pubOptions{connect: s.ListenEndpoint(), noReplay: true, topic: "kv@pod-c@m"})
	impostor.waitSubscribed(1)
	impostor.publishN(3, 0)
	testutil.Await(t, waitTimeout, "the conflicts counted", func() bool {
		ls, _ := s.ListenerStats()
		return ls.Conflicts == 3
	})
	a.waitSubscribed(1)
	a.publishN(2, 0)
	sink.waitApplied(t, e, 1)
	sink.wantCalls(t, e, seqRange(0, 2))
	if n := len(s.Streams()); n != 1 {
		t.Fatalf("%d streams, want 1", n)
	}
}
