package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/server"
	"github.com/kvindex/kvindex/api/watchhub"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/buildinfo"
	"github.com/kvindex/kvindex/internal/bytesize"
	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/internal/lifecycle"
	"github.com/kvindex/kvindex/internal/memlimit"
	"github.com/kvindex/kvindex/internal/telemetry"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/natstransport"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
	"github.com/kvindex/kvindex/tokenizer"
)

// Service is a built index service: index, event source, API server and,
// as configured, state directory, picker and discovery. New builds it
// without listening or connecting; Start or Run brings it up.
type Service struct {
	o     *Options
	log   *slog.Logger
	index *indexer.Index
	hub   *watchhub.Hub
	src   eventSource
	zsub  *zmqtransport.Subscriber // nil in NATS mode
	api   *server.Server
	state *stateDir // nil without a state directory
	group lifecycle.Group

	// Set while starting: the listeners and what serves on them.
	grpcLis, httpLis, adminLis net.Listener
	picker                     *embeddedPicker // nil without a picker

	localTok tokenizer.Tokenizer // the local tokenizer; nil without one
	tracing  *telemetry.Tracing  // nil: tracing off
	// tokChecks is the local tokenizer's comparison with the engine's
	// /tokenize, once made (ListPods reports it).
	tokChecks atomic.Pointer[[]server.TokenizerCheck]
}

// localTokenizer is the local tokenizer among toks, nil without one.
func localTokenizer(toks []server.NamedTokenizer) tokenizer.Tokenizer {
	for _, t := range toks {
		if t.Source == client.SourceLocal {
			return t.Tokenizer
		}
	}
	return nil
}

// eventSource is where the service's events come from: the ZMQ
// subscriber (connect and bind modes) or a NATS replica.
type eventSource interface {
	Streams() []kvevents.StreamStats
	parts() []lifecycle.Part
}

// New validates o and builds every part, loading what the settings name
// (a tokenizer file, the state directory's index), so that a bad setting
// is reported before anything listens. Nothing listens or connects yet.
func New(o *Options, log *slog.Logger) (*Service, error) {
	return build(o, log, true)
}

// Check builds every part as New does, without restoring the state
// directory, and releases them: it reports the first bad setting.
func Check(o *Options, log *slog.Logger) error {
	s, err := build(o, log, false)
	if err == nil {
		s.release()
	}
	return err
}

func build(o *Options, log *slog.Logger, restore bool) (*Service, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Discover != nil {
		if err := o.Discover.Validate(); err != nil {
			return nil, err
		}
	}
	toks, err := buildTokenizers(o)
	if err != nil {
		return nil, err
	}
	var auth *natstransport.Auth // the key NATS mode signs and checks with
	if o.NATS != nil {
		if auth, err = o.NATS.Conn.Auth(); err != nil {
			return nil, err
		}
	}
	// The index gets its share of the budget; the queues and the
	// engines' state take the rest (memlimit.Split).
	iopts := o.Index
	iopts.MemoryBudget = o.shares().Index
	ix, err := indexer.New(iopts)
	if err != nil {
		return nil, err
	}
	tracing, err := telemetry.New(o.Tracing)
	if err != nil {
		return nil, configerr.New("Tracing.Endpoint", "%v: %w", configerr.Field("Tracing.Endpoint"), err)
	}
	s := &Service{o: o, log: log, index: ix, localTok: localTokenizer(toks), tracing: tracing}
	var resume []kvevents.Position
	if o.StateDir != "" {
		if s.state, err = newStateDir(o, ix, log.With("component", "state")); err != nil {
			return nil, err
		}
		if restore {
			resume = s.state.restore(o)
		}
	}
	s.hub = watchhub.New(ix, o.Limits.Limits)
	var replica *natsReplica
	if o.NATS != nil {
		replica = newNATSReplica(o.NATS, auth, o.Model, o.Index.Hasher.Config(), ix, s.hub, log)
		s.src = replica
	} else {
		forget := o.ForgetAfter
		if forget == 0 {
			forget = -1 // never; the subscriber's zero is its default
		}
		scfg := zmqtransport.SubscriberConfig{
			Engines: o.Engines, Listen: o.Listen, ListenRanks: o.ListenRanks, TopicPattern: o.TopicPattern,
			Model: o.Model, ReplayTemplate: o.ReplayTemplate, MaxEngines: o.maxEngines(), EngineAllow: o.EngineAllow, ForgetAfter: forget,
			EngineAllowDynamic: o.Discover != nil && o.Listen != "",
			RcvHWM:             o.shares().RcvHWM, Resume: resume,
		}
		if s.zsub, err = zmqtransport.NewSubscriber(scfg, s.hub, log.With("component", "kvevents")); err != nil {
			return nil, err
		}
		s.src = subscriberSource{s.zsub}
	}
	grace := o.ReadyGrace
	if grace == 0 {
		grace = time.Nanosecond // ready at once
	}
	scfg := server.Config{
		Index: ix, BlockSize: o.Index.Hasher.BlockSize(), Hasher: o.Index.Hasher, Tokenizers: toks, Hub: s.hub, Streams: s.src,
		DefaultModel: o.Model, MaxTokens: o.MaxQueryTokens, ExpectStreams: expectedStreams(o.Engines), ReadyGrace: grace,
		Logger: log.With("component", "api"), Limits: o.limits(), Security: o.Security,
		Fleet: o.Picker.fleetSource(), Tracer: tracing.Tracer(),
		TokenizerChecks: func() []server.TokenizerCheck {
			if c := s.tokChecks.Load(); c != nil {
				return *c
			}
			return nil
		},
	}
	if replica != nil {
		// Ready once caught up with the stream, however long that takes.
		scfg.ReadyWhen, scfg.ReadyGrace = replica.CaughtUp(), -1
		scfg.IndexSeq = replica.IndexSeq
	}
	s.api, err = server.New(scfg)
	if err == nil {
		err = register(s.api.Registry(), buildInfoGauge(buildinfo.Read()))
	}
	if err == nil && s.state != nil {
		s.state.sub = s.zsub
		err = register(s.api.Registry(), s.state.collectors()...)
	}
	if err == nil && replica != nil {
		replica.reg = s.api.Registry()
		err = register(s.api.Registry(), replica.collectors()...)
	}
	if err != nil {
		s.release()
		return nil, err
	}
	s.assemble()
	return s, nil
}

