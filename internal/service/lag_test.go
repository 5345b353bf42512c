package service

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/enginesim/simzmq"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// Engines whose clocks run behind, ahead of and with kvindex's stamp
// their batches accordingly, and ListPods reports each one's lag: the
// skew, give or take the moments the batch spent on its way. The skews
// dwarf that time, so a loaded machine does not change the verdict.
func TestListPodsReportsIngestLag(t *testing.T) {
	const skew = 30 * time.Second
	const tolerance = 10 * time.Second
	engines := []struct {
		pod    string
		offset time.Duration // the engine's clock minus the real one
		want   time.Duration
	}{
		{"behind", -skew, skew},
		{"ahead", skew, -skew},
		{"in-step", 0, 0},
	}
	var cfgs []zmqtransport.EngineConfig
	var sims []*simzmq.Engine
	for _, e := range engines {
		offset := e.offset
		sim, err := simzmq.New(enginesim.Config{
			Pod: e.pod, Model: testModel, Hasher: testHasher, CapacityBlocks: 4096,
			Now: func() time.Time { return time.Now().Add(offset) },
		}, zmqtransport.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sim.Close() })
		sims = append(sims, sim)
		cfgs = append(cfgs, zmqtransport.EngineConfig{Name: e.pod, Model: testModel, Endpoint: sim.PubEndpoint(), ReplayEndpoint: sim.ReplayEndpoint(), Ranks: 1})
	}
	s := startService(t, baseOptions(cfgs...))
	for i, sim := range sims {
		tokens := testutil.Seq(1000*(i+1), 4*testBlockSize)
		// The PUB socket gives no sign of the subscription: publish
		// until the service holds the prompt.
		await(t, engines[i].pod+" holding the prompt", func() bool {
			if _, err := sim.Process(tokens, nil); err != nil {
				t.Fatal(err)
			}
			return s.matched(t, tokens)[engines[i].pod] == 4
		})
	}
	pods, err := s.client.ListPods(context.Background(), testModel)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*float64{}
	for _, p := range pods {
		got[p.GetPod()] = p.LastBatchLagSeconds
	}
	for _, e := range engines {
		lag := got[e.pod]
		if lag == nil {
			t.Errorf("%s: no lag reported", e.pod)
			continue
		}
		if math.Abs(*lag-e.want.Seconds()) > tolerance.Seconds() {
			t.Errorf("%s: lag %.3f s, want %v ± %v", e.pod, *lag, e.want, tolerance)
		}
	}
}
