package zmqtransport

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
)

// TestSubscriberDuplicateBatchIgnored: a batch that arrives twice (same
// seq, same bytes) is dropped and counted, not taken for a restart.
func TestSubscriberDuplicateBatchIgnored(t *testing.T) {
	pub, sink, s, e := connectedEngine(t, pubOptions{}, SubscriberConfig{}, "pod-dup")
	pub.publishN(3, 0)
	sink.waitApplied(t, e, 2)
	pub.sendRaw([]byte{}, seqBytes(2), encodeTestBatch(t, 2, 0, kvevents.ShapeArray))
	pub.publishN(4, 0)
	sink.waitApplied(t, e, 3)
	sink.wantCalls(t, e, seqRange(0, 4))
	st := mustStream(t, s, e)
	if st.Duplicates != 1 || st.Restarts != 0 || st.Resets != 0 || st.Health != kvevents.HealthOK {
		t.Fatalf("stats %+v; want 1 duplicate, no restart, ok", st)
	}
}

// TestSubscriberGarbageLowerSeq: an undecodable payload never moves the
// sequence, so one under a lower seq cannot pass for a restart.
func TestSubscriberGarbageLowerSeq(t *testing.T) {
	pub, sink, s, e := connectedEngine(t, pubOptions{}, SubscriberConfig{}, "pod-garbage")
	pub.publishN(5, 0)
	sink.waitApplied(t, e, 4)
	pub.sendRaw([]byte{}, seqBytes(1), []byte{0xc1, 0xff})
	pub.publishN(6, 0)
	sink.waitApplied(t, e, 5)
	sink.wantCalls(t, e, seqRange(0, 6))
	st := mustStream(t, s, e)
	if st.DecodeErrors != 1 || st.Restarts != 0 || st.Resets != 0 || st.Gaps != 0 || st.Health != kvevents.HealthOK {
		t.Fatalf("stats %+v; want 1 decode error and nothing else", st)
	}
}

// TestSubscriberGarbageReplayed: an undecodable replayed batch counts as
// a missing reply: its seq is lost (degraded), the rest is applied.
func TestSubscriberGarbageReplayed(t *testing.T) {
	pub, sink, s, e := connectedEngine(t, pubOptions{}, SubscriberConfig{}, "pod-garbage-replay")
	pub.publishN(2, 0)
	sink.waitApplied(t, e, 1)
	pub.dropLive(2, 3)
	pub.publish([]byte{0xc1}) // seq 2, only ever replayed
	pub.publishN(5, 0)        // 3 only replayed, 4 live: the gap
	sink.waitApplied(t, e, 4)
	sink.wantCalls(t, e, []string{"0", "1", "3", "4"})
	st := mustStream(t, s, e)
	if st.DecodeErrors != 1 || st.LostBatches != 1 || st.Gaps != 1 || st.ReplaysFailed != 1 || st.Health != kvevents.HealthDegraded {
		t.Fatalf("stats %+v; want 1 decode error, 1 lost batch, degraded", st)
	}
}

// TestSubscriberFastRestartDetected: the engine restarts and its new
// process publishes past the old one's last seq before the subscriber
// reconnects. Only the print of the last applied batch tells the
// processes apart: the reconnect's replay shows another batch under it,
// so the old process's blocks are reset (no phantoms) and the new one's
// are bootstrapped.
func TestSubscriberFastRestartDetected(t *testing.T) {
	slow := SubscriberConfig{ReconnectIvl: 300 * time.Millisecond, ReconnectIvlMax: 300 * time.Millisecond}
	pub, sink, s, e := connectedEngine(t, pubOptions{}, slow, "pod-fast")
	pub.publishN(5, 0)
	sink.waitApplied(t, e, 4)
	pub.restart()
	pub.publishN(10, 0) // nobody subscribed yet: only the replay buffer has them
	pub.waitSubscribed(1)
	pub.publishN(11, 0)
	testutil.Await(t, waitTimeout, "the new process's batches", func() bool { return len(sink.entries(e)) == 17 })
	sink.wantCalls(t, e, append(append(seqRange(0, 5), "reset:restart"), seqRange(0, 11)...))
	sink.checkHashes(t, e)
	st := mustStream(t, s, e)
	if st.Restarts != 1 || st.ReplayRestarts != 1 || st.Health != kvevents.HealthOK || st.LastSeq != 10 {
		t.Fatalf("stats %+v; want 1 restart detected by replay, ok, last seq 10", st)
	}
}