// release frees what build made of a service that never starts.
func (s *Service) release() {
	if s.zsub != nil {
		s.zsub.Close()
	}
	_ = s.tracing.Shutdown(context.Background())
}

func register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// subscriberSource is the ZMQ subscriber as the service's event source.
type subscriberSource struct{ *zmqtransport.Subscriber }

func (s subscriberSource) parts() []lifecycle.Part {
	return []lifecycle.Part{{
		Name: "event subscriber",
		// The subscriber logs each engine it follows and its listen socket.
		Start: func(context.Context) error { return s.Start() },
		Stop:  func(context.Context) error { return s.Close() },
	}}
}

// assemble lays out the parts in the order they start: the listeners
// first (a taken port stops the service before it connects to any
// engine), then the event source, the state directory and discovery,
// then the servers. They stop in reverse: the API stops answering and
// ends its Watch streams, the servers finish their requests, the state
// directory writes its last snapshot, the source closes.
func (s *Service) assemble() {
	o, g := s.o, &s.group
	g.StopTimeout, g.Logger = ShutdownGrace, s.log
	g.Add(lifecycle.Part{Name: "memory limits", Start: func(context.Context) error {
		memlimit.FromBudget(o.Index.MemoryBudget, o.streams()).Apply(s.log)
		return nil
	}, Stop: func(context.Context) error { s.log.Info("stopped"); return nil }}) // stopped last
	g.Add(tracingPart(s.tracing, s.log))
	g.Add(listenPart("gRPC listener", "GRPCAddr", o.GRPCAddr, &s.grpcLis))
	g.Add(listenPart("HTTP listener", "HTTPAddr", o.HTTPAddr, &s.httpLis))
	if o.AdminAddr != "" {
		g.Add(listenPart("admin listener", "AdminAddr", o.AdminAddr, &s.adminLis))
	}
	if o.Picker != nil {
		g.Add(lifecycle.Part{Name: "picker listener", Start: func(context.Context) error {
			p, err := newEmbeddedPicker(o.Picker, s.api, s.log, o.Index.MemoryBudget, s.tracing)
			s.picker = p
			return err
		}, Stop: func(context.Context) error { s.picker.lis.Close(); return nil }})
	}
	var discover func(context.Context) error
	if o.Discover != nil {
		g.Add(lifecycle.Part{Name: "discovery setup", Start: func(context.Context) error {
			var err error
			discover, err = s.discovery()
			return err
		}})
	}
	g.Add(lifecycle.Part{Name: "start log", Start: func(context.Context) error {
		hcfg := o.Index.Hasher.Config()
		s.log.Info("kvindex starting",
			"hash_algo", string(hcfg.Algo), "hash_seed", hcfg.Seed, "block_size", hcfg.BlockSize,
			"memory_budget", bytesize.Format(o.Index.MemoryBudget), "model", o.Model, "engines", len(o.Engines),
			"listen", cmp.Or(o.Listen, "none"), "listen_ranks", o.ListenRanks, "tokenizer", TokenizerSummary(o),
			"max_query_tokens", o.MaxQueryTokens, "ready_grace", o.ReadyGrace.String())
		return nil
	}})
	if o.TokenizeURL != "" && o.TokenizerFile != "" {
		g.Go("tokenizer check", func(ctx context.Context) error {
			checkServeTokenizer(ctx, s.localTok, o, s.log, func(c []server.TokenizerCheck) { s.tokChecks.Store(&c) })
			return nil
		})
	}
	for _, p := range s.src.parts() {
		g.Add(p)
	}
	if s.state != nil {
		g.Add(s.state.part())
	}
	if o.Discover != nil {
		g.Go("discovery", func(ctx context.Context) error { return discover(ctx) })
	}
	s.addServers()
}

