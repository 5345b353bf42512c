package natstransport_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/natstransport"
)

// Relays fed by simulated engines, three replicas reading the stream: every
// replica's index equals the index built by applying the same batches
// directly.
func TestReplicasMatchDirectApply(t *testing.T) {
	ns := startNATS(t)
	_, js := connect(t, ns.url())
	s := ensureStream(t, js)
	f := newFleet(t, 4, 2)
	// Two relays (two nodes), each with its own engines.
	relays := []*natstransport.Relay{startRelay(t, js, natstransport.RelayConfig{}), startRelay(t, js, natstransport.RelayConfig{})}
	var first []batch
	reps := []*replica{startReplica(t, js, natstransport.ConsumerConfig{}, nil)} // one from an empty stream
	all := f.run(t, 300)
	for _, b := range all {
		relays[b.engine.DPRank%2].ApplyPayload(b.engine, b.seq, b.payload, nil)
	}
	first = append(first, all...)
	for _, r := range relays {
		awaitPublished(t, r, r.Stats().Batches)
	}
	reps = append(reps, startReplica(t, js, natstransport.ConsumerConfig{}, nil), startReplica(t, js, natstransport.ConsumerConfig{}, nil))
	last := lastSeq(t, s)
	if last != uint64(len(first)) {
		t.Fatalf("stream holds %d records, want %d", last, len(first))
	}
	want := directIndex(t, first).Digest()
	for i, r := range reps {
		awaitChan(t, "caught up", r.c.CaughtUp())
		testutil.Await(t, awaitBound, "replica applied the stream", func() bool { return r.c.AppliedSeq() == last })
		if got := r.digest(t); got != want {
			t.Errorf("replica %d digest %x, want %x", i, got[:8], want[:8])
		}
		for _, st := range r.c.Streams() {
			if st.Health != kvevents.HealthOK || st.Gaps != 0 || st.Duplicates != 0 || st.DecodeErrors != 0 {
				t.Errorf("replica %d stream %v: %+v", i, st.Engine, st)
			}
		}
		if n := len(r.c.Streams()); n != len(f.engines) {
			t.Errorf("replica %d has %d streams, want %d", i, n, len(f.engines))
		}
	}
}

// A replica restored from a checkpoint (index snapshot, AppliedSeq,
// positions) and restarted from AppliedSeq+1 catches up and matches the
// replicas that never stopped.
func TestRestoreFromCheckpoint(t *testing.T) {
	ns := startNATS(t)
	_, js := connect(t, ns.url())
	s := ensureStream(t, js)
	f := newFleet(t, 3, 1)
	relay := startRelay(t, js, natstransport.RelayConfig{})
	live := startReplica(t, js, natstransport.ConsumerConfig{}, nil)
	old := startReplica(t, js, natstransport.ConsumerConfig{}, nil)

	feed(relay, f.run(t, 200))
	awaitPublished(t, relay, relay.Stats().Batches)
	mid := lastSeq(t, s)
	testutil.Await(t, awaitBound, "old replica applied", func() bool { return old.c.AppliedSeq() == mid })
	var snap bytes.Buffer
	var seq uint64
	var pos []kvevents.Position
	if err := old.c.Checkpoint(func(streamSeq uint64, p []kvevents.Position) error {
		seq, pos = streamSeq, p
		return old.ix.Snapshot(&snap)
	}); err != nil {
		t.Fatal(err)
	}
	if seq != mid || len(pos) != len(f.engines) {
		t.Fatalf("checkpoint at %d with %d positions, want %d and %d", seq, len(pos), mid, len(f.engines))
	}
	old.c.Close()

	feed(relay, f.run(t, 200)) // while the replica is away
	awaitPublished(t, relay, relay.Stats().Batches)
	ix := newIndex(t)
	if err := ix.Restore(&snap); err != nil {
		t.Fatal(err)
	}
	restored := startReplica(t, js, natstransport.ConsumerConfig{StartSeq: seq + 1, Resume: pos}, ix)
	if restored.c.AppliedSeq() != seq {
		t.Fatalf("restored AppliedSeq %d before reading, want %d", restored.c.AppliedSeq(), seq)
	}
	awaitChan(t, "caught up", restored.c.CaughtUp())
	feed(relay, f.run(t, 50))
	awaitPublished(t, relay, relay.Stats().Batches)
	last := lastSeq(t, s)
	for _, r := range []*replica{live, restored} {
		testutil.Await(t, awaitBound, "replica applied", func() bool { return r.c.AppliedSeq() == last })
	}
	if got, want := restored.digest(t), live.digest(t); got != want {
		t.Fatalf("restored digest %x, live %x", got[:8], want[:8])
	}
	if want := directIndex(t, f.batches).Digest(); live.digest(t) != want {
		t.Fatal("live replica differs from a direct apply")
	}
	for _, st := range restored.c.Streams() {
		if st.Health != kvevents.HealthOK || st.Gaps != 0 || st.Restarts != 0 {
			t.Errorf("restored stream %v: %+v", st.Engine, st)
		}
	}
}

