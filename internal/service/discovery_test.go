package service

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/internal/kubediscovery"
	"github.com/kvindex/kvindex/internal/kubediscovery/kubetest"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// The engines a discovered pod makes: the templates filled with its IP
// (bracketed when IPv6); a pod whose IP changes is removed, then added.
func TestDiscoveredEngineReconciler(t *testing.T) {
	o := &DiscoverOptions{Endpoint: "tcp://{ip}:5557", Replay: "tcp://{ip}:5567", Ranks: 2, Metrics: DefaultDiscoverMetrics}
	var calls []string
	apply := o.engineFollower("m", slog.New(slog.DiscardHandler), func(ec zmqtransport.EngineConfig) error {
		calls = append(calls, "add "+ec.Name+" "+ec.Endpoint+" "+ec.ReplayEndpoint+" "+strconv.Itoa(ec.Ranks))
		return nil
	}, func(name string) { calls = append(calls, "remove "+name) })
	for _, step := range []struct {
		name string
		pods []kubediscovery.Engine
		want []string
	}{
		{"two pods", []kubediscovery.Engine{{Name: "a", IP: "10.0.0.1", Ranks: 2}, {Name: "b", IP: "fd00::2", Ranks: 2}},
			[]string{"add a tcp://10.0.0.1:5557 tcp://10.0.0.1:5567 2", "add b tcp://[fd00::2]:5557 tcp://[fd00::2]:5567 2"}},
		{"same set again", []kubediscovery.Engine{{Name: "a", IP: "10.0.0.1", Ranks: 2}, {Name: "b", IP: "fd00::2", Ranks: 2}}, nil},
		{"a's IP changes, b goes", []kubediscovery.Engine{{Name: "a", IP: "10.0.0.3", Ranks: 2}},
			[]string{"remove a", "remove b", "add a tcp://10.0.0.3:5557 tcp://10.0.0.3:5567 2"}},
	} {
		calls = nil
		apply(step.pods)
		if strings.Join(calls, "; ") != strings.Join(step.want, "; ") {
			t.Errorf("%s: calls %q, want %q", step.name, calls, step.want)
		}
	}
	ep, err := o.endpointOf(kubediscovery.Engine{Name: "a", IP: "fd00::2"})
	if err != nil || ep.Pod != "a" || ep.Addr != "[fd00::2]:8000" {
		t.Errorf("picker endpoint %+v, %v; want a=[fd00::2]:8000", ep, err)
	}
}

// In bind mode the discovered pods are the engine allow rules: each pod's
// name and IP may speak only from its IP, besides the static rules; a pod
// dropped or moved is forgotten under both names.
func TestDiscoveredAllowReconciler(t *testing.T) {
	static := []zmqtransport.AllowRule{mustAllow(t, "probe=10.9.0.0/16")}
	var calls []string
	apply := allowReconciler(static, slog.New(slog.DiscardHandler), func(rules []zmqtransport.AllowRule) error {
		var s []string
		for _, r := range rules {
			s = append(s, r.String())
		}
		calls = append(calls, "allow "+strings.Join(s, " "))
		return nil
	}, func(name string) { calls = append(calls, "forget "+name) })
	for _, step := range []struct {
		name string
		pods []kubediscovery.Engine
		want []string
	}{
		{"none", nil, []string{"allow probe=10.9.0.0/16"}},
		{"two pods", []kubediscovery.Engine{{Name: "a", IP: "10.0.0.1"}, {Name: "b", IP: "fd00::2"}},
			[]string{"allow probe=10.9.0.0/16 a=10.0.0.1 10.0.0.1=10.0.0.1 b=fd00::2 fd00::2=fd00::2"}},
		{"a moves, b goes", []kubediscovery.Engine{{Name: "a", IP: "10.0.0.3"}},
			[]string{"allow probe=10.9.0.0/16 a=10.0.0.3 10.0.0.3=10.0.0.3", "forget a", "forget 10.0.0.1", "forget b", "forget fd00::2"}},
		{"bad IP skipped", []kubediscovery.Engine{{Name: "a", IP: "10.0.0.3"}, {Name: "c", IP: "nope"}},
			[]string{"allow probe=10.9.0.0/16 a=10.0.0.3 10.0.0.3=10.0.0.3"}},
	} {
		calls = nil
		apply(step.pods)
		if strings.Join(calls, "; ") != strings.Join(step.want, "; ") {
			t.Errorf("%s: calls %q, want %q", step.name, calls, step.want)
		}
	}
}

