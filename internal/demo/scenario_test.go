package demo

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestScenarioOrderings runs a small version of each scenario and checks
// the orderings the demo exists to show (see orderings). The runs are
// deterministic, so a failure is a change of behaviour, not noise.
func TestScenarioOrderings(t *testing.T) {
	for _, sc := range Scenarios {
		t.Run(sc, func(t *testing.T) {
			rep := runSmall(t, sc, 1)
			if bad := orderings(rep); len(bad) > 0 {
				var b strings.Builder
				_ = WriteTable(&b, rep)
				t.Errorf("%s:\n  %s\n%s", sc, strings.Join(bad, "\n  "), b.String())
			}
		})
	}
}

// TestGatewaysAndSessionsAcrossSeeds checks the new scenarios' orderings on more
// seeds than TestScenarioOrderings: what they show is a gap between
// routers, which one lucky workload must not be what carries it.
func TestGatewaysAndSessionsAcrossSeeds(t *testing.T) {
	for _, sc := range []string{ScenarioGateways, ScenarioSessions} {
		for _, seed := range []uint64{2, 3} {
			t.Run(fmt.Sprintf("%s/seed%d", sc, seed), func(t *testing.T) {
				rep := runSmall(t, sc, seed)
				if bad := orderings(rep); len(bad) > 0 {
					var b strings.Builder
					_ = WriteTable(&b, rep)
					t.Errorf("%s seed %d:\n  %s\n%s", sc, seed, strings.Join(bad, "\n  "), b.String())
				}
			})
		}
	}
}