// A NATS server restart (same store, same port) loses nothing: the relay
// re-publishes what was not acknowledged, the consumers recreate their
// ordered consumers, and every replica still matches a direct apply.
func TestServerRestart(t *testing.T) {
	ns := startNATS(t)
	_, js := connect(t, ns.url())
	s := ensureStream(t, js)
	f := newFleet(t, 3, 1)
	_, rjs := connect(t, ns.url())
	relay := startRelay(t, rjs, natstransport.RelayConfig{PublishTimeout: 200 * time.Millisecond})
	reps := []*replica{startReplica(t, js, natstransport.ConsumerConfig{}, nil)}
	_, js2 := connect(t, ns.url())
	reps = append(reps, startReplica(t, js2, natstransport.ConsumerConfig{}, nil))

	feed(relay, f.run(t, 150))
	awaitPublished(t, relay, relay.Stats().Batches)
	before := lastSeq(t, s)
	testutil.Await(t, awaitBound, "replicas applied", func() bool {
		return reps[0].c.AppliedSeq() == before && reps[1].c.AppliedSeq() == before
	})

	// Batches handed over while the server goes down and comes back: some
	// are in flight when it stops.
	feed(relay, f.run(t, 50))
	ns.restart()
	feed(relay, f.run(t, 100))
	awaitPublished(t, relay, relay.Stats().Batches)
	// And batches handed over while it is down: the relay holds them and
	// retries until the server is back.
	ns.stop()
	feed(relay, f.run(t, 50))
	testutil.Await(t, awaitBound, "publish errors while the server is down", func() bool { return relay.Stats().PublishErrors > 0 })
	ns.start()
	feed(relay, f.run(t, 50))
	awaitPublished(t, relay, relay.Stats().Batches)

	last := lastSeq(t, s)
	if last != uint64(len(f.batches)) {
		t.Fatalf("stream holds %d records after the restart, want %d (each batch once)", last, len(f.batches))
	}
	want := directIndex(t, f.batches).Digest()
	for i, r := range reps {
		testutil.Await(t, awaitBound, "replica applied after the restart", func() bool { return r.c.AppliedSeq() == last })
		if got := r.digest(t); got != want {
			t.Errorf("replica %d digest differs after the server restart", i)
		}
		for _, st := range r.c.Streams() {
			if st.Health != kvevents.HealthOK || st.Duplicates != 0 || st.Gaps != 0 {
				t.Errorf("replica %d stream %v: %+v", i, st.Engine, st)
			}
		}
		if rs := r.c.Stats(); rs.Malformed != 0 {
			t.Errorf("replica %d: %+v", i, rs)
		}
	}
}