// addServers adds the servers on the listeners, the API's own work and
// the log of engines not connected when the ready grace ran out.
func (s *Service) addServers() {
	o, g := s.o, &s.group
	var (
		gs         *grpc.Server
		hs, admins *http.Server
	)
	g.Add(lifecycle.Part{
		Name: "gRPC server",
		Start: func(context.Context) error {
			gs = s.api.NewGRPCServer(s.tracing.ServerOptions()...)
			hs = s.api.NewHTTPServer(server.HTTPOptions{})
			hs.Handler = s.tracing.Handler(s.picker.handler(hs.Handler, s.api))
			s.log.Info("serving", "grpc", s.GRPCAddr(), "http", s.HTTPAddr(), "admin", s.AdminAddr())
			logLimits(s.log, o.limits())
			logSecurity(s.log, o.Security, s.GRPCAddr(), s.HTTPAddr(), s.AdminAddr())
			return nil
		},
		Run:  func(context.Context) error { return gs.Serve(s.grpcLis) },
		Stop: func(ctx context.Context) error { stopGRPC(ctx, gs); return nil },
	})
	g.Add(lifecycle.Part{
		Name: "HTTP server",
		Run:  func(context.Context) error { return serveHTTP(hs, s.api.LimitListener(s.httpLis)) },
		Stop: func(ctx context.Context) error { return hs.Shutdown(ctx) },
	})
	if s.adminLis != nil || o.AdminAddr != "" {
		g.Add(lifecycle.Part{
			Name:  "admin server",
			Start: func(context.Context) error { admins = s.api.NewAdminServer(); return nil },
			Run:   func(context.Context) error { return serveHTTP(admins, s.api.AdminListener(s.adminLis)) },
			Stop:  func(ctx context.Context) error { return admins.Shutdown(ctx) },
		})
	}
	if o.Picker != nil {
		for _, p := range serverParts(&s.picker) {
			g.Add(p)
		}
	}
	g.Add(lifecycle.Part{
		Name: "API",
		Run:  func(ctx context.Context) error { s.api.Run(ctx); return nil },
		// First to stop: NOT_SERVING, and Watch streams end.
		Stop: func(context.Context) error { s.log.Info("shutting down"); s.api.Shutdown(); return nil },
	})
	if o.ReadyGrace > 0 && o.NATS == nil { // NATS mode: ready once caught up, however long that takes
		g.Go("ready log", func(ctx context.Context) error {
			select {
			case <-s.api.ReadyC():
				logNotConnected(s.log, s.src.Streams())
			case <-ctx.Done():
			}
			return nil
		})
	}
}

// listenPart opens a TCP listener at addr (the Options field named),
// closed when the part stops (after its server, which may have closed it
// already).
func listenPart(name string, field configerr.Field, addr string, lis *net.Listener) lifecycle.Part {
	return lifecycle.Part{
		Name: name,
		Start: func(context.Context) error {
			l, err := net.Listen("tcp", addr)
			if err != nil {
				return configerr.Failed(field, "%v %s: %w", field, addr, err)
			}
			*lis = l
			return nil
		},
		Stop: func(context.Context) error { (*lis).Close(); return nil },
	}
}

