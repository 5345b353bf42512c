package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kvindex/kvindex/internal/kubediscovery"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
	"github.com/kvindex/kvindex/picker/enginemetrics"
	"github.com/kvindex/kvindex/picker/gateway"
)

// Engine discovery on Kubernetes: the flags, declared here only, and
// what serve, relay and picker do with the pods found.

// The flags' defaults: vLLM's documented KV-event and replay ports and
// its HTTP port (whose /metrics the picker reads and which serves the
// requests routed to it).
const (
	defaultDiscoverEndpoint = "tcp://{ip}:5557"
	defaultDiscoverReplay   = "tcp://{ip}:5558"
	defaultDiscoverMetrics  = "http://{ip}:8000/metrics"
	ipPlaceholder           = "{ip}"
)

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
		fs.StringVar(&f.endpoint, "discover-endpoint", defaultDiscoverEndpoint, "with --discover-selector: each pod's KV-event endpoint; {ip} is the pod's IP")
		fs.StringVar(&f.replay, "discover-replay", defaultDiscoverReplay, "with --discover-selector: each pod's replay endpoint ({ip} as above); empty: the pods have none")
		fs.IntVar(&f.ranks, "discover-ranks", 1, "with --discover-selector: each pod's data-parallel size (rank r on the endpoint's port + r, and the replay's)")
	}
	if metrics {
		fs.StringVar(&f.metrics, "discover-metrics", defaultDiscoverMetrics, "with --discover-selector: each pod's metrics URL ({ip} as above); its host:port is also where the picker sends the pod's requests; only Ready pods are candidates")
	}
}

// discoverOptions are the validated discovery flags; nil without
// --discover-selector.
type discoverOptions struct {
	namespace, selector     string
	endpoint, replay        string
	metrics                 string
	ranks                   int
	grace                   time.Duration
	client                  func() (kubediscovery.PodClient, string, error)
	engines, metricsEnabled bool
	// clock times the grace period: the real clock unless a test sets it.
	clock clock.WithTicker
}

// options validates the discovery flags; nil (and no error) without
// --discover-selector, where setting another discovery flag is a mistake.
func (f *discoverFlags) options() (*discoverOptions, error) {
	if f.selector == "" {
		switch {
		case f.namespace != "":
			return nil, usagef("--discover-namespace needs --discover-selector")
		case f.grace != kubediscovery.DefaultGrace:
			return nil, usagef("--discover-grace needs --discover-selector")
		case f.engines && (f.endpoint != defaultDiscoverEndpoint || f.replay != defaultDiscoverReplay || f.ranks != 1):
			return nil, usagef("--discover-endpoint, --discover-replay and --discover-ranks need --discover-selector")
		case f.metricsUse && f.metrics != defaultDiscoverMetrics:
			return nil, usagef("--discover-metrics needs --discover-selector")
		}
		return nil, nil
	}
	if _, err := labels.Parse(f.selector); err != nil {
		return nil, usagef("--discover-selector %q: %v", f.selector, err)
	}
	o := &discoverOptions{
		namespace: f.namespace, selector: f.selector, endpoint: f.endpoint, replay: f.replay, metrics: f.metrics,
		ranks: max(f.ranks, 1), grace: f.grace, client: f.client, engines: f.engines, metricsEnabled: f.metricsUse,
	}
	if o.client == nil {
		o.client = kubediscovery.NewClient
	}
	if f.grace < 0 {
		return nil, usagef("--discover-grace %v: must not be negative (0: the default, %v)", f.grace, kubediscovery.DefaultGrace)
	}
	// A sample pod shows whether the templates make endpoints kvindex
	// can use, before any pod is found.
	sample := kubediscovery.Engine{Name: "pod", IP: "10.0.0.1", Ranks: o.ranks}
	if f.engines {
		if f.ranks < 1 || f.ranks > kvevents.MaxDPRank {
			return nil, usagef("--discover-ranks %d: want an integer in 1..%d", f.ranks, kvevents.MaxDPRank)
		}
		for _, t := range []struct{ flag, tmpl string }{{"--discover-endpoint", o.endpoint}, {"--discover-replay", o.replay}} {
			if t.tmpl == "" && t.flag == "--discover-replay" {
				continue
			}
			if !strings.Contains(t.tmpl, ipPlaceholder) {
				return nil, usagef("%s %q: no %s (each pod's endpoint is made from its IP)", t.flag, t.tmpl, ipPlaceholder)
			}
			if err := zmqtransport.CheckConnectEndpoint(endpoint(withIP(t.tmpl, sample.IP)), o.ranks); err != nil {
				return nil, usagef("%s %q: %s", t.flag, t.tmpl, endpointReason(err))
			}
		}
		var le *zmqtransport.LayoutError
		if err := zmqtransport.CheckLayout([]zmqtransport.EngineConfig{o.engineConfig(sample, "model")}); errors.As(err, &le) {
			return nil, usagef("--discover-endpoint %q, --discover-replay %q, --discover-ranks %d: %s", o.endpoint, o.replay, o.ranks, le.Detail)
		}
	}
	if f.metricsUse {
		if !strings.Contains(o.metrics, ipPlaceholder) {
			return nil, usagef("--discover-metrics %q: no %s (each pod's URL is made from its IP)", o.metrics, ipPlaceholder)
		}
		if _, err := o.endpointOf(sample); err != nil {
			return nil, usagef("--discover-metrics %q: %v", o.metrics, err)
		}
	}
	return o, nil
}