// Re-publishing the same batches (a relay restarted, replaying the
// engines' buffers) stores nothing twice: JetStream drops them by
// Nats-Msg-Id, the stream's count does not move and the consumers see
// no duplicate.
func TestRepublishStoresNothingTwice(t *testing.T) {
	ns := startNATS(t)
	_, js := connect(t, ns.url())
	s := ensureStream(t, js)
	f := newFleet(t, 2, 2)
	rep := startReplica(t, js, natstransport.ConsumerConfig{}, nil)
	bs := f.run(t, 120)

	r1, err := natstransport.NewRelay(js, natstransport.RelayConfig{Model: testModel}, quiet())
	if err != nil {
		t.Fatal(err)
	}
	if err := r1.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	feed(r1, bs)
	awaitPublished(t, r1, uint64(len(bs)))
	if err := r1.Close(); err != nil {
		t.Fatal(err)
	}
	stored := msgCount(t, s)
	if stored != uint64(len(bs)) {
		t.Fatalf("stream holds %d, want %d", stored, len(bs))
	}

	r2 := startRelay(t, js, natstransport.RelayConfig{})
	feed(r2, bs) // the same batches again
	more := f.run(t, 10)
	feed(r2, more)
	awaitPublished(t, r2, uint64(len(bs)+len(more)))
	if st := r2.Stats(); st.Duplicates != uint64(len(bs)) {
		t.Errorf("second relay: %d acks marked duplicate, want %d", st.Duplicates, len(bs))
	}
	if got, want := msgCount(t, s), uint64(len(bs)+len(more)); got != want {
		t.Fatalf("stream holds %d after the re-publish, want %d", got, want)
	}
	last := lastSeq(t, s)
	testutil.Await(t, awaitBound, "replica applied", func() bool { return rep.c.AppliedSeq() == last })
	var applied uint64
	for _, st := range rep.c.Streams() {
		applied += st.Batches
		if st.Duplicates != 0 || st.Restarts != 0 {
			t.Errorf("stream %v: %+v", st.Engine, st)
		}
	}
	if applied != uint64(len(f.batches)) {
		t.Errorf("replica applied %d batches, want %d", applied, len(f.batches))
	}
	if rep.digest(t) != directIndex(t, f.batches).Digest() {
		t.Error("replica differs from a direct apply")
	}
}

// A relay cut off from NATS longer than its buffer holds: its engines'
// streams go disconnected while it is silent, and degraded once its hole
// record arrives; the relay counts what it dropped.
func TestRelayCutOff(t *testing.T) {
	ns := startNATS(t)
	_, js := connect(t, ns.url())
	s := ensureStream(t, js)
	f := newFleet(t, 2, 1)
	px := testutil.NewTCPProxy(t, ns.s.Addr().String())
	_, rjs := connect(t, "nats://"+px.Addr())
	relay := startRelay(t, rjs, natstransport.RelayConfig{
		MaxBuffer: 16 << 10, Heartbeat: 20 * time.Millisecond, PublishTimeout: 200 * time.Millisecond,
	})
	rep := startReplica(t, js, natstransport.ConsumerConfig{RelayTimeout: 300 * time.Millisecond}, nil)

	for _, b := range f.run(t, 40) { // one at a time: within the small buffer
		feed(relay, []batch{b})
		awaitPublished(t, relay, relay.Stats().Batches)
	}
	testutil.Await(t, awaitBound, "streams connected", func() bool {
		ss := rep.c.Streams()
		return len(ss) == 2 && ss[0].Connected && ss[1].Connected
	})

	px.Cut()
	testutil.Await(t, awaitBound, "relay disconnected", func() bool { return !relay.Stats().NATSConnected })
	testutil.Await(t, awaitBound, "streams disconnected", func() bool {
		ss := rep.c.Streams()
		return !ss[0].Connected && !ss[1].Connected
	})
	feed(relay, f.run(t, 200))
	st := relay.Stats()
	if st.DroppedBatches == 0 || st.BufferedBytes > 16<<10 {
		t.Fatalf("relay while cut off: %+v (want drops, buffer within its bound)", st)
	}
	for _, x := range rep.c.Streams() {
		if x.Health != kvevents.HealthOK {
			t.Errorf("stream %v %v before the hole arrived", x.Engine, x.Health)
		}
	}

	px.Restore()
	// Holes first, then the buffer: read in one Stats, the buffer could
	// be read empty just before the holes were queued.
	testutil.Await(t, awaitBound, "relay announcing the holes", func() bool { return relay.Stats().Holes > 0 })
	testutil.Await(t, awaitBound, "relay drained", func() bool { return relay.Stats().BufferedRecords == 0 })
	last := lastSeq(t, s)
	testutil.Await(t, awaitBound, "replica applied", func() bool { return rep.c.AppliedSeq() == last })
	testutil.Await(t, awaitBound, "streams reconnected", func() bool {
		ss := rep.c.Streams()
		return ss[0].Connected && ss[1].Connected
	})
	var lost uint64
	for _, x := range rep.c.Streams() {
		lost += x.LostBatches
		if x.LostBatches > 0 && x.Health != kvevents.HealthDegraded {
			t.Errorf("stream %v lost %d batches but is %v", x.Engine, x.LostBatches, x.Health)
		}
	}
	if lost != relay.Stats().DroppedBatches {
		t.Errorf("replica counts %d lost batches, relay dropped %d", lost, relay.Stats().DroppedBatches)
	}
}

