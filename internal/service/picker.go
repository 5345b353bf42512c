package service

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/server"
	"github.com/kvindex/kvindex/api/server/security"
	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/internal/kubediscovery"
	"github.com/kvindex/kvindex/internal/lifecycle"
	"github.com/kvindex/kvindex/internal/memlimit"
	"github.com/kvindex/kvindex/internal/telemetry"
	"github.com/kvindex/kvindex/picker"
	"github.com/kvindex/kvindex/picker/enginemetrics"
	"github.com/kvindex/kvindex/picker/gateway"
	"github.com/kvindex/kvindex/tokenizer"
)

// PickerOptions configure the endpoint picker, in the index service
// (Options.Picker) or on its own (PickerServiceOptions).
type PickerOptions struct {
	// Gateway is the picker's configuration; Registry and Logger are
	// set by the service.
	Gateway     gateway.Config
	ExtProcAddr string
	// ScrapeInterval: how often the candidates' /metrics are read; 0:
	// never.
	ScrapeInterval time.Duration

	// fleet is the index server's FleetSource, fed by the picker's
	// scraper once it exists.
	fleet fleetRelay
}

// fleetSource is the server's source of the fleet cached fraction: nil
// without a picker or without scraping.
func (o *PickerOptions) fleetSource() server.FleetSource {
	if o == nil || o.ScrapeInterval == 0 {
		return nil
	}
	return &o.fleet
}

// pickerCore is what both pickers share: the gateway service, its
// scraper, and the ext_proc server.
type pickerCore struct {
	svc    *gateway.Service
	sc     *enginemetrics.Scraper // nil without scraping
	scrape func(context.Context)  // reads the engines' /metrics until its context ends
	grpc   *grpc.Server
	lis    net.Listener // set by listen
}

// newPickerCore builds the picker over src.
// budget is the process's memory budget (bytes, 0 for none), which
// bounds the request bodies buffered at once (gateway.Config.MemoryBudget).
// tracing (nil: off) traces its picks and its ext_proc server's calls.
func newPickerCore(o *PickerOptions, src gateway.Source, reg prometheus.Registerer, log *slog.Logger, budget int64, tracing *telemetry.Tracing) (*pickerCore, error) {
	cfg := o.Gateway
	cfg.Registry, cfg.Logger, cfg.MemoryBudget, cfg.Tracer = reg, log, budget, tracing.Tracer()
	scrape, sc, err := withEngineMetrics(o.ScrapeInterval, &cfg, reg, log)
	if err != nil {
		return nil, err
	}
	if sc != nil {
		o.fleet.sc.Store(sc)
	}
	svc, err := gateway.New(cfg, src)
	if err != nil {
		return nil, err
	}
	xp := svc.ExtProc()
	gs := grpc.NewServer(append(tracing.ServerOptions(), xp.ServerOptions()...)...)
	xp.Register(gs)
	reflection.Register(gs) // grpcurl lists the ext_proc and health services

	return &pickerCore{svc: svc, sc: sc, scrape: scrape, grpc: gs}, nil
}

// listen opens the ext_proc listener.
func (p *pickerCore) listen(addr string) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return configerr.Failed("Picker.ExtProcAddr", "%v %s: %w", configerr.Field("Picker.ExtProcAddr"), addr, err)
	}
	p.lis = lis
	return nil
}

// serverParts serve ext_proc and scrape until stopped; *p is set by
// then.
func serverParts(p **pickerCore) []lifecycle.Part {
	return []lifecycle.Part{{
		Name: "picker ext_proc server",
		Run:  func(context.Context) error { return (*p).grpc.Serve((*p).lis) },
		Stop: func(ctx context.Context) error { stopGRPC(ctx, (*p).grpc); return nil },
	}, {
		Name: "engine metrics scraper",
		Run:  func(ctx context.Context) error { (*p).scrape(ctx); return nil },
	}}
}

// embeddedPicker is the endpoint picker inside the index service: it
// asks the index in the same process, so no query crosses a network.
type embeddedPicker = pickerCore