// TestSubscriberRestartWithoutReplayUnconfirmed: an engine without a
// replay endpoint restarts; its first batches go out while the subscriber
// reconnects (lost, the slow joiner), and the first one heard carries the
// old process's next seq. Nothing can tell the processes apart, so the
// stream must not be ok with the old process's blocks: it is unconfirmed
// from the reconnect on, until the engine clears its cache.
func TestSubscriberRestartWithoutReplayUnconfirmed(t *testing.T) {
	pub, sink, s, e := connectedEngine(t, pubOptions{noReplay: true}, SubscriberConfig{}, "pod-norep")
	pub.publishN(5, 0)
	sink.waitApplied(t, e, 4)
	if st := mustStream(t, s, e); st.Health != kvevents.HealthOK {
		t.Fatalf("before the restart: %+v, want ok", st)
	}
	pub.restart()
	pub.publishN(5, 0) // seqs 0-4 of the new process: nobody hears them
	pub.waitSubscribed(1)
	pub.publishN(7, 0) // 5 and 6: the old process's next seqs
	sink.waitApplied(t, e, 6)
	sink.wantCalls(t, e, seqRange(0, 7))
	if st := mustStream(t, s, e); st.Health != kvevents.HealthUnconfirmed {
		t.Fatalf("after an unverifiable reconnect: %+v, want unconfirmed", st)
	}
	// The sink hears it too (kvevents.HealthSink): an index sheds what it
	// cannot vouch for first.
	if h := sink.healthOf(e); h != kvevents.HealthUnconfirmed {
		t.Errorf("the sink heard %v, want unconfirmed", h)
	}
	// AllBlocksCleared proves the state again.
	cleared, err := kvevents.AppendBatch(nil, &kvevents.Batch{TS: 1, Events: []kvevents.Event{{Kind: kvevents.AllBlocksCleared}}},
		kvevents.EncodeOptions{Shape: kvevents.ShapeArray})
	if err != nil {
		t.Fatal(err)
	}
	pub.publish(cleared)
	testutil.Await(t, waitTimeout, "ok after AllBlocksCleared", func() bool {
		st, _ := streamOf(s, e)
		return st.Health == kvevents.HealthOK
	})
}

// TestSubscriberSlowRestartDetected: a restarted engine that has not
// published yet is recognised on reconnecting (its replay holds nothing
// at the last applied seq), before any batch of the new process.
func TestSubscriberSlowRestartDetected(t *testing.T) {
	pub, sink, s, e := connectedEngine(t, pubOptions{}, SubscriberConfig{}, "pod-slow")
	pub.publishN(20, 0)
	sink.waitApplied(t, e, 19)
	pub.restart()
	pub.waitSubscribed(1)
	testutil.Await(t, waitTimeout, "the restart detected on reconnect", func() bool { return len(sink.entries(e)) == 21 })
	sink.wantCalls(t, e, append(seqRange(0, 20), "reset:restart"))
	pub.publishN(3, 0)
	sink.waitApplied(t, e, 2)
	sink.wantCalls(t, e, append(append(seqRange(0, 20), "reset:restart"), seqRange(0, 3)...))
	st := mustStream(t, s, e)
	if st.Restarts != 1 || st.ReplayRestarts != 1 || st.Health != kvevents.HealthOK {
		t.Fatalf("stats %+v; want 1 restart detected by replay, ok", st)
	}
}