// TestRunIsDeterministic checks that the real event path (sockets,
// goroutines, the subscriber's timing) does not leak into the results: the
// same options give the same report, a different seed a different one.
func TestRunIsDeterministic(t *testing.T) {
	o := small(ScenarioChurn, 2)
	o.Requests = 128
	o.Routers = []string{RouterApproximate, RouterPrecise}
	run := func(o Options) (*Report, []byte) {
		rep, err := Run(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := WriteJSON(&b, rep); err != nil {
			t.Fatal(err)
		}
		return rep, b.Bytes()
	}
	a, ja := run(o)
	b, jb := run(o)
	if !bytes.Equal(ja, jb) || !reflect.DeepEqual(a.Routers, b.Routers) {
		t.Fatalf("two runs of the same options differ:\n%s\n%s", ja, jb)
	}
	o.Seed = 3
	_, jc := run(o)
	if bytes.Equal(ja, jc) {
		t.Fatal("another seed gave the same report")
	}
}

// small returns the options of a scaled-down scenario: half the pods and
// conversations, a quarter of the requests, every token count divided by 4
// and every per-token cost multiplied by 4, so the simulated-time dynamics
// are those of the default run while the engines hash a sixteenth of the
// blocks.
func small(scenario string, seed uint64) Options {
	c := Defaults()
	c.Scenario, c.Seed, c.Pods, c.Sessions, c.Turns, c.Requests = scenario, seed, 4, 8, 16, 256
	c.Cost.PrefillPerToken *= 4
	c.Cost.DecodePerToken *= 4
	return Options{
		Config: c, Timeout: 30 * time.Second,
		Workload: func(w *WorkloadConfig) {
			for _, p := range []*int{&w.SharedTokens, &w.HistoryMin, &w.HistoryMax, &w.MessageMin, &w.MessageMax,
				&w.OutputMin, &w.OutputMax, &w.ForkPromptMin, &w.ForkPromptMax, &w.HotPrefixTokens, &w.HotSuffixMin, &w.HotSuffixMax, &w.HotOutputMin, &w.HotOutputMax} {
				*p /= 4
			}
		},
	}
}

func runSmall(t *testing.T, scenario string, seed uint64) *Report {
	t.Helper()
	rep, err := Run(context.Background(), small(scenario, seed))
	if err != nil {
		t.Fatalf("%s: %v", scenario, err)
	}
	return rep
}

// orderings returns the acceptance orderings rep violates (none: nil).
// They compare routers with each other, never against absolute times.
func orderings(rep *Report) []string {
	var bad []string
	get := func(name string) RouterResult {
		if r := rep.Router(name); r != nil {
			return *r
		}
		bad = append(bad, "missing router "+name)
		return RouterResult{}
	}
	check := func(ok bool, format string, args ...any) {
		if !ok {
			bad = append(bad, fmt.Sprintf(format, args...))
		}
	}
	rr, ch, ap, pr, or := get(RouterRoundRobin), get(RouterConsistentHash), get(RouterApproximate), get(RouterPrecise), get(RouterOracle)
	switch rep.Scenario {
	case ScenarioAgents:
		check(rr.CachedFraction <= pr.CachedFraction/2,
			"round-robin cached %.3f > half of precise's %.3f", rr.CachedFraction, pr.CachedFraction)
		check(pr.CachedFraction >= 0.9*or.CachedFraction,
			"precise cached %.3f < 90%% of oracle's %.3f", pr.CachedFraction, or.CachedFraction)
		for _, r := range rep.Routers {
			if r.Name != RouterPrecise && r.Name != RouterOracle {
				check(pr.TTFTP90 < r.TTFTP90, "precise TTFT p90 %.0fms not below %s's %.0fms", pr.TTFTP90, r.Name, r.TTFTP90)
			}
		}
		check(pr.CachedFraction >= ch.CachedFraction-0.02,
			"precise cached %.3f more than 0.02 below consistent-hash's %.3f", pr.CachedFraction, ch.CachedFraction)
		check(pr.Imbalance < ch.Imbalance, "precise imbalance %.2f not below consistent-hash's %.2f", pr.Imbalance, ch.Imbalance)
	case ScenarioChurn:
		check(pr.CachedFraction > ch.CachedFraction,
			"precise cached %.3f not above consistent-hash's %.3f", pr.CachedFraction, ch.CachedFraction)
		check(pr.CachedFraction > ap.CachedFraction,
			"precise cached %.3f not above approximate's %.3f", pr.CachedFraction, ap.CachedFraction)
	case ScenarioGateways:
		// Each approximate replica guesses from a third of the traffic;
		// precise's replicas read one index the engines fill.
		check(pr.CachedFraction >= ap.CachedFraction+0.1,
			"precise cached %.3f not 0.1 above approximate's %.3f", pr.CachedFraction, ap.CachedFraction)
		check(pr.CachedFraction >= 0.9*or.CachedFraction,
			"precise cached %.3f < 90%% of oracle's %.3f", pr.CachedFraction, or.CachedFraction)
		check(pr.TTFTP90 < ap.TTFTP90, "precise TTFT p90 %.0fms not below approximate's %.0fms", pr.TTFTP90, ap.TTFTP90)
	case ScenarioSessions:
		// Sticky sessions are about as good as sticky prefixes, and both
		// lose to routing that sees load and the caches.
		sa := get(RouterSessionAffinity)
		check(math.Abs(sa.CachedFraction-ch.CachedFraction) <= 0.15,
			"session-affinity cached %.3f not within 0.15 of consistent-hash's %.3f", sa.CachedFraction, ch.CachedFraction)
		check(sa.CachedFraction <= pr.CachedFraction-0.05,
			"session-affinity cached %.3f not 0.05 below precise's %.3f", sa.CachedFraction, pr.CachedFraction)
		check(sa.TTFTP90 > pr.TTFTP90, "session-affinity TTFT p90 %.0fms not above precise's %.0fms", sa.TTFTP90, pr.TTFTP90)
	case ScenarioHotPrefix:
		check(pr.Imbalance <= 1.3, "precise imbalance %.2f > 1.3", pr.Imbalance)
		nl := get(PreciseNoLoad)
		check(nl.Imbalance >= 2, "precise(load=0) imbalance %.2f: expected a hot spot (>= 2)", nl.Imbalance)
		check(nl.TTFTP90 > pr.TTFTP90, "precise(load=0) TTFT p90 %.0fms not above precise's %.0fms", nl.TTFTP90, pr.TTFTP90)
	}
	return bad
}

// TestGatewayReplicasMoveConversations backs the approximate router's
// gateways explanation: with three replicas, each guessing from its own
// third of the traffic, a conversation's turns change pods far more often
// than behind one gateway.
func TestGatewayReplicasMoveConversations(t *testing.T) {
	moved := map[int]int{}
	for _, replicas := range []int{1, GatewayReplicas} {
		o := small(ScenarioAgents, 1)
		o.defaults()
		p, err := o.plan()
		if err != nil {
			t.Fatal(err)
		}
		f, err := newFleet(p.h, p.engines, p.capacity, false, o.Timeout)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.close() })
		g := &gateways{}
		for i := range replicas {
			src, err := newApproxSource(p.engines, p.capacity, 0, p.h.BlockSize())
			if err != nil {
				t.Fatal(err)
			}
			r, err := newScoring(RouterApproximate, pickerConfig(o.Weights, p.h.BlockSize(), o.Seed+uint64(i)), src, f.names)
			if err != nil {
				t.Fatal(err)
			}
			g.replicas = append(g.replicas, r)
		}
		out, err := newSimulation(p.w, o.Cost, g, f.engines, o.Pods, nil).run()
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range p.w.Requests {
			if r.Prev >= 0 && out[r.Prev].Pod != out[i].Pod {
				moved[replicas]++
			}
		}
	}
	if moved[GatewayReplicas] < 3*moved[1] || moved[GatewayReplicas] == 0 {
		t.Fatalf("turns that changed pod: %d behind one gateway, %d behind %d replicas; want at least three times as many", moved[1], moved[GatewayReplicas], GatewayReplicas)
	}
}