// pickerExposure is what a host that reaches a picker's listener may do.
const pickerExposure = "may ask for routing decisions (which reveal which pods hold a prompt) and read metrics; bind --extproc-addr and --http-addr to loopback or the pod's address"

// newEmbeddedPicker builds the picker over srv and listens on its
// ext_proc address.
func newEmbeddedPicker(o *PickerOptions, srv *server.Server, log *slog.Logger, budget int64, tracing *telemetry.Tracing) (*embeddedPicker, error) {
	log = log.With("component", "picker")
	p, err := newPickerCore(o, gateway.Local{Server: srv}, srv.Registry(), log, budget, tracing)
	if err == nil {
		err = p.listen(o.ExtProcAddr)
	}
	if err != nil {
		return nil, err
	}
	log.Info("picker serving", "extproc", p.lis.Addr().String(), "endpoints", len(o.Gateway.Endpoints))
	logBeyondLoopback(log, pickerExposure, p.lis.Addr().String())
	return p, nil
}

// handler serves POST /v1/pick beside the service's own API, to the
// callers with the query scope (it reveals what a query does).
func (p *embeddedPicker) handler(api http.Handler, srv *server.Server) http.Handler {
	if p == nil {
		return api
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/pick", srv.Guard(security.ScopeQuery, "Pick", p.svc.Handler()))
	mux.Handle("/", api)
	return mux
}

// engineMetrics feeds the picker from the engines' own /metrics (their
// queues and KV usage for the load scorer) and keeps the fleet's cached
// fraction, with what the picks predicted against what the responses
// that passed the picker said (gateway.Outcomes).
type engineMetrics struct{ sc *enginemetrics.Scraper }

func (e engineMetrics) EngineMetrics(pod string) (picker.Metrics, bool) {
	m := e.sc.Metrics(pod)
	return m, !m.ScrapedAt.IsZero()
}

func (e engineMetrics) Predicted(model string, matchedTokens int) {
	e.sc.Fleet().Predict(model, matchedTokens)
}

func (e engineMetrics) Responded(model string, body []byte) {
	u, err := enginemetrics.ParseUsage(body)
	if err != nil {
		return // no usage (not counted: says nothing of the cache) or not a completion
	}
	_ = e.sc.Fleet().Observe(model, u.PromptTokens, u.CachedTokens) // bad usage is counted there
}

// withEngineMetrics scrapes every candidate's http://HOST:PORT/metrics
// each interval (0: never) for cfg's picker, registering the fleet
// metrics on reg; run keeps scraping until its context ends. sc is the
// scraper, nil when there is none.
func withEngineMetrics(interval time.Duration, cfg *gateway.Config, reg prometheus.Registerer, log *slog.Logger) (run func(context.Context), sc *enginemetrics.Scraper, err error) {
	if interval == 0 {
		return func(context.Context) {}, nil, nil
	}
	urls := make(map[string]string, len(cfg.Endpoints))
	for _, e := range cfg.Endpoints {
		urls[e.Pod] = enginemetrics.MetricsURL(e.Addr)
	}
	sc, err = enginemetrics.New(enginemetrics.Config{Interval: interval}, urls, log.With("component", "engine-metrics"))
	if err != nil {
		return nil, nil, configerr.New("ScrapeInterval", "%v: %w", configerr.Field("ScrapeInterval"), err)
	}
	if err := reg.Register(sc.Collector()); err != nil {
		return nil, nil, err
	}
	em := engineMetrics{sc}
	cfg.Metrics, cfg.Outcomes = em, em
	return sc.Run, sc, nil
}

// fleetRelay is the index service's server.FleetSource: the engines'
// windowed cached fraction for kvindex pods. The server is built before
// the picker (which asks it in-process), so the picker's scraper is
// handed over once it exists; until then, and without scraping, there
// are no figures.
type fleetRelay struct {
	sc atomic.Pointer[enginemetrics.Scraper]
}

func (r *fleetRelay) FleetCache() server.FleetCache {
	sc := r.sc.Load()
	if sc == nil {
		return server.FleetCache{}
	}
	sum := sc.Fleet().Summary()
	out := server.FleetCache{Window: time.Duration(sum.WindowSeconds * float64(time.Second))}
	for _, m := range sum.Models {
		out.Models = append(out.Models, server.CacheCount{Name: m.Model, Hits: m.Engines.Hits, Queries: m.Engines.Queries})
	}
	for _, p := range sc.Status() {
		out.Pods = append(out.Pods, server.CacheCount{Name: p.Pod, Hits: p.Cache.Hits, Queries: p.Cache.Queries})
	}
	return out
}

// PickerServiceOptions configure the picker on its own: it asks a remote
// kvindex over gRPC.
type PickerServiceOptions struct {
	Picker PickerOptions
	// Index is the kvindex gRPC target; Dial its dial options (TLS,
	// token). The picker starts whether or not the index answers, and
	// connects again with backoff until it does.
	Index string
	Dial  []grpc.DialOption
	// HTTPAddr serves POST /v1/pick, /metrics, /healthz and /readyz
	// (ready once the index answers); "" for none.
	HTTPAddr string
	// MemoryBudget bounds the process as kvindex serve's does
	// (memlimit.ProcessBound; bytes, 0 for none): it sets the Go memory
	// limit and bounds the request bodies buffered at once.
	MemoryBudget int64
	Discover     *DiscoverOptions // nil: the candidates are listed
	// TokenizerFile and ChatTemplateFile, when set, are the picker's own
	// tokenizer (LoadLocalTokenizer, as kvindex serve's): it tokenizes
	// text and chat prompts (gateway.Config.Tokenizer) for
	// TokenizerModel's requests ("": every request's), checked at start
	// against an endpoint's /tokenize (gateway.Service.CheckTokenizer).
	TokenizerFile, ChatTemplateFile string
	TokenizerModel                  string
	// Tracing exports spans of the picks, the ext_proc and HTTP
	// requests and the index queries over OTLP; off when its Endpoint
	// is "".
	Tracing telemetry.Config
}

// localTokenizer opens the picker's own tokenizer into its gateway
// configuration; none without TokenizerFile.
func (o *PickerServiceOptions) localTokenizer() error {
	if o.TokenizerFile == "" && o.ChatTemplateFile == "" {
		return nil
	}
	t, err := LoadLocalTokenizer(o.TokenizerFile, o.ChatTemplateFile, memlimit.TokenCacheBytes(o.MemoryBudget))
	o.Picker.Gateway.Tokenizer, o.Picker.Gateway.TokenizerModel = t, o.TokenizerModel
	return err
}

// PickerService is the endpoint picker on its own.
type PickerService struct {
	o     *PickerServiceOptions
	log   *slog.Logger
	group lifecycle.Group
	core  *pickerCore
	hlis  net.Listener
	// tracing is nil when off.
	tracing *telemetry.Tracing
}

// NewPicker builds the picker service, loading its tokenizer (into
// o.Picker.Gateway); nothing connects or listens yet.
func NewPicker(o *PickerServiceOptions, log *slog.Logger) (*PickerService, error) {
	if o.Discover != nil {
		if err := o.Discover.Validate(); err != nil {
			return nil, err
		}
	}
	if err := o.localTokenizer(); err != nil {
		return nil, err
	}
	tracing, err := telemetry.New(o.Tracing)
	if err != nil {
		return nil, configerr.New("Tracing.Endpoint", "%v: %w", configerr.Field("Tracing.Endpoint"), err)
	}
	p := &PickerService{o: o, log: log, tracing: tracing}
	reg := prometheus.NewRegistry()
	var c *client.Client
	var hs *http.Server
	g := &p.group
	g.StopTimeout, g.Logger = ShutdownGrace, log
	g.Add(lifecycle.Part{Name: "memory limits", Start: func(context.Context) error {
		memlimit.FromBudget(o.MemoryBudget, 0).Apply(log)
		return nil
	}})
	g.Add(tracingPart(tracing, log))
	g.Add(lifecycle.Part{
		Name: "index client",
		// Built without waiting for the index: a sidecar may start first.
		Start: func(context.Context) error {
			var err error
			if c, err = client.New(o.Index, slices.Concat(o.Dial, []grpc.DialOption{gateway.IndexDialOption()}, tracing.DialOptions())...); err != nil {
				return configerr.New("Index", "%v %s: %w", configerr.Field("Index"), o.Index, err)
			}
			return nil
		},
		Stop: func(context.Context) error { return c.Close() },
	})
	g.Add(lifecycle.Part{Name: "picker", Start: func(context.Context) error {
		var err error
		p.core, err = newPickerCore(&o.Picker, gateway.Remote{Client: c}, reg, log, o.MemoryBudget, tracing)
		return err
	}})
	if o.Discover != nil {
		g.Add(o.Discover.part(log, func() func([]kubediscovery.Engine) {
			return o.Discover.candidateSetter(log, setCandidates(p.core.svc, p.core.sc, log))
		}))
	}
	// Does not delay readiness: until an engine answers, the picker
	// tokenizes unverified (CheckTokenizer).
	g.Go("tokenizer check", func(ctx context.Context) error {
		p.core.svc.CheckTokenizer(ctx, tokenizer.CheckConfig{})
		return nil
	})
	g.Add(lifecycle.Part{
		Name: "index warm-up",
		// Logged and counted by Warm, which waits for the first warm-up
		// (so that the first requests use an index that is up) and keeps
		// trying after it; the picker serves regardless, routing by load
		// and session and reporting not ready until the index answers.
		Start: func(ctx context.Context) error { _ = p.core.svc.Warm(ctx, 0); return nil },
	})
	g.Add(lifecycle.Part{Name: "picker listener", Start: func(context.Context) error { return p.core.listen(o.Picker.ExtProcAddr) }})
	for _, part := range serverParts(&p.core) {
		g.Add(part)
	}
	if o.HTTPAddr != "" {
		g.Add(lifecycle.Part{
			Name: "HTTP server",
			Start: func(context.Context) error {
				var err error
				if p.hlis, err = net.Listen("tcp", o.HTTPAddr); err != nil {
					return configerr.Failed("HTTPAddr", "%v %s: %w", configerr.Field("HTTPAddr"), o.HTTPAddr, err)
				}
				mux := http.NewServeMux()
				mux.Handle("/v1/pick", tracing.Handler(p.core.svc.Handler()))
				mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
				handleHealth(mux, p.core.svc.IndexReady)
				hs = server.DefaultHTTPServer(mux)
				return nil
			},
			Run:  func(context.Context) error { return serveHTTP(hs, p.hlis) },
			Stop: func(ctx context.Context) error { return hs.Shutdown(ctx) },
		})
	}
	g.Add(lifecycle.Part{Name: "start log", Start: func(context.Context) error {
		log.Info("picker serving", "extproc", p.core.lis.Addr().String(), "http", cmpAddr(p.hlis))
		addrs := []string{p.core.lis.Addr().String()}
		if p.hlis != nil {
			addrs = append(addrs, p.hlis.Addr().String())
		}
		logBeyondLoopback(log, pickerExposure, addrs...)
		return nil
	}})
	return p, nil
}

// Run serves until ctx ends or a part fails.
func (p *PickerService) Run(ctx context.Context) error { return p.group.Run(ctx) }

// Start brings the picker up; Wait reports how it stopped.
func (p *PickerService) Start(ctx context.Context) error { return p.group.Start(ctx) }

// Wait blocks until the picker has stopped.
func (p *PickerService) Wait() error { return p.group.Wait() }

// ExtProcAddr is the ext_proc listener's address once started.
func (p *PickerService) ExtProcAddr() string { return addrOf(p.core.lis) }

// HTTPAddr is the HTTP listener's address once started; "" without one.
func (p *PickerService) HTTPAddr() string { return addrOf(p.hlis) }

// handleHealth serves /healthz (alive: the picker routes, by load and
// session, even without its index) and /readyz (ready once ready says
// so, else 503 with the reason), as serve does.
func handleHealth(mux *http.ServeMux, ready func() (bool, string)) {
	mux.HandleFunc("GET /healthz", server.HealthzHandler)
	mux.HandleFunc("GET /readyz", server.ReadyzHandler(ready))
}

func cmpAddr(l net.Listener) string {
	if l == nil {
		return "none"
	}
	return l.Addr().String()
}