// TestSubscriberResume: positions taken by Checkpoint resume a new
// Subscriber: the engine is verified by a replay from the position and
// only what it published since is applied; a new engine process, or one
// whose buffer no longer reaches back, is reset.
func TestSubscriberResume(t *testing.T) {
	tests := []struct {
		name     string
		keep     int  // the engine's replay buffer
		restart  bool // the engine restarts while kvindex is down
		want     []string
		health   kvevents.Health
		restarts uint64
	}{
		{name: "same process, buffer reaching back", keep: 10_000, want: seqRange(10, 15), health: kvevents.HealthOK},
		{name: "another process", keep: 10_000, restart: true, want: append([]string{"reset:restart"}, seqRange(0, 3)...),
			health: kvevents.HealthOK, restarts: 1},
		{name: "buffer moved past the position", keep: 3, want: append([]string{"reset:restart"}, seqRange(12, 15)...),
			health: kvevents.HealthUnconfirmed, restarts: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pub, sink, s, e := connectedEngine(t, pubOptions{keep: tt.keep}, SubscriberConfig{}, "pod-resume")
			pub.publishN(10, 0)
			sink.waitApplied(t, e, 9)
			var pos []kvevents.Position
			if err := s.Checkpoint(func(p []kvevents.Position) error { pos = slices.Clone(p); return nil }); err != nil {
				t.Fatal(err)
			}
			want := []kvevents.Position{{Engine: e, Seq: 9, Print: kvevents.BatchPrint(encodeTestBatch(t, 9, 0, kvevents.ShapeArray))}}
			if !slices.Equal(pos, want) {
				t.Fatalf("checkpoint %+v, want %+v", pos, want)
			}
			s.Close()

			// kvindex is down.
			if tt.restart {
				pub.restart()
				pub.publishN(3, 0)
			} else {
				pub.publishN(15, 0)
			}

			sink2 := newRecSink()
			s2 := startSubscriber(t, SubscriberConfig{Engines: []EngineConfig{connectCfg(pub, "pod-resume")}, Resume: pos}, sink2)
			testutil.Await(t, waitTimeout, "the resumed stream settles", func() bool { return len(sink2.entries(e)) == len(tt.want) })
			sink2.wantCalls(t, e, tt.want)
			sink2.checkHashes(t, e)
			st := mustStream(t, s2, e)
			if st.Health != tt.health || st.Restarts != tt.restarts || st.ReplayRestarts != tt.restarts || (tt.restarts == 0 && st.Verified != 1) {
				t.Fatalf("stats %+v; want %v, %d restarts detected by replay", st, tt.health, tt.restarts)
			}
		})
	}
}

// TestSubscriberBindModeResume: a resumed bind-mode stream exists from
// Start (restored, not connected) and verifies its engine on the engine's
// first batch.
func TestSubscriberBindModeResume(t *testing.T) {
	replayEP := "tcp://" + testutil.FreeAddr(t)
	pod := strings.TrimPrefix(replayEP, "tcp://")
	e := kvevents.EngineID{Pod: pod, Model: "m"}
	// The earlier kvindex applied batches 0..4 of this engine process.
	pos := kvevents.Position{Engine: e, Seq: 4, Print: kvevents.BatchPrint(encodeTestBatch(t, 4, 0, kvevents.ShapeArray))}
	sink := newRecSink()
	s := startSubscriber(t, SubscriberConfig{Listen: "tcp://127.0.0.1:*", ReplayTemplate: "tcp://{pod}", Resume: []kvevents.Position{pos}}, sink)
	st, ok := streamOf(s, e)
	if !ok || st.Health != kvevents.HealthRestored || st.Connected || st.LastSeq != 4 || !st.Bind {
		t.Fatalf("resumed stream before its engine connects: %+v (found %v); want restored, not connected, last seq 4", st, ok)
	}
	// A checkpoint taken now carries the position forward.
	var got []kvevents.Position
	if err := s.Checkpoint(func(p []kvevents.Position) error { got = slices.Clone(p); return nil }); err != nil {
		t.Fatal(err)
	}
	if want := pos; len(got) != 1 || got[0].Engine != want.Engine || got[0].Seq != want.Seq || got[0].Print != want.Print || got[0].Health != kvevents.HealthRestored {
		t.Fatalf("checkpoint %+v; want %+v, restored", got, want)
	}

	p := newTestPublisher(t, pubOptions{connect: s.ListenEndpoint(), replayAt: replayEP, topic: "kv@" + pod + "@m"})
	p.dropLive(0, 1, 2, 3, 4) // published while kvindex was down
	p.publishN(5, 0)
	p.waitSubscribed(1)
	p.publishN(8, 0)
	sink.waitApplied(t, e, 7)
	sink.wantCalls(t, e, seqRange(5, 8))
	st = mustStream(t, s, e)
	if st.Health != kvevents.HealthOK || st.Verified != 1 || st.Restarts != 0 || !st.Connected {
		t.Fatalf("stats %+v; want verified, ok", st)
	}
}

