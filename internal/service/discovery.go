package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/internal/kubediscovery"
	"github.com/kvindex/kvindex/internal/lifecycle"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
	"github.com/kvindex/kvindex/picker/enginemetrics"
	"github.com/kvindex/kvindex/picker/gateway"
)

// Engine discovery on Kubernetes: what serve, relay and picker do with
// the pods found.

// The discovery defaults: vLLM's documented KV-event and replay ports
// and its HTTP port (whose /metrics the picker reads and which serves
// the requests routed to it).
const (
	DefaultDiscoverEndpoint = "tcp://{ip}:5557"
	DefaultDiscoverReplay   = "tcp://{ip}:5558"
	DefaultDiscoverMetrics  = "http://{ip}:8000/metrics"
	ipPlaceholder           = "{ip}"
)

// DiscoverOptions follow the pods a label selector picks as engines
// (their event and replay endpoints made from templates with {ip}) and,
// for a picker, as candidates (at their metrics URL's host:port).
type DiscoverOptions struct {
	Namespace, Selector string
	// Endpoint and Replay (connect mode) are the pods' event and replay
	// endpoints; Replay "" means none. Ranks is their data-parallel size.
	Endpoint, Replay string
	Ranks            int
	// Metrics is the pods' metrics URL (picker).
	Metrics string
	// Grace: how long a pod that went away is still followed; 0: at once.
	Grace time.Duration
	// Engines and Candidates say what the pods are used as: engines
	// (Endpoint, Replay, Ranks apply) and picker candidates (Metrics
	// applies).
	Engines, Candidates bool
	// Client returns the Kubernetes client and its default namespace
	// (kubediscovery.NewClient if nil).
	Client func() (kubediscovery.PodClient, string, error)
	// Clock times the grace period (the real clock if nil).
	Clock clock.WithTicker
}

// Validate checks the selector and that the templates make endpoints
// kvindex can use, on a sample pod, before any pod is found.
func (o *DiscoverOptions) Validate() error {
	f := func(s string) configerr.Field { return configerr.Field(s) }
	if _, err := labels.Parse(o.Selector); err != nil {
		return configerr.New("Discover", "%v %q: %v", f("Discover"), o.Selector, err)
	}
	if o.Grace < 0 {
		return configerr.New("Discover.Grace", "%v %v: must not be negative (0: the default, %v)", f("Discover.Grace"), o.Grace, kubediscovery.DefaultGrace)
	}
	sample := kubediscovery.Engine{Name: "pod", IP: "10.0.0.1", Ranks: max(o.Ranks, 1)}
	if o.Engines {
		if o.Ranks < 1 || o.Ranks > kvevents.MaxDPRank {
			return configerr.New("Discover.Ranks", "%v %d: want an integer in 1..%d", f("Discover.Ranks"), o.Ranks, kvevents.MaxDPRank)
		}
		for _, t := range []struct {
			field configerr.Field
			tmpl  string
		}{{"Discover.Endpoint", o.Endpoint}, {"Discover.Replay", o.Replay}} {
			if t.tmpl == "" && t.field == "Discover.Replay" {
				continue
			}
			if !strings.Contains(t.tmpl, ipPlaceholder) {
				return configerr.New(t.field, "%v %q: no %s (each pod's endpoint is made from its IP)", t.field, t.tmpl, ipPlaceholder)
			}
			if err := zmqtransport.CheckConnectEndpoint(zmqtransport.TCPEndpoint(withIP(t.tmpl, sample.IP)), o.Ranks); err != nil {
				return configerr.New(t.field, "%v %q: %s", t.field, t.tmpl, EndpointReason(err))
			}
		}
		var le *zmqtransport.LayoutError
		if err := zmqtransport.CheckLayout([]zmqtransport.EngineConfig{o.engineConfig(sample, "model")}); errors.As(err, &le) {
			return configerr.New("Discover.Endpoint", "%v %q, %v %q, %v %d: %s",
				f("Discover.Endpoint"), o.Endpoint, f("Discover.Replay"), o.Replay, f("Discover.Ranks"), o.Ranks, le.Detail)
		}
	}
	if o.Candidates {
		if !strings.Contains(o.Metrics, ipPlaceholder) {
			return configerr.New("Discover.Metrics", "%v %q: no %s (each pod's URL is made from its IP)", f("Discover.Metrics"), o.Metrics, ipPlaceholder)
		}
		if _, err := o.endpointOf(sample); err != nil {
			return configerr.New("Discover.Metrics", "%v %q: %v", f("Discover.Metrics"), o.Metrics, err)
		}
	}
	return nil
}

