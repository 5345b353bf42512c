package main

import (
	"time"

	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/internal/kubediscovery"
	"github.com/kvindex/kvindex/internal/service"
)

// Engine discovery on Kubernetes: the flags, declared here only.

// discoverFlags are the discovery flags of a command.
type discoverFlags struct {
	namespace string
	selector  string
	endpoint  string
	replay    string
	metrics   string
	ranks     int
	grace     time.Duration
	// engines, metricsUse: which flags the command registered.
	engines, metricsUse bool
	// client returns the Kubernetes client and its default namespace:
	// kubediscovery.NewClient unless a test sets it.
	client func() (kubediscovery.PodClient, string, error)
}

// register declares the discovery flags: always the namespace, the
// selector and the grace; with engines (serve, relay) the event and
// replay templates and the ranks; with metrics (picker, serve --picker)
// the metrics template.
func (f *discoverFlags) register(fs *pflag.FlagSet, engines, metrics bool) {
	f.engines, f.metricsUse = engines, metrics
	fs.StringVar(&f.selector, "discover-selector", "", "Kubernetes: follow the pods of --discover-namespace this label selector picks (e.g. app=vllm,model=llama), as an InferencePool selects its endpoints; a pod counts once it is Running with an IP (ready or not), its name is the engine's name and its IP its identity; empty: no discovery")
	fs.StringVar(&f.namespace, "discover-namespace", "", "with --discover-selector: the namespace whose pods are followed (default: kvindex's own, from its service account, or the kubeconfig context's)")
	fs.DurationVar(&f.grace, "discover-grace", kubediscovery.DefaultGrace, "with --discover-selector: how long a pod that went away (deleted, terminating, failed, relabelled) is still followed, so a short outage keeps its entries; a pod whose IP changes is replaced at once")
	if engines {
		fs.StringVar(&f.endpoint, "discover-endpoint", service.DefaultDiscoverEndpoint, "with --discover-selector: each pod's KV-event endpoint; {ip} is the pod's IP")
		fs.StringVar(&f.replay, "discover-replay", service.DefaultDiscoverReplay, "with --discover-selector: each pod's replay endpoint ({ip} as above); empty: the pods have none")
		fs.IntVar(&f.ranks, "discover-ranks", 1, "with --discover-selector: each pod's data-parallel size (rank r on the endpoint's port + r, and the replay's)")
	}
	if metrics {
		fs.StringVar(&f.metrics, "discover-metrics", service.DefaultDiscoverMetrics, "with --discover-selector: each pod's metrics URL ({ip} as above); its host:port is also where the picker sends the pod's requests; only Ready pods are candidates")
	}
}

// options validates the discovery flags; nil (and no error) without
// --discover-selector, where setting another discovery flag is a mistake.
func (f *discoverFlags) options() (*service.DiscoverOptions, error) {
	if f.selector == "" {
		switch {
		case f.namespace != "":
			return nil, usagef("--discover-namespace needs --discover-selector")
		case f.grace != kubediscovery.DefaultGrace:
			return nil, usagef("--discover-grace needs --discover-selector")
		case f.engines && (f.endpoint != service.DefaultDiscoverEndpoint || f.replay != service.DefaultDiscoverReplay || f.ranks != 1):
			return nil, usagef("--discover-endpoint, --discover-replay and --discover-ranks need --discover-selector")
		case f.metricsUse && f.metrics != service.DefaultDiscoverMetrics:
			return nil, usagef("--discover-metrics needs --discover-selector")
		}
		return nil, nil
	}
	o := &service.DiscoverOptions{
		Namespace: f.namespace, Selector: f.selector, Endpoint: f.endpoint, Replay: f.replay, Metrics: f.metrics,
		Ranks: max(f.ranks, 1), Grace: f.grace, Client: f.client, Engines: f.engines, Candidates: f.metricsUse,
	}
	if f.engines {
		o.Ranks = f.ranks
	}
	if err := o.Validate(); err != nil {
		return nil, configUsage(err, serveFlagNames)
	}
	return o, nil
}
