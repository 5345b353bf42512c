package natstransport_test

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/natstransport"
)

var testKey = []byte("0123456789abcdef0123456789abcdef")

func mustAuth(t testing.TB, key []byte) *natstransport.Auth {
	t.Helper()
	a, err := natstransport.NewAuth(key)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// A code covers the subject, every Kvindex-* header and the payload, and
// nothing else; a short key is refused.
func TestAuthSignVerify(t *testing.T) {
	if _, err := natstransport.NewAuth([]byte("short")); err == nil {
		t.Fatal("a 5-byte key accepted")
	}
	a := mustAuth(t, testKey)
	rec := natstransport.Record{Kind: natstransport.KindBatch, Seq: 5, Print: 7, Health: kvevents.HealthOK}
	signed := func() *nats.Msg {
		m := &nats.Msg{Subject: "kvevents.m.pod-a.0", Header: rec.Header(), Data: []byte("payload")}
		m.Header.Set(jetstream.MsgIDHeader, "id")
		a.Sign(m)
		return m
	}
	m := signed()
	if err := a.Verify(m.Subject, m.Header, m.Data); err != nil {
		t.Fatalf("a signed record: %v", err)
	}
	for _, tt := range []struct {
		name string
		edit func(m *nats.Msg)
		want error
	}{
		{"another pod's subject", func(m *nats.Msg) { m.Subject = "kvevents.m.pod-b.0" }, natstransport.ErrBadMAC},
		{"a header changed", func(m *nats.Msg) { m.Header.Set(natstransport.HeaderSeq, "6") }, natstransport.ErrBadMAC},
		{"a header added", func(m *nats.Msg) { m.Header.Set(natstransport.HeaderReason, "restart") }, natstransport.ErrBadMAC},
		{"a payload byte", func(m *nats.Msg) { m.Data = []byte("paylaod") }, natstransport.ErrBadMAC},
		{"another key", func(m *nats.Msg) { mustAuth(t, append([]byte("x"), testKey...)).Sign(m) }, natstransport.ErrBadMAC},
		{"no code", func(m *nats.Msg) { m.Header.Del(natstransport.HeaderMAC) }, natstransport.ErrNoMAC},
		{"not hex", func(m *nats.Msg) { m.Header.Set(natstransport.HeaderMAC, "zz") }, natstransport.ErrBadMAC},
		{"the message id (not a kvindex header)", func(m *nats.Msg) { m.Header.Set(jetstream.MsgIDHeader, "other") }, nil},
	} {
		m := signed()
		tt.edit(m)
		if err := a.Verify(m.Subject, m.Header, m.Data); !errors.Is(err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
}

// With a key, a replica applies only what a relay with the key wrote, on
// a real nats-server that anyone may write to: a forged batch for a new
// pod, a captured record re-published under another pod's subject, a
// forged reset of a real pod and a forged heartbeat are all refused and
// counted, and the index is exactly the relay's batches.
func TestForgedRecordsRefused(t *testing.T) {
	ns := startNATS(t)
	_, js := connect(t, ns.url())
	s := ensureStream(t, js)
	f := newFleet(t, 2, 1)
	relay := startRelay(t, js, natstransport.RelayConfig{Auth: mustAuth(t, testKey)})
	rep := startReplica(t, js, natstransport.ConsumerConfig{Auth: mustAuth(t, testKey)}, nil)
	feed(relay, f.run(t, 30))
	awaitPublished(t, relay, relay.Stats().Batches)

	// A captured record of pod 0, re-published under pod 1's subject.
	real0 := natstransport.BatchSubject(f.engines[0].EngineID())
	cons, err := s.OrderedConsumer(context.Background(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{real0}})
	if err != nil {
		t.Fatal(err)
	}
	captured, err := cons.Next()
	if err != nil {
		t.Fatal(err)
	}
	other := natstransport.BatchSubject(f.engines[1].EngineID())
	forged := []*nats.Msg{
		{Subject: other, Header: captured.Headers(), Data: captured.Data()},
		// A batch for a pod nobody runs, well formed but unsigned.
		{Subject: "kvevents." + natstransport.EscapeToken(testModel) + ".ghost.0",
			Header: (&natstransport.Record{Kind: natstransport.KindBatch, Seq: 0, Print: kvevents.BatchPrint(f.batches[0].payload)}).Header(), Data: f.batches[0].payload},
		// A reset of a real pod, signed with another key.
		{Subject: real0, Header: (&natstransport.Record{Kind: natstransport.KindReset, Reason: kvevents.ResetRestart}).Header()},
	}
	mustAuth(t, append([]byte("x"), testKey...)).Sign(forged[2])
	for _, m := range forged {
		m.Header.Del(jetstream.MsgIDHeader)
		if _, err := js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	// A heartbeat declaring a relay that holds the ghost.
	if err := js.Conn().Publish(natstransport.HeartbeatSubject(testModel, "evil"), []byte(`{"relay":"evil","model":"`+testModel+`","streams":[{"pod":"ghost","rank":0,"health":"ok","connected":true}]}`)); err != nil {
		t.Fatal(err)
	}
	feed(relay, f.run(t, 30))
	awaitPublished(t, relay, relay.Stats().Batches)
	last := lastSeq(t, s)
	testutil.Await(t, awaitBound, "replica applied", func() bool { return rep.c.AppliedSeq() == last })
	testutil.Await(t, awaitBound, "forgeries counted", func() bool { return rep.c.Stats().Forged == uint64(len(forged)+1) })
	for _, st := range rep.c.Streams() {
		if st.Engine.Pod == "ghost" {
			t.Errorf("the forged pod is followed: %+v", st)
		}
		if st.Health != kvevents.HealthOK || st.Resets != 0 {
			t.Errorf("engine %v hurt by forgeries: %+v", st.Engine, st)
		}
	}
	if rep.digest(t) != directIndex(t, f.batches).Digest() {
		t.Error("the index differs from a direct apply of the relay's batches")
	}
	// Without the key, a replica would have applied them: the test can
	// fail.
	plain := startReplica(t, js, natstransport.ConsumerConfig{}, nil)
	testutil.Await(t, awaitBound, "the keyless replica applied", func() bool { return plain.c.AppliedSeq() == last })
	if plain.digest(t) == directIndex(t, f.batches).Digest() {
		t.Error("a replica without the key applied nothing forged: the forgeries test nothing")
	}
}