// Garbage published straight to the stream (bad subjects, headers,
// payloads) is counted and logged, never applied, and the engines around
// it are applied as if it were not there.
func TestHostileRecords(t *testing.T) {
	ns := startNATS(t)
	_, js := connect(t, ns.url())
	s := ensureStream(t, js)
	f := newFleet(t, 2, 1)
	relay := startRelay(t, js, natstransport.RelayConfig{})
	log, warns := newCountingLogger()
	ix := newIndex(t)
	c, err := natstransport.NewConsumer(js, natstransport.ConsumerConfig{Model: testModel}, ix, log)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rep := &replica{c, ix}

	feed(relay, f.run(t, 30))
	awaitPublished(t, relay, relay.Stats().Batches)
	model := natstransport.EscapeToken(testModel)
	good := natstransport.Record{Kind: natstransport.KindBatch, Seq: 5, Print: 7}
	hostile := []struct {
		name    string
		subject string
		header  nats.Header
		data    []byte
	}{
		{"no headers", "kvevents." + model + ".x.0", nil, []byte("junk")},
		{"extra token", "kvevents." + model + ".x.0.1", good.Header(), nil},
		{"bad escape", "kvevents." + model + ".x_zz.0", good.Header(), nil},
		{"rank too large", "kvevents." + model + ".x.99999", good.Header(), nil},
		{"bad kind", "kvevents." + model + ".x.0", nats.Header{natstransport.HeaderKind: {"evil"}}, nil},
		{"bad seq", "kvevents." + model + ".x.0", nats.Header{
			natstransport.HeaderKind: {"batch"}, natstransport.HeaderHealth: {"ok"},
			natstransport.HeaderSeq: {"-1"}, natstransport.HeaderPrint: {"0000000000000007"}}, nil},
		{"reversed hole", "kvevents." + model + ".x.0", nats.Header{
			natstransport.HeaderKind: {"hole"}, natstransport.HeaderHealth: {"ok"},
			natstransport.HeaderFrom: {"9"}, natstransport.HeaderTo: {"3"}}, nil},
	}
	for _, h := range hostile {
		if _, err := js.PublishMsg(context.Background(), &nats.Msg{Subject: h.subject, Header: h.header, Data: h.data}); err != nil {
			t.Fatalf("%s: %v", h.name, err)
		}
	}
	// Well-formed headers over a garbage payload, for an engine of its own.
	if _, err := js.PublishMsg(context.Background(), &nats.Msg{Subject: "kvevents." + model + ".garbage.0",
		Header: (&natstransport.Record{Kind: natstransport.KindBatch, Seq: 0, Print: 1}).Header(), Data: []byte{0xc1, 0xff, 0x00}}); err != nil {
		t.Fatal(err)
	}
	// A heartbeat that is not JSON.
	if err := js.Conn().Publish(natstransport.HeartbeatSubject(testModel, "evil"), []byte("{")); err != nil {
		t.Fatal(err)
	}
	feed(relay, f.run(t, 30))
	awaitPublished(t, relay, relay.Stats().Batches)
	last := lastSeq(t, s)
	testutil.Await(t, awaitBound, "replica applied", func() bool { return c.AppliedSeq() == last })
	testutil.Await(t, awaitBound, "bad heartbeat counted", func() bool { return c.Stats().BadBeats == 1 })
	if st := c.Stats(); st.Malformed != uint64(len(hostile)) {
		t.Errorf("malformed %d, want %d", st.Malformed, len(hostile))
	}
	var garbage kvevents.StreamStats
	for _, st := range c.Streams() {
		if st.Engine.Pod == "garbage" {
			garbage = st
			continue
		}
		if st.Health != kvevents.HealthOK || st.DecodeErrors != 0 {
			t.Errorf("engine %v hurt by garbage: %+v", st.Engine, st)
		}
	}
	if garbage.DecodeErrors != 1 || garbage.Health != kvevents.HealthDegraded || garbage.Batches != 0 {
		t.Errorf("garbage engine: %+v", garbage)
	}
	if warns.Load() < int64(len(hostile)+1) {
		t.Errorf("%d warnings logged, want one per bad record at least", warns.Load())
	}
	if rep.digest(t) != directIndex(t, f.batches).Digest() {
		t.Error("index differs from a direct apply of the good batches")
	}
}