// TestSubscriberBindModeNewConnectionVerifies: in bind mode a restarted
// engine reconnects to the listener; its first batch to arrive may be
// exactly the old process's last seq + 1, which only the new connection
// betrays: the stream verifies the engine before applying it.
func TestSubscriberBindModeNewConnectionVerifies(t *testing.T) {
	sink := newRecSink()
	s := startSubscriber(t, SubscriberConfig{Listen: "tcp://127.0.0.1:*", ReplayTemplate: "tcp://{pod}"}, sink)
	p := newTestPublisher(t, pubOptions{connect: s.ListenEndpoint()})
	pod := strings.TrimPrefix(p.ReplayEP, "tcp://")
	p.opts.topic = "kv@" + pod + "@m"
	e := kvevents.EngineID{Pod: pod, Model: "m"}
	p.waitSubscribed(1)
	p.publishN(5, 0)
	sink.waitApplied(t, e, 4)
	restartPastOldSeq(t, p, s, sink, e)
}

// restartPastOldSeq restarts p's engine process (its sockets anew) after
// it published seqs 0-4: the new process's own 0-4 are lost before its
// connection subscribes, and the first batch heard, seq 5, would continue
// the old process's stream. The stream must prove the restart by replay:
// the old blocks reset, the new process's batches applied, ok.
func restartPastOldSeq(t *testing.T, p *testPublisher, s *Subscriber, sink *recSink, e kvevents.EngineID) {
	t.Helper()
	p.restart()
	p.dropLive(0, 1, 2, 3, 4) // lost before the new connection subscribed
	p.publishN(5, 0)
	p.waitSubscribed(1)
	p.publishN(6, 0) // seq 5: would continue the old process's stream
	testutil.Await(t, waitTimeout, "the new process's batches", func() bool { return len(sink.entries(e)) == 12 })
	sink.wantCalls(t, e, append(append(seqRange(0, 5), "reset:restart"), seqRange(0, 6)...))
	st := mustStream(t, s, e)
	if st.Restarts != 1 || st.ReplayRestarts != 1 || st.Health != kvevents.HealthOK || st.ReplaysFailed != 0 {
		t.Fatalf("stats %+v; want 1 restart detected by replay, ok, no failed replay", st)
	}
}

// TestSubscriberRestartReplayOnFreshSocket: the replay connection to the
// old engine process stays open after it is gone (the proxy stalls it, as
// a vanished peer would look, or as a close libzmq has not yet noticed).
// A verifying replay sent into it would be lost and the stream would turn
// unconfirmed; a new event connection gets a fresh replay socket, so the
// restart is proven.
func TestSubscriberRestartReplayOnFreshSocket(t *testing.T) {
	for _, bind := range []bool{false, true} {
		t.Run(map[bool]string{false: "connect", true: "bind"}[bind], func(t *testing.T) {
			sink := newRecSink()
			var (
				s *Subscriber
				p *testPublisher
				e kvevents.EngineID
			)
			if bind {
				s = startSubscriber(t, SubscriberConfig{Listen: "tcp://127.0.0.1:*", ReplayTemplate: "tcp://{pod}"}, sink)
				p = newTestPublisher(t, pubOptions{connect: s.ListenEndpoint()})
			} else {
				p = newTestPublisher(t, pubOptions{topic: "kv"})
			}
			px := testutil.NewTCPProxy(t, strings.TrimPrefix(p.ReplayEP, "tcp://"))
			if bind {
				p.opts.topic = "kv@" + px.Addr() + "@m"
				e = kvevents.EngineID{Pod: px.Addr(), Model: "m"}
			} else {
				ec := connectCfg(p, "pod-stale")
				ec.ReplayEndpoint = "tcp://" + px.Addr()
				s = startSubscriber(t, SubscriberConfig{Engines: []EngineConfig{ec}}, sink)
				e = kvevents.EngineID{Pod: "pod-stale", Model: "m"}
			}
			p.waitSubscribed(1)
			p.publishN(5, 0)
			sink.waitApplied(t, e, 4)
			px.Stall()
			restartPastOldSeq(t, p, s, sink, e)
		})
	}
}