// A relay's discovery: a pod that appears is added with the templates'
// endpoints, one deleted is removed (Grace 0: at once).
func TestDiscoveredEnginesForRelay(t *testing.T) {
	o := &DiscoverOptions{Selector: "app=vllm", Namespace: "llm", Endpoint: DefaultDiscoverEndpoint, Ranks: 1, Engines: true}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	cluster := kubetest.NewCluster(t)
	o.Client = func() (kubediscovery.PodClient, string, error) {
		return cluster.Client(), "default", nil
	}
	calls := make(chan string, 10)
	log := slog.New(slog.DiscardHandler)
	run, err := o.watchPods(log, o.engineFollower("m", log, func(ec zmqtransport.EngineConfig) error {
		calls <- "add " + ec.Name + " " + ec.Model + " " + ec.Endpoint + " replay=" + ec.ReplayEndpoint
		return nil
	}, func(name string) { calls <- "remove " + name }))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	next := func(want string) {
		t.Helper()
		select {
		case got := <-calls:
			if got != want {
				t.Fatalf("call %q, want %q", got, want)
			}
		case <-time.After(testDeadline):
			t.Fatalf("no call; want %q", want)
		}
	}
	cluster.Create(t, kubetest.EnginePod("vllm-0", "10.0.0.5"))
	next("add vllm-0 m tcp://10.0.0.5:5557 replay=")
	cluster.Delete(t, "llm", "vllm-0")
	next("remove vllm-0")
}

func mustAllow(t *testing.T, s string) zmqtransport.AllowRule {
	t.Helper()
	r, err := zmqtransport.ParseAllowRule(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestDiscoverValidate: the templates must make endpoints kvindex can
// use, each error naming the setting at fault.
func TestDiscoverValidate(t *testing.T) {
	base := DiscoverOptions{Selector: "app=vllm", Endpoint: DefaultDiscoverEndpoint, Replay: DefaultDiscoverReplay, Ranks: 1,
		Metrics: DefaultDiscoverMetrics, Engines: true, Candidates: true}
	for _, tc := range []struct {
		name  string
		edit  func(*DiscoverOptions)
		field configerr.Field
		want  string
	}{
		{"bad selector", func(o *DiscoverOptions) { o.Selector = "app in (x" }, "Discover", `Discover "app in (x": `},
		{"negative grace", func(o *DiscoverOptions) { o.Grace = -time.Second }, "Discover.Grace", "must not be negative"},
		{"no ranks", func(o *DiscoverOptions) { o.Ranks = 0 }, "Discover.Ranks", "want an integer in 1.."},
		{"no {ip}", func(o *DiscoverOptions) { o.Endpoint = "tcp://10.0.0.1:5557" }, "Discover.Endpoint", "no {ip}"},
		{"replay without port", func(o *DiscoverOptions) { o.Replay = "tcp://{ip}" }, "Discover.Replay", "no port"},
		{"overlapping ranks", func(o *DiscoverOptions) { o.Ranks = 2 }, "Discover.Endpoint", "overlap"},
		{"metrics without port", func(o *DiscoverOptions) { o.Metrics = "http://{ip}/metrics" }, "Discover.Metrics", "with a port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.edit(&o)
			err := o.Validate()
			ce, ok := configerr.As(err)
			if !ok || ce.Field != tc.field || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one of %s saying %q", err, tc.field, tc.want)
			}
		})
	}
	if err := base.Validate(); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
}