// serveHTTP serves hs on lis until it is shut down.
func serveHTTP(hs *http.Server, lis net.Listener) error {
	if err := hs.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// stopGRPC lets the open calls and streams of gs finish, within ctx.
func stopGRPC(ctx context.Context, gs *grpc.Server) {
	stopped := make(chan struct{})
	go func() {
		gs.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-ctx.Done():
		gs.Stop()
		<-stopped
	}
}

// Start brings the service up and returns once it listens; it runs until
// ctx ends or a part fails, and Wait reports how it stopped.
func (s *Service) Start(ctx context.Context) error {
	if err := s.group.Start(ctx); err != nil {
		s.release()
		return err
	}
	return nil
}

// Wait blocks until the service has stopped and returns the first error.
func (s *Service) Wait() error { return s.group.Wait() }

// Run starts the service and waits until it has stopped.
func (s *Service) Run(ctx context.Context) error {
	if err := s.Start(ctx); err != nil {
		return err
	}
	return s.Wait()
}

// Index is the service's index.
func (s *Service) Index() *indexer.Index { return s.index }

// GRPCAddr is the gRPC listener's address, once started.
func (s *Service) GRPCAddr() string { return addrOf(s.grpcLis) }

// HTTPAddr is the HTTP listener's address, once started.
func (s *Service) HTTPAddr() string { return addrOf(s.httpLis) }

// AdminAddr is the admin listener's address; "" without one.
func (s *Service) AdminAddr() string { return addrOf(s.adminLis) }

// PickerAddr is the in-process picker's ext_proc address; "" without one.
func (s *Service) PickerAddr() string {
	if s.picker == nil {
		return ""
	}
	return addrOf(s.picker.lis)
}

func addrOf(l net.Listener) string {
	if l == nil {
		return ""
	}
	return l.Addr().String()
}

// maxNamedStreams bounds the streams one log line names.
const maxNamedStreams = 20

// logNotConnected names the engine streams that were not connected when
// kvindex became ready: the ready grace ran out before they connected.
func logNotConnected(log *slog.Logger, streams []kvevents.StreamStats) {
	var names []string
	n := 0
	for _, st := range streams {
		if st.Bind || st.Connected {
			continue
		}
		if n++; n <= maxNamedStreams {
			names = append(names, fmt.Sprintf("%s (%s)", st.Engine, st.Endpoint))
		}
	}
	if n == 0 {
		return
	}
	if n > maxNamedStreams {
		names = append(names, fmt.Sprintf("and %d more", n-maxNamedStreams))
	}
	log.Warn("ready after grace period; engines not connected", "count", n, "not_connected", strings.Join(names, ", "))
}

// buildTokenizers opens the configured tokenizer backends: the engine's
// /tokenize first (exact, with chat templates), then a local file.
//
// Their caches share the memory budget's (memlimit.Split's Tokens, or
// memlimit.TokenCacheBytes without a budget) equally.
func buildTokenizers(o *Options) ([]server.NamedTokenizer, error) {
	var out []server.NamedTokenizer
	cacheBytes := cmp.Or(o.shares().Tokens, memlimit.TokenCacheBytes(0))
	if o.TokenizeURL != "" && o.hasLocalTokenizer() {
		cacheBytes /= 2
	}
	if o.TokenizeURL != "" {
		t, err := tokenizer.NewHTTP(tokenizer.HTTPConfig{BaseURL: o.TokenizeURL, CacheBytes: max(cacheBytes, 1)})
		if err != nil {
			return nil, configerr.New("TokenizeURL", "%v: %v", configerr.Field("TokenizeURL"), err)
		}
		out = append(out, server.NamedTokenizer{Source: client.SourceEngine, Tokenizer: t})
	}
	if o.hasLocalTokenizer() {
		local, err := LoadLocalTokenizer(o.TokenizerFile, o.ChatTemplateFile, cacheBytes)
		if err != nil {
			return nil, err
		}
		out = append(out, server.NamedTokenizer{Source: client.SourceLocal, Tokenizer: local})
	}
	return out, nil
}

// TokenizerSummary says which tokenizers o uses, in order.
func TokenizerSummary(o *Options) string {
	var parts []string
	if o.TokenizeURL != "" {
		parts = append(parts, "engine "+o.TokenizeURL)
	}
	if o.TokenizerFile != "" {
		parts = append(parts, "local "+localTokenizerSummary(o.TokenizerFile, o.ChatTemplateFile))
	}
	if len(parts) == 0 {
		return "none (token ids only)"
	}
	return strings.Join(parts, ", then ")
}

// buildInfoGauge is kvindex_build_info: 1, labelled with what the binary
// was built from, so dashboards can tell versions apart across a fleet.
func buildInfoGauge(in buildinfo.Info) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvindex_build_info",
		Help: "Always 1; the labels say what the running binary was built from.",
		ConstLabels: prometheus.Labels{
			"version": in.Version, "commit": in.ShortCommit(), "goversion": in.GoVersion,
		},
	})
	g.Set(1)
	return g
}

// Hub is the service's watch hub: the event source's sink.
func (s *Service) Hub() *watchhub.Hub { return s.hub }

// API is the service's query server.
func (s *Service) API() *server.Server { return s.api }

// Subscriber is the ZMQ subscriber; nil in NATS mode.
func (s *Service) Subscriber() *zmqtransport.Subscriber { return s.zsub }