// connectSettingsSet reports whether a connect-mode setting differs
// from its default.
func (o *DiscoverOptions) connectSettingsSet() bool {
	return o.Engines && (o.Endpoint != DefaultDiscoverEndpoint || o.Replay != DefaultDiscoverReplay || o.Ranks != 1)
}

// withIP fills a template's {ip}, bracketing an IPv6 address.
func withIP(tmpl, ip string) string {
	if strings.Contains(ip, ":") {
		ip = "[" + ip + "]"
	}
	return strings.ReplaceAll(tmpl, ipPlaceholder, ip)
}

// engineConfig is the engine a discovered pod is: named by the pod, of
// model, read from the templates' endpoints.
func (o *DiscoverOptions) engineConfig(e kubediscovery.Engine, model string) zmqtransport.EngineConfig {
	ec := zmqtransport.EngineConfig{Name: e.Name, Model: model, Endpoint: zmqtransport.TCPEndpoint(withIP(o.Endpoint, e.IP)), Ranks: max(e.Ranks, 1)}
	if o.Replay != "" {
		ec.ReplayEndpoint = zmqtransport.TCPEndpoint(withIP(o.Replay, e.IP))
	}
	return ec
}

// endpointOf is the picker's candidate for a discovered pod: its
// inference address is the host:port of its metrics URL.
func (o *DiscoverOptions) endpointOf(e kubediscovery.Engine) (gateway.Endpoint, error) {
	u, err := url.Parse(withIP(o.Metrics, e.IP))
	if err != nil {
		return gateway.Endpoint{}, err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Port() == "" {
		return gateway.Endpoint{}, fmt.Errorf("want an http(s) URL with a port, e.g. %s", DefaultDiscoverMetrics)
	}
	if _, _, err := net.SplitHostPort(u.Host); err != nil {
		return gateway.Endpoint{}, err
	}
	return gateway.Endpoint{Pod: e.Name, Addr: u.Host}, nil
}

// watchPods follows the selected pods until ctx ends (run), handing
// onChange each new set (see kubediscovery.Watcher). The Kubernetes
// client is made first: an error there (no cluster, no kubeconfig)
// returns at once; later failures are logged by client-go and retried.
func (o *DiscoverOptions) watchPods(log *slog.Logger, onChange func([]kubediscovery.Engine)) (run func(context.Context) error, err error) {
	// client-go reports API errors (a list RBAC forbids, a lost watch)
	// through klog: into kvindex's log, in its format.
	klog.SetSlogLogger(log.With("component", "client-go"))
	newClient := o.Client
	if newClient == nil {
		newClient = kubediscovery.NewClient
	}
	client, ns, err := newClient()
	if err != nil {
		// Not a bad setting: no cluster or kubeconfig here.
		return nil, fmt.Errorf("discovering pods %q: %w", o.Selector, err)
	}
	ns = cmp.Or(o.Namespace, ns)
	if ns == "" {
		return nil, configerr.New("Discover.Namespace", "%v: no namespace: give %v", configerr.Field("Discover"), configerr.Field("Discover.Namespace"))
	}
	grace := o.Grace
	if grace == 0 {
		grace = -1 // at once; the Watcher's zero is its default
	}
	w, err := kubediscovery.New(client, kubediscovery.Config{
		Namespace: ns, Selector: o.Selector, Ranks: o.Ranks, Grace: grace,
		Clock: o.Clock, Logger: log.With("component", "discovery"),
	}, onChange)
	if err != nil {
		return nil, configerr.New("Discover", "%v: %w", configerr.Field("Discover"), err)
	}
	return w.Run, nil
}

// part follows the pods from the part's start until it stops, handing
// each set to the handler follow makes then (the parts it feeds have
// started); a watch that ends early is logged, and the rest of the mode
// goes on with the pods it has.
func (o *DiscoverOptions) part(log *slog.Logger, follow func() func([]kubediscovery.Engine)) lifecycle.Part {
	var run func(context.Context) error
	return lifecycle.Part{
		Name: "discovery",
		Start: func(context.Context) error {
			var err error
			run, err = o.watchPods(log, follow())
			return err
		},
		Run: func(ctx context.Context) error {
			if err := run(ctx); err != nil {
				log.Error("discovery stopped", "err", err)
			}
			return nil
		},
	}
}

// engineFollower is connect mode's handler of each set of pods: each
// becomes an engine of add/remove (a subscriber's AddEngine and
// RemoveEngine); an add that fails (the name is a listed engine's) is
// logged and tried again at the next change.
func (o *DiscoverOptions) engineFollower(model string, log *slog.Logger,
	add func(zmqtransport.EngineConfig) error, remove func(name string)) func([]kubediscovery.Engine) {
	r := kubediscovery.NewReconciler(
		func(e kubediscovery.Engine) (zmqtransport.EngineConfig, bool) { return o.engineConfig(e, model), true },
		func(_ string, ec zmqtransport.EngineConfig) error { return add(ec) },
		remove,
		func(name string, err error) { log.Warn("discovery: pod not followed", "pod", name, "err", err) })
	return r.Update
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
		// The rules change first, then the departed are forgotten: they
		// can no longer come back in between.
		if err := setAllow(rules); err != nil {
			log.Error("discovery: engine allow rules not changed", "err", err)
			return
		}
		for _, name := range slices.Sorted(maps.Keys(admitted)) {
			if ip := admitted[name]; want[name] != ip {
				forget(name)
				forget(ip)
			}
		}
		admitted = want
		log.Info("discovery: engine allow rules", "pods", len(want), "rules", len(rules))
	}
}

