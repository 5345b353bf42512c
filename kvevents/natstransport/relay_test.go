package natstransport_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/natstransport"
)

// streamsFunc is a ZMQ subscriber's Streams as a test sets it.
type streamsFunc struct {
	mu sync.Mutex
	ss []kvevents.StreamStats
}

func (s *streamsFunc) set(ss ...kvevents.StreamStats) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ss = ss
}

func (s *streamsFunc) get() []kvevents.StreamStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]kvevents.StreamStats(nil), s.ss...)
}

// The relay's view of each stream (from its ZMQ subscriber) reaches the
// replicas: health in record headers, the engine's connection in
// heartbeats; a replica reports the worse of its own verdict and the
// relay's.
func TestRelayViewReachesReplicas(t *testing.T) {
	ns := startNATS(t)
	_, js := connect(t, ns.url())
	s := ensureStream(t, js)
	f := newFleet(t, 2, 1)
	a, b := f.engines[0].EngineID(), f.engines[1].EngineID()
	var zmq streamsFunc
	zmq.set(kvevents.StreamStats{Engine: a, Connected: true, Health: kvevents.HealthDegraded},
		kvevents.StreamStats{Engine: b, Connected: false, Health: kvevents.HealthOK})
	relay := startRelay(t, js, natstransport.RelayConfig{Heartbeat: 10 * time.Millisecond})
	relay.SetStreams(zmq.get)
	rep := startReplica(t, js, natstransport.ConsumerConfig{RelayTimeout: time.Minute}, nil)
	feed(relay, f.run(t, 30))
	awaitPublished(t, relay, relay.Stats().Batches)
	last := lastSeq(t, s)
	testutil.Await(t, awaitBound, "replica applied", func() bool { return rep.c.AppliedSeq() == last })
	testutil.Await(t, awaitBound, "heartbeats", func() bool {
		ss := rep.c.Streams()
		return len(ss) == 2 && ss[0].Connected && !ss[1].Connected
	})
	ss := rep.c.Streams()
	if ss[0].Engine != a || ss[0].Health != kvevents.HealthDegraded || ss[1].Health != kvevents.HealthOK {
		t.Errorf("streams: %+v", ss)
	}
	if !strings.HasPrefix(ss[0].Endpoint, "nats:kvevents.") {
		t.Errorf("endpoint %q", ss[0].Endpoint)
	}

	// The engine comes back to the relay and recovers.
	zmq.set(kvevents.StreamStats{Engine: a, Connected: true, Health: kvevents.HealthOK},
		kvevents.StreamStats{Engine: b, Connected: true, Health: kvevents.HealthOK})
	testutil.Await(t, awaitBound, "engine b connected", func() bool { return rep.c.Streams()[1].Connected })
	feed(relay, f.run(t, 30))
	awaitPublished(t, relay, relay.Stats().Batches)
	last = lastSeq(t, s)
	testutil.Await(t, awaitBound, "replica applied", func() bool { return rep.c.AppliedSeq() == last })
	for _, st := range rep.c.Streams() {
		if st.Health != kvevents.HealthOK {
			t.Errorf("stream %v still %v", st.Engine, st.Health)
		}
	}
}

func TestRelayCollectors(t *testing.T) {
	ns := startNATS(t)
	_, js := connect(t, ns.url())
	ensureStream(t, js)
	relay := startRelay(t, js, natstransport.RelayConfig{})
	f := newFleet(t, 1, 1)
	feed(relay, f.run(t, 10))
	awaitPublished(t, relay, relay.Stats().Batches)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(relay.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		m := mf.GetMetric()[0]
		if c := m.GetCounter(); c != nil {
			got[mf.GetName()] = c.GetValue()
		} else {
			got[mf.GetName()] = m.GetGauge().GetValue()
		}
	}
	for name, want := range map[string]float64{
		"kvindex_relay_published_total":       float64(len(f.batches)),
		"kvindex_relay_batches_total":         float64(len(f.batches)),
		"kvindex_relay_dropped_batches_total": 0,
		"kvindex_relay_buffered_bytes":        0,
		"kvindex_relay_nats_connected":        1,
		"kvindex_relay_holes_total":           0,
		"kvindex_relay_publish_errors_total":  0,
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", name, v, ok, want)
		}
	}
}