// TestSubscriberBindModeDepartedEngineDisconnected: in bind mode an engine
// whose connection closed is reported not connected, even while other
// engines stay connected to the same listener.
func TestSubscriberBindModeDepartedEngineDisconnected(t *testing.T) {
	sink := newRecSink()
	s := startSubscriber(t, SubscriberConfig{Listen: "tcp://127.0.0.1:*"}, sink)
	pubs, ids := publishToListener(t, s, sink, "stays", "leaves")
	for _, e := range ids {
		if !mustStream(t, s, e).Connected {
			t.Fatalf("%v not connected while publishing", e)
		}
	}
	pubs[1].Close()
	testutil.Await(t, waitTimeout, "the departed engine reported disconnected", func() bool { return !mustStream(t, s, ids[1]).Connected })
	if !mustStream(t, s, ids[0]).Connected {
		t.Fatalf("%v reported disconnected; only the other engine left", ids[0])
	}
}

// TestSubscriberBindModeForgetsDepartedEngines: an engine whose connection
// has been gone for ForgetAfter is forgotten (its entries reset, its
// stream gone, counted), as is a resumed engine that never showed up; a
// connected one stays however long it is quiet, and a forgotten one that
// publishes again returns as a new engine.
func TestSubscriberBindModeForgetsDepartedEngines(t *testing.T) {
	sink := newRecSink()
	never := kvevents.EngineID{Pod: "never-came-back", Model: "m"}
	s := startSubscriber(t, SubscriberConfig{Listen: "tcp://127.0.0.1:*", ForgetAfter: 100 * time.Millisecond,
		Resume: []kvevents.Position{{Engine: never, Seq: 9, Print: 1}}}, sink)
	pubs, ids := publishToListener(t, s, sink, "stays", "leaves")
	pubs[1].Close()
	testutil.Await(t, waitTimeout, "the departed engine forgotten", func() bool { _, ok := streamOf(s, ids[1]); return !ok })
	testutil.Await(t, waitTimeout, "the resumed engine that never came forgotten", func() bool { _, ok := streamOf(s, never); return !ok })
	if calls := sink.entries(ids[1]); len(calls) == 0 || calls[len(calls)-1].reset != kvevents.ResetRemoved {
		t.Errorf("the departed engine's last sink call %+v; want a reset (removed)", calls)
	}
	if ls, _ := s.ListenerStats(); ls.ForgottenEngines != 2 {
		t.Errorf("ForgottenEngines %d, want 2", ls.ForgottenEngines)
	}
	// The engine that stayed connected is kept, however long it is quiet:
	// a later sweep (several ForgetAfter periods on) still lists it.
	time.Sleep(300 * time.Millisecond) // quiet time is the condition under test, not synchronisation
	if st := mustStream(t, s, ids[0]); !st.Connected {
		t.Fatalf("the quiet connected engine: %+v", st)
	}
	p := newTestPublisher(t, pubOptions{connect: s.ListenEndpoint(), topic: "kv@leaves@m"})
	p.waitSubscribed(1)
	p.publishN(2, 0)
	testutil.Await(t, waitTimeout, "the forgotten engine back", func() bool { st, ok := streamOf(s, ids[1]); return ok && st.Connected })
}

// publishToListener connects a publisher per pod to s's listen socket and
// has each publish batches 0..2, applied before it returns.
func publishToListener(t *testing.T, s *Subscriber, sink *recSink, pods ...string) ([]*testPublisher, []kvevents.EngineID) {
	t.Helper()
	var pubs []*testPublisher
	var ids []kvevents.EngineID
	for _, pod := range pods {
		p := newTestPublisher(t, pubOptions{connect: s.ListenEndpoint(), topic: "kv@" + pod + "@m"})
		p.waitSubscribed(1)
		p.publishN(3, 0)
		e := kvevents.EngineID{Pod: pod, Model: "m"}
		sink.waitApplied(t, e, 2)
		pubs, ids = append(pubs, p), append(ids, e)
	}
	return pubs, ids
}