// Reset records and restarts: the engine's blocks go, the new process's
// batches are applied from its seq 0.
func TestEngineRestartAndReset(t *testing.T) {
	ns := startNATS(t)
	_, js := connect(t, ns.url())
	s := ensureStream(t, js)
	f := newFleet(t, 1, 1)
	relay := startRelay(t, js, natstransport.RelayConfig{})
	rep := startReplica(t, js, natstransport.ConsumerConfig{}, nil)
	feed(relay, f.run(t, 20))
	e := f.engines[0]
	id := e.EngineID()

	// A restart the relay did not announce (it restarted too): seq goes
	// back to 0 with another batch.
	e.Restart()
	feed(relay, f.run(t, 20))
	// One it announces.
	relay.Reset(id, kvevents.ResetRestart)
	e.Restart()
	announcedAt := len(f.batches)
	feed(relay, f.run(t, 20))
	awaitPublished(t, relay, relay.Stats().Batches+1)
	last := lastSeq(t, s)
	testutil.Await(t, awaitBound, "replica applied", func() bool { return rep.c.AppliedSeq() == last })
	st := rep.c.Streams()[0]
	if st.Restarts != 1 || st.Resets != 2 || st.Health != kvevents.HealthOK {
		t.Errorf("stream after two restarts: %+v", st)
	}
	if rep.digest(t) != directIndex(t, f.batches[announcedAt:]).Digest() {
		t.Error("index holds more than the last engine process's blocks")
	}
}

// An engine removed (its pod gone) leaves the replica's streams and index;
// the same rank coming back is a new stream, counted from its first batch.
func TestEngineRemovedAndBack(t *testing.T) {
	ns := startNATS(t)
	_, js := connect(t, ns.url())
	s := ensureStream(t, js)
	f := newFleet(t, 2, 1)
	relay := startRelay(t, js, natstransport.RelayConfig{})
	rep := startReplica(t, js, natstransport.ConsumerConfig{}, nil)
	feed(relay, f.run(t, 40))
	gone := f.engines[0]
	relay.Reset(gone.EngineID(), kvevents.ResetRemoved)
	awaitPublished(t, relay, relay.Stats().Batches+1)
	last := lastSeq(t, s)
	testutil.Await(t, awaitBound, "replica applied the removal", func() bool { return rep.c.AppliedSeq() == last })
	streams := rep.c.Streams()
	if len(streams) != 1 || streams[0].Engine == gone.EngineID() {
		t.Fatalf("streams after the removal: %+v", streams)
	}
	var kept []batch
	for _, b := range f.batches {
		if b.engine != gone.EngineID() {
			kept = append(kept, b)
		}
	}
	if rep.digest(t) != directIndex(t, kept).Digest() {
		t.Error("index still holds the removed engine's blocks")
	}

	gone.Restart()
	back := len(f.batches)
	for len(f.batches) == back || f.batches[len(f.batches)-1].engine != gone.EngineID() {
		feed(relay, f.run(t, 1))
	}
	kept = append(kept, f.batches[back:]...)
	var again uint64
	for _, b := range f.batches[back:] {
		if b.engine == gone.EngineID() {
			again++
		}
	}
	awaitPublished(t, relay, relay.Stats().Batches+1)
	last = lastSeq(t, s)
	testutil.Await(t, awaitBound, "replica applied the return", func() bool { return rep.c.AppliedSeq() == last })
	var found bool
	for _, st := range rep.c.Streams() {
		if st.Engine != gone.EngineID() {
			continue
		}
		found = true
		if st.Batches != again || st.Health != kvevents.HealthOK || st.Gaps != 0 || st.Restarts != 0 {
			t.Errorf("returned engine: %+v, want %d batches from a fresh start", st, again)
		}
	}
	if !found {
		t.Error("returned engine not among the streams")
	}
	if rep.digest(t) != directIndex(t, kept).Digest() {
		t.Error("index differs from a direct apply of the kept and returned batches")
	}
}