// connectFlagsSet reports whether a connect-mode flag was given a value
// other than its default.
func (o *discoverOptions) connectFlagsSet() bool {
	return o.engines && (o.endpoint != defaultDiscoverEndpoint || o.replay != defaultDiscoverReplay || o.ranks != 1)
}

// withIP fills a template's {ip}, bracketing an IPv6 address.
func withIP(tmpl, ip string) string {
	if strings.Contains(ip, ":") {
		ip = "[" + ip + "]"
	}
	return strings.ReplaceAll(tmpl, ipPlaceholder, ip)
}

// engineConfig is the engine a discovered pod is: named by the pod, of
// model (the --model flag), read from the templates' endpoints.
func (o *discoverOptions) engineConfig(e kubediscovery.Engine, model string) zmqtransport.EngineConfig {
	ec := zmqtransport.EngineConfig{Name: e.Name, Model: model, Endpoint: endpoint(withIP(o.endpoint, e.IP)), Ranks: max(e.Ranks, 1)}
	if o.replay != "" {
		ec.ReplayEndpoint = endpoint(withIP(o.replay, e.IP))
	}
	return ec
}

// endpointOf is the picker's candidate for a discovered pod: its
// inference address is the host:port of its metrics URL.
func (o *discoverOptions) endpointOf(e kubediscovery.Engine) (gateway.Endpoint, error) {
	u, err := url.Parse(withIP(o.metrics, e.IP))
	if err != nil {
		return gateway.Endpoint{}, err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Port() == "" {
		return gateway.Endpoint{}, fmt.Errorf("want an http(s) URL with a port, e.g. %s", defaultDiscoverMetrics)
	}
	if _, _, err := net.SplitHostPort(u.Host); err != nil {
		return gateway.Endpoint{}, err
	}
	return gateway.Endpoint{Pod: e.Name, Addr: u.Host}, nil
}

// metricsURL is a discovered pod's metrics URL.
func (o *discoverOptions) metricsURL(e kubediscovery.Engine) string { return withIP(o.metrics, e.IP) }

// watchPods follows the pods the options select until ctx ends, handing
// onChange each new set (see kubediscovery.Watcher). The Kubernetes
// client is made first: an error there (no cluster, no kubeconfig)
// returns at once; later failures are logged by client-go and retried.
func (o *discoverOptions) watchPods(log *slog.Logger, onChange func([]kubediscovery.Engine)) (run func(context.Context) error, err error) {
	// client-go reports API errors (a list RBAC forbids, a lost watch)
	// through klog: into kvindex's log, in its format.
	klog.SetSlogLogger(log.With("component", "client-go"))
	client, ns, err := o.client()
	if err != nil {
		return nil, fmt.Errorf("--discover-selector: %w", err)
	}
	if o.namespace != "" {
		ns = o.namespace
	}
	if ns == "" {
		return nil, usagef("--discover-selector: no namespace: give --discover-namespace")
	}
	w, err := kubediscovery.New(client, kubediscovery.Config{
		Namespace: ns, Selector: o.selector, Ranks: o.ranks, Grace: discoverGrace(o.grace),
		Clock: o.clock, Logger: log.With("component", "discovery"),
	}, onChange)
	if err != nil {
		return nil, usagef("--discover-selector: %s", strings.TrimPrefix(err.Error(), "kubediscovery: "))
	}
	return w.Run, nil
}

// discoverGrace maps --discover-grace onto kubediscovery.Config.Grace,
// whose zero means its default: the flag's 0 means at once.
func discoverGrace(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// discoveredEngines follows the discovered pods as engines until ctx
// ends (run): add is called for each pod that appears, remove (with its
// name) for each that is dropped; a pod whose engine changes (its IP) is
// removed, then added. Calls come from one goroutine. An add that fails
// (the name is a static --engine's) is logged and tried again on the
// next change. serve (connect mode) and relay share it.
func discoveredEngines(o *discoverOptions, model string, log *slog.Logger,
	add func(zmqtransport.EngineConfig) error, remove func(name string)) (run func(context.Context) error, err error) {
	return o.watchPods(log, o.engineReconciler(model, log, add, remove))
}

// engineReconciler is discoveredEngines' handler of each set of pods.
func (o *discoverOptions) engineReconciler(model string, log *slog.Logger,
	add func(zmqtransport.EngineConfig) error, remove func(name string)) func([]kubediscovery.Engine) {
	running := map[string]zmqtransport.EngineConfig{}
	return func(pods []kubediscovery.Engine) {
		want := make(map[string]zmqtransport.EngineConfig, len(pods))
		for _, p := range pods {
			want[p.Name] = o.engineConfig(p, model)
		}
		for _, name := range sortedKeys(running) {
			if ec, ok := want[name]; !ok || ec != running[name] {
				remove(name)
				delete(running, name)
			}
		}
		for _, name := range sortedKeys(want) {
			if _, ok := running[name]; ok {
				continue
			}
			if err := add(want[name]); err != nil {
				log.Warn("discovery: pod not followed", "pod", name, "err", err)
				continue
			}
			running[name] = want[name]
		}
	}
}

// allowReconciler is bind mode's handler of each set of pods: the engine
// allow rules become static plus, for each pod, POD=IP and IP=IP (the
// topic names the pod by its name or, as llm-d's kv@$POD_IP@$MODEL does,
// by its IP), so that only the pod's own address may speak for it. A pod
// dropped, or whose IP changed, is forgotten (its streams and entries,
// under both names) once the rules no longer admit it.
func allowReconciler(static []zmqtransport.AllowRule, log *slog.Logger,
	setAllow func([]zmqtransport.AllowRule) error, forget func(name string)) func([]kubediscovery.Engine) {
	admitted := map[string]string{} // pod -> IP
	return func(pods []kubediscovery.Engine) {
		rules := slices.Clone(static)
		seen := map[zmqtransport.AllowRule]bool{}
		for _, r := range rules {
			seen[r] = true
		}
		want := map[string]string{}
		for _, p := range pods {
			ip, err := netip.ParseAddr(p.IP)
			if err != nil {
				log.Warn("discovery: pod IP not an address; not admitted", "pod", p.Name, "ip", p.IP)
				continue
			}
			ip = ip.Unmap()
			want[p.Name] = p.IP
			for _, name := range []string{p.Name, ip.String()} {
				r := zmqtransport.AllowRule{Pod: name, Prefix: netip.PrefixFrom(ip, ip.BitLen())}
				if !seen[r] {
					seen[r] = true
					rules = append(rules, r)
				}
			}
		}
		if err := setAllow(rules); err != nil {
			log.Error("discovery: engine allow rules not changed", "err", err)
			return
		}
		for _, name := range sortedKeys(admitted) {
			if ip := admitted[name]; want[name] != ip {
				forget(name)
				forget(ip)
			}
		}
		admitted = want
		log.Info("discovery: engine allow rules", "pods", len(want), "rules", len(rules))
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// candidateSetter hands set the Ready pods' picker endpoints and metrics
// URLs (by pod) for each set of pods.
func (o *discoverOptions) candidateSetter(log *slog.Logger, set func(eps []gateway.Endpoint, metrics map[string]string)) func([]kubediscovery.Engine) {
	return func(pods []kubediscovery.Engine) {
		var eps []gateway.Endpoint
		metrics := map[string]string{}
		for _, p := range pods {
			if !p.Ready {
				continue
			}
			ep, err := o.endpointOf(p)
			if err != nil {
				log.Warn("discovery: pod not a candidate", "pod", p.Name, "err", err)
				continue
			}
			eps = append(eps, ep)
			metrics[p.Name] = o.metricsURL(p)
		}
		set(eps, metrics)
	}
}

// setCandidates makes the picker's candidates eps, and, when it scrapes,
// its scraper's pods metrics.
func setCandidates(svc *gateway.Service, sc *enginemetrics.Scraper, log *slog.Logger) func([]gateway.Endpoint, map[string]string) {
	return func(eps []gateway.Endpoint, metrics map[string]string) {
		if err := svc.SetEndpoints(eps); err != nil {
			log.Warn("discovery: picker candidates not changed", "err", err)
		}
		if sc != nil {
			if err := sc.SetEndpoints(metrics); err != nil {
				log.Warn("discovery: engine metrics URLs not changed", "err", err)
			}
		}
		log.Info("discovery: picker candidates", "count", len(eps))
	}
}

// startDiscovery is serve's discovery (nil without --discover-selector):
// the pods become engines of sub and, with --picker, candidates of pk.
func startDiscovery(o *serveOptions, sub *zmqtransport.Subscriber, pk *servePicker, log *slog.Logger) (run func(context.Context) error, err error) {
	d := o.discover
	if d == nil {
		return nil, nil
	}
	var engines func([]kubediscovery.Engine)
	if o.listen == "" {
		engines = d.engineReconciler(o.model, log, sub.AddEngine, func(name string) { sub.RemoveEngine(name) })
	} else {
		engines = allowReconciler(o.engineAllow, log, sub.SetEngineAllow, func(name string) { sub.RemoveEngine(name) })
	}
	var cands func([]kubediscovery.Engine)
	if pk != nil {
		cands = d.candidateSetter(log, setCandidates(pk.svc, pk.sc, log))
	}
	return d.watchPods(log, func(pods []kubediscovery.Engine) {
		engines(pods)
		if cands != nil {
			cands(pods)
		}
	})
}