// candidateSetter hands set the Ready pods' picker endpoints and metrics
// URLs (by pod) for each set of pods.
func (o *DiscoverOptions) candidateSetter(log *slog.Logger, set func(eps []gateway.Endpoint, metrics map[string]string)) func([]kubediscovery.Engine) {
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
			metrics[p.Name] = withIP(o.Metrics, p.IP)
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

// EndpointReason is what an endpoint error says is wrong, without the
// endpoint (the caller names the setting and its value).
func EndpointReason(err error) string {
	var ee *zmqtransport.EndpointError
	if errors.As(err, &ee) {
		return ee.Reason
	}
	return err.Error()
}

// discovery is the service's discovery: the pods become engines of the
// subscriber (connect mode) or are admitted by their address (bind
// mode) and, with a picker, its candidates.
func (s *Service) discovery() (run func(context.Context) error, err error) {
	o, d, sub := s.o, s.o.Discover, s.zsub
	var engines func([]kubediscovery.Engine)
	if o.Listen == "" {
		engines = d.engineFollower(o.Model, s.log, sub.AddEngine, func(name string) { sub.RemoveEngine(name) })
	} else {
		engines = allowReconciler(o.EngineAllow, s.log, sub.SetEngineAllow, func(name string) { sub.RemoveEngine(name) })
	}
	var cands func([]kubediscovery.Engine)
	if s.picker != nil {
		cands = d.candidateSetter(s.log, setCandidates(s.picker.svc, s.picker.sc, s.log))
	}
	return d.watchPods(s.log, func(pods []kubediscovery.Engine) {
		engines(pods)
		if cands != nil {
			cands(pods)
		}
	})
}
