package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/server"
	"github.com/kvindex/kvindex/api/server/security"
	"github.com/kvindex/kvindex/api/watchhub"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/buildinfo"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
	"github.com/kvindex/kvindex/tokenizer"
)

// shutdownGrace bounds how long a stop waits for in-flight requests.
const shutdownGrace = 10 * time.Second

func newServeCmd() *cobra.Command {
	var f serveFlags
	cmd := &cobra.Command{
		Use:   "serve (--engine NAME=ENDPOINT ... | --discover-selector LABELS | --listen ENDPOINT)",
		Short: "Follow the engines' KV events and answer prefix-cache queries over gRPC and HTTP",
		Long: `serve subscribes to the KV-cache events of the engines, keeps the fleet-wide
index, and answers queries: gRPC (kvindex.v1.IndexService, llm-d's
indexer.v1.IndexerService, health, reflection) on --grpc-addr, and HTTP/JSON
(/v1/longest-prefix, /v1/lookup, /v1/pods, /metrics, /healthz, /readyz) on
--http-addr.

Connect mode (--engine, repeatable): kvindex connects to each engine's PUB
socket (vLLM's endpoint "tcp://*:5557"). Bind mode (--listen): kvindex binds
one socket and the engines connect to it; their topics (kv@<pod>@<model> by
default, see --topic-pattern) name them.

On Kubernetes, --discover-selector finds the engines instead (or besides
--engine): kvindex watches the pods the label selector picks in
--discover-namespace and connects to each one that is Running with an IP
(ready or not: vLLM publishes before it is ready), at --discover-endpoint and
--discover-replay with {ip} the pod's IP, naming it by the pod. A pod that
goes away is followed for --discover-grace more, then dropped with its
entries; one whose IP changes is replaced at once. With --listen (bind
mode) the pods connect to kvindex instead and discovery admits them: each
pod's name and IP (the topic names one of them) may speak from its IP only,
besides the --engine-allow rules; other sources' messages are dropped (not
their connections: an engine may connect before its pod is listed). kvindex needs
to get, list and watch pods (deploy/kubernetes/components/discovery).
Readiness counts the --engine streams only.

vLLM's data-parallel rank r uses the event port + r and the replay port + r,
so an engine's event and replay ports must be at least its rank count apart
(e.g. 5557 and 5567); kvindex refuses layouts that overlap. In bind mode rank
r connects to the --listen port + r: give --listen-ranks.

Every flag can also be set in a YAML --config file, keyed by flag name;
flags on the command line override the file.`,
		Example: `  kvindex serve --model Qwen/Qwen2.5-7B --hash-algo sha256_cbor --hash-seed 0 \
      --engine pod-a=tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5567 \
      --engine pod-b=tcp://10.0.0.6:5557,replay=tcp://10.0.0.6:5567,ranks=2
  kvindex serve --listen 'tcp://*:5557' --listen-ranks 2 --replay-template 'tcp://{addr}:5567' \
      --engine-allow '*=10.244.0.0/16' --hash-algo sha256_cbor --tokenize-url http://vllm:8000
  kvindex serve --config kvindex.yaml --log-format json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, err := f.options()
			if err != nil {
				return err
			}
			log, err := newLogger(cmd.ErrOrStderr(), f.logLevel, f.logFormat)
			if err != nil {
				return err
			}
			if f.check {
				return configFlags(checkServe(cmd.OutOrStdout(), opts, log), serverFlagNames)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return configFlags(runServe(ctx, opts, log), serverFlagNames)
		},
	}
	f.register(cmd.Flags())
	return cmd
}

// serveOptions is serve's validated configuration.
type serveOptions struct {
	grpcAddr, httpAddr string
	model              string
	engines            []zmqtransport.EngineConfig
	listen             string
	listenRanks        int
	topicPattern       string
	replayTemplate     string
	engineAllow        []zmqtransport.AllowRule
	maxEngines         int
	forgetAfter        time.Duration
	index              indexer.Options
	tokenizeURL        string
	tokenizerFile      string
	maxQueryTokens     int
	readyGrace         time.Duration
	limits             server.Limits
	stateDir           string
	snapshotInterval   time.Duration
	security           security.Config
	adminAddr          string
	picker             *pickerOptions   // nil without --picker
	discover           *discoverOptions // nil without --discover-selector
	nats               *natsOptions     // nil without --nats
}

// options validates the flags.
func (f *serveFlags) options() (*serveOptions, error) {
	h, err := f.hash.hasher()
	if err != nil {
		return nil, err
	}
	budget := int64(f.memoryBudget)
	o := &serveOptions{
		grpcAddr: f.grpcAddr, httpAddr: f.httpAddr, model: f.model,
		listen: f.listen, listenRanks: f.listenRanks, topicPattern: f.topicPattern, replayTemplate: f.replayTemplate,
		maxEngines: f.maxEngines, forgetAfter: f.forgetAfter,
		index:       indexer.Options{Hasher: h, MemoryBudget: budget},
		tokenizeURL: f.tokenizeURL, tokenizerFile: f.tokenizer,
		maxQueryTokens: f.maxQueryTokens, readyGrace: f.readyGrace,
		stateDir: f.stateDir, snapshotInterval: f.snapshotEvery,
	}
	if o.engines, err = parseEngines(f.engines, f.model); err != nil {
		return nil, err
	}
	if err := f.checkBindMode(); err != nil {
		return nil, err
	}
	if o.engineAllow, err = f.allowRules(); err != nil {
		return nil, err
	}
	if o.discover, err = f.discover.options(); err != nil {
		return nil, err
	}
	if o.nats, err = f.natsOptions(); err != nil {
		return nil, err
	}
	switch {
	case o.nats != nil && (len(o.engines) > 0 || o.listen != "" || o.discover != nil):
		return nil, usagef("--nats replaces --engine, --listen and --discover-selector: in NATS mode the engines' events come from relays (kvindex relay) through JetStream")
	case o.nats != nil && o.stateDir != "":
		return nil, usagef("--state-dir does not apply with --nats: NATS mode keeps its snapshots in JetStream (--snapshot-bucket)")
	case o.nats != nil && o.model == "":
		return nil, usagef("--nats needs --model: a replica consumes one model's events")
	case len(o.engines) == 0 && o.listen == "" && o.discover == nil && o.nats == nil:
		return nil, usagef("no event source: give --engine NAME=ENDPOINT (connect mode), --discover-selector LABELS (connect mode, pods found on Kubernetes), --listen ENDPOINT (bind mode) or --nats URL (NATS mode, fed by kvindex relay)")
	case o.discover != nil && o.listen == "" && o.model == "":
		return nil, usagef("--discover-selector needs --model: the model of the engines it finds")
	case o.discover != nil && o.listen != "" && o.discover.connectFlagsSet():
		return nil, usagef("--discover-endpoint, --discover-replay and --discover-ranks apply to connect mode; with --listen (bind mode) the pods connect to kvindex (see --listen-ranks and --replay-template)")
	case o.discover != nil && o.listen != "" && !strings.HasPrefix(endpoint(o.listen), "tcp://"):
		return nil, usagef("--discover-selector in bind mode needs a tcp --listen endpoint, not %q: the discovered pods are allowed by their source address", o.listen)
	case o.grpcAddr == "" || o.httpAddr == "":
		return nil, usagef("--grpc-addr and --http-addr must not be empty")
	case o.grpcAddr == o.httpAddr && !strings.HasSuffix(o.grpcAddr, ":0"):
		return nil, usagef("--grpc-addr and --http-addr are both %q", o.grpcAddr)
	case o.maxQueryTokens < 1 || o.maxQueryTokens > server.MaxMaxTokens:
		return nil, usagef("--max-query-tokens %d: want an integer in 1..%d", o.maxQueryTokens, server.MaxMaxTokens)
	case o.readyGrace < 0:
		return nil, usagef("--ready-grace %v: must not be negative", o.readyGrace)
	case o.forgetAfter < 0:
		return nil, usagef("--forget-after %v: must not be negative (0: never)", o.forgetAfter)
	case o.maxEngines < 1:
		return nil, usagef("--max-engines %d: want at least 1", o.maxEngines)
	case o.snapshotInterval < minSnapshotInterval:
		return nil, usagef("--snapshot-interval %v: want at least %v", o.snapshotInterval, minSnapshotInterval)
	}
	if o.limits, err = f.limits.limits(o.maxQueryTokens); err != nil {
		return nil, err
	}
	if o.security, o.adminAddr, err = f.security.options(f.pprof); err != nil {
		return nil, err
	}
	if o.listen != "" {
		o.listen = endpoint(o.listen)
	}
	if o.picker, err = f.pickerOptions(o.discover != nil); err != nil {
		return nil, err
	}
	return o, nil
}

// checkBindMode validates the bind-mode flags: they apply with --listen
// only, and name endpoints kvindex can bind and connect to.
func (f *serveFlags) checkBindMode() error {
	if f.listenRanks < 1 || f.listenRanks > kvevents.MaxDPRank {
		return usagef("--listen-ranks %d: want an integer in 1..%d", f.listenRanks, kvevents.MaxDPRank)
	}
	if f.listen == "" {
		switch {
		case f.replayTemplate != "":
			return usagef("--replay-template applies to bind mode (--listen) only; in connect mode give each engine's replay endpoint: --engine NAME=ENDPOINT,replay=ENDPOINT")
		case f.topicPattern != zmqtransport.LLMDTopicPattern:
			return usagef("--topic-pattern applies to bind mode (--listen) only; in connect mode an engine is named by --engine NAME=ENDPOINT (and filtered with ,topic=PREFIX)")
		case f.listenRanks != 1:
			return usagef("--listen-ranks applies to bind mode (--listen) only; in connect mode give each engine's ranks: --engine NAME=ENDPOINT,ranks=N")
		}
		return nil
	}
	if err := zmqtransport.CheckBindEndpoint(endpoint(f.listen), f.listenRanks); err != nil {
		return usagef("--listen %q: %s", f.listen, endpointReason(err))
	}
	if f.replayTemplate != "" {
		if err := zmqtransport.CheckReplayTemplate(f.replayTemplate, f.listenRanks); err != nil {
			return usagef("--replay-template %q: %s", f.replayTemplate, endpointReason(err))
		}
	}
	return nil
}

// endpointReason is what an endpoint error says is wrong, without the
// endpoint (the caller names the flag and its value).
func endpointReason(err error) string {
	var ee *zmqtransport.EndpointError
	if errors.As(err, &ee) {
		return ee.Reason
	}
	return err.Error()
}

// service is a running kvindex: subscriber, index, API servers.
type service struct {
	log      *slog.Logger
	index    *indexer.Index
	hub      *watchhub.Hub
	sub      eventSource
	api      *server.Server
	grpc     *grpc.Server
	http     *http.Server
	admin    *http.Server // nil without --admin-addr
	grpcAddr string       // resolved listen addresses
	httpAddr string
	state    *stateDir // nil without --state-dir
	adminLis net.Listener
	picker   *servePicker // nil without --picker

	done chan struct{}
	err  error
}

// checkServe builds every part from the settings without starting any,
// prints what serve would run, and reports the first bad setting.
func checkServe(w io.Writer, o *serveOptions, log *slog.Logger) error {
	p, err := buildParts(o, log, false)
	if err != nil {
		return err
	}
	defer p.sub.Close()
	hc := o.index.Hasher.Config()
	fmt.Fprintf(w, "settings ok: hash %s seed %q, block size %d, memory budget %s, model %q\n",
		hc.Algo, hc.Seed, hc.BlockSize, formatSize(o.index.MemoryBudget), o.model)
	fmt.Fprintf(w, "  gRPC %s, HTTP %s, tokenizer %s\n", o.grpcAddr, o.httpAddr, tokenizerSummary(o))
	for _, e := range o.engines {
		fmt.Fprintf(w, "  engine %s (model %s): %s, replay %s, %d rank(s)\n", e.Name, e.Model, e.Endpoint, cmpOr(e.ReplayEndpoint, "none"), max(e.Ranks, 1))
	}
	if d := o.discover; d != nil && o.listen == "" {
		fmt.Fprintf(w, "  discover pods %s in namespace %s: %s, replay %s, %d rank(s), grace %v\n", d.selector, cmpOr(d.namespace, "(kvindex's own)"), d.endpoint, cmpOr(d.replay, "none"), d.ranks, d.grace)
	} else if d != nil {
		fmt.Fprintf(w, "  discover pods %s in namespace %s: admitted from their IPs, grace %v\n", d.selector, cmpOr(d.namespace, "(kvindex's own)"), d.grace)
	}
	if o.listen != "" {
		fmt.Fprintf(w, "  listen %s, %d rank(s), topics %s, replay %s, engine allow rules %d\n", o.listen, o.listenRanks, o.topicPattern, cmpOr(o.replayTemplate, "none"), len(o.engineAllow))
	}
	if n := o.nats; n != nil {
		fmt.Fprintf(w, "  NATS %s, stream %s (max age %v, max bytes %s, %d replica(s)), snapshots in %s every %v, %d kept\n",
			n.flags.url, n.stream.Name, n.stream.MaxAge, formatSize(n.stream.MaxBytes), n.stream.Replicas,
			n.snapshot.Bucket, n.interval, n.snapshot.Keep)
	}
	if o.stateDir != "" {
		fmt.Fprintf(w, "  state dir %s (%s), snapshot every %v\n", o.stateDir, describeState(o.stateDir), o.snapshotInterval)
	}
	return nil
}

// runServe runs kvindex until ctx is done, then stops it gracefully.
func runServe(ctx context.Context, o *serveOptions, log *slog.Logger) error {
	s, err := startService(ctx, o, log)
	if err != nil {
		return err
	}
	return s.wait()
}

// parts are serve's pieces, built from validated options but not started:
// nothing listens or connects yet.
type parts struct {
	index *indexer.Index
	hub   *watchhub.Hub
	sub   eventSource
	api   *server.Server
	state *stateDir // nil without --state-dir
}

// buildParts builds every part, loading what the settings name (a local
// tokenizer file), so that a bad setting stops serve before anything
// listens. --check stops here. With restore, the state directory's index
// and positions are loaded (--check only checks the directory).
func buildParts(o *serveOptions, log *slog.Logger, restore bool) (*parts, error) {
	toks, err := buildTokenizers(o)
	if err != nil {
		return nil, err
	}
	ix, err := indexer.New(o.index)
	if err != nil {
		return nil, err
	}
	var state *stateDir
	var resume []kvevents.Position
	if o.stateDir != "" {
		if state, err = newStateDir(o, ix, log.With("component", "state")); err != nil {
			return nil, err
		}
		if restore {
			resume = state.restore(o)
		}
	}
	hub := watchhub.New(ix, o.limits.Limits)
	var src eventSource
	var zsub *zmqtransport.Subscriber
	var replica *natsReplica
	if o.nats != nil {
		if replica, err = newNATSReplica(o.nats, o.model, o.index.Hasher.Config(), ix, hub, log.With("component", "nats")); err != nil {
			return nil, err
		}
		src = replica
	} else {
		scfg := zmqtransport.SubscriberConfig{
			Engines: o.engines, Listen: o.listen, ListenRanks: o.listenRanks, TopicPattern: o.topicPattern,
			Model: o.model, ReplayTemplate: o.replayTemplate, MaxEngines: o.maxEngines, EngineAllow: o.engineAllow, ForgetAfter: forgetAfter(o.forgetAfter),
			EngineAllowDynamic: o.discover != nil && o.listen != "",
			RcvHWM:             memoryLimits(o.index.MemoryBudget, o.streams()).rcvHWM, Resume: resume,
		}
		if zsub, err = zmqtransport.NewSubscriber(scfg, hub, log.With("component", "kvevents")); err != nil {
			return nil, subscriberConfigError(err)
		}
		src = zsub
	}
	expect := 0
	for _, e := range o.engines {
		expect += max(e.Ranks, 1)
	}
	grace := o.readyGrace
	if grace == 0 {
		grace = time.Nanosecond // ready at once
	}
	scfg := server.Config{
		Index: ix, BlockSize: o.index.Hasher.BlockSize(), Tokenizers: toks, Hub: hub, Streams: src,
		DefaultModel: o.model, MaxTokens: o.maxQueryTokens, ExpectStreams: expect, ReadyGrace: grace,
		Logger: log.With("component", "api"), Limits: o.limits, Security: o.security,
		Fleet: o.picker.fleetSource(),
	}
	if replica != nil {
		// Ready once caught up with the stream, however long that takes.
		scfg.ReadyWhen, scfg.ReadyGrace = replica.CaughtUp(), -1
		scfg.IndexSeq = replica.IndexSeq
	}
	srv, err := server.New(scfg)
	if err == nil {
		err = srv.Registry().Register(buildInfoGauge(buildinfo.Read()))
	}
	if err == nil && state != nil {
		state.sub = zsub
		for _, c := range state.collectors() {
			if err = srv.Registry().Register(c); err != nil {
				break
			}
		}
	}
	if err == nil && replica != nil {
		replica.reg = srv.Registry()
		for _, c := range replica.collectors() {
			if err = srv.Registry().Register(c); err != nil {
				break
			}
		}
	}
	if err != nil {
		src.Close()
		return nil, err
	}
	return &parts{index: ix, hub: hub, sub: src, api: srv, state: state}, nil
}

// eventSource is where serve's events come from: the ZMQ subscriber
// (connect and bind modes) or a NATS replica.
type eventSource interface {
	Start() error
	Streams() []kvevents.StreamStats
	Close() error
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

// startService builds and starts every part, and returns once kvindex
// listens; it stops when ctx is done (wait reports how that went).
func startService(ctx context.Context, o *serveOptions, log *slog.Logger) (*service, error) {
	p, err := buildParts(o, log, true)
	if err != nil {
		return nil, err
	}
	ix, sub, srv := p.index, p.sub, p.api
	memoryLimits(o.index.MemoryBudget, o.streams()).apply(log)

	// Each listener opened is closed again if a later step fails.
	var opened []func()
	fail := func(err error) (*service, error) {
		for i := len(opened) - 1; i >= 0; i-- {
			opened[i]()
		}
		return nil, err
	}
	grpcLis, err := net.Listen("tcp", o.grpcAddr)
	if err != nil {
		return fail(fmt.Errorf("--grpc-addr %s: %w", o.grpcAddr, err))
	}
	opened = append(opened, func() { grpcLis.Close() })
	httpLis, err := net.Listen("tcp", o.httpAddr)
	if err != nil {
		return fail(fmt.Errorf("--http-addr %s: %w", o.httpAddr, err))
	}
	opened = append(opened, func() { httpLis.Close() })
	adminLis, err := listenAdmin(o.adminAddr)
	if err != nil {
		return fail(err)
	}
	opened = append(opened, func() { closeAdmin(adminLis) })
	pk, err := listenPicker(o.picker, srv, log)
	if err != nil {
		return fail(err)
	}
	opened = append(opened, pk.close)
	zsub, _ := sub.(*zmqtransport.Subscriber) // discovery is refused in NATS mode
	discover, err := startDiscovery(o, zsub, pk, log)
	if err != nil {
		return fail(err)
	}
	hcfg := o.index.Hasher.Config()
	log.Info("kvindex starting",
		"hash_algo", string(hcfg.Algo), "hash_seed", hcfg.Seed, "block_size", hcfg.BlockSize,
		"memory_budget", formatSize(o.index.MemoryBudget), "model", o.model, "engines", len(o.engines),
		"listen", cmpOr(o.listen, "none"), "listen_ranks", o.listenRanks, "tokenizer", tokenizerSummary(o),
		"max_query_tokens", o.maxQueryTokens, "ready_grace", o.readyGrace.String())
	// The subscriber logs each engine it follows and its listen socket.
	if err := sub.Start(); err != nil {
		return fail(fmt.Errorf("%s", strings.TrimPrefix(err.Error(), "zmqtransport: ")))
	}
	s := &service{
		log: log, index: ix, hub: p.hub, sub: sub, api: srv,
		grpc:     srv.NewGRPCServer(),
		http:     srv.NewHTTPServer(server.HTTPOptions{}),
		grpcAddr: grpcLis.Addr().String(),
		httpAddr: httpLis.Addr().String(),
		state:    p.state,
		adminLis: adminLis,
		picker:   pk,
		done:     make(chan struct{}),
	}
	s.http.Handler = pk.handler(s.http.Handler, srv)
	log.Info("serving", "grpc", s.grpcAddr, "http", s.httpAddr, "admin", s.adminAddr())
	logLimits(log, o.limits)
	logSecurity(log, o.security, s.grpcAddr, s.httpAddr, s.adminAddr())

	var wg sync.WaitGroup
	errs := make(chan error, 4)
	s.serveAdmin(&wg, errs)
	pk.serve(&wg, errs)
	wg.Add(3)
	go func() {
		defer wg.Done()
		if err := s.grpc.Serve(grpcLis); err != nil {
			errs <- fmt.Errorf("gRPC server: %w", err)
		}
	}()
	go func() {
		defer wg.Done()
		if err := s.http.Serve(srv.LimitListener(httpLis)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs <- fmt.Errorf("HTTP server: %w", err)
		}
	}()
	runCtx, cancelRun := context.WithCancel(ctx)
	go func() {
		defer wg.Done()
		srv.Run(runCtx)
	}()
	if discover != nil {
		wg.Go(func() {
			if err := discover(runCtx); err != nil && runCtx.Err() == nil {
				errs <- err
			}
		})
	}
	if s.state != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.state.run(runCtx.Done())
		}()
	}
	if o.readyGrace > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-srv.ReadyC():
				logNotConnected(log, sub.Streams())
			case <-runCtx.Done():
			}
		}()
	}
	go func() {
		var cause error
		select {
		case <-ctx.Done():
		case cause = <-errs:
			log.Error("stopping", "err", cause)
		}
		cancelRun()
		s.err = errors.Join(cause, s.shutdown())
		wg.Wait()
		close(s.done)
	}()
	return s, nil
}

// maxNamedStreams bounds the streams one log line names.
const maxNamedStreams = 20

// logNotConnected names the engine streams that were not connected when
// kvindex became ready: --ready-grace ran out before they connected.
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

// shutdown stops accepting requests, lets in-flight ones finish (within
// shutdownGrace), ends Watch streams and closes the subscriber.
func (s *service) shutdown() error {
	s.log.Info("shutting down")
	s.api.Shutdown() // NOT_SERVING, and Watch streams end
	stopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(stopped)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	herr := errors.Join(s.http.Shutdown(ctx), s.shutdownAdmin(ctx))
	s.picker.stop(ctx)
	select {
	case <-stopped:
	case <-ctx.Done():
		s.grpc.Stop()
		<-stopped
	}
	var sterr error
	if s.state != nil {
		// The last word: what the engines sent up to now, so that a
		// restart resumes from here.
		sterr = s.state.write(shutdownSnapshot)
	}
	serr := s.sub.Close()
	s.log.Info("stopped")
	return errors.Join(herr, sterr, serr)
}

// wait blocks until the service has stopped.
func (s *service) wait() error {
	<-s.done
	return s.err
}

// buildTokenizers opens the configured tokenizer backends: the engine's
// /tokenize first (exact, with chat templates), then a local file.
func buildTokenizers(o *serveOptions) ([]server.NamedTokenizer, error) {
	var out []server.NamedTokenizer
	if o.tokenizeURL != "" {
		t, err := tokenizer.NewHTTP(tokenizer.HTTPConfig{BaseURL: o.tokenizeURL})
		if err != nil {
			return nil, usagef("--tokenize-url: %s", strings.TrimPrefix(err.Error(), "tokenizer: "))
		}
		out = append(out, server.NamedTokenizer{Source: client.SourceEngine, Tokenizer: t})
	}
	if o.tokenizerFile != "" {
		t, err := tokenizer.LoadFile(o.tokenizerFile)
		if err != nil {
			return nil, usagef("--tokenizer %s: %s", o.tokenizerFile, strings.TrimPrefix(err.Error(), "tokenizer: "))
		}
		out = append(out, server.NamedTokenizer{Source: client.SourceLocal, Tokenizer: t})
	}
	return out, nil
}

func tokenizerSummary(o *serveOptions) string {
	var parts []string
	if o.tokenizeURL != "" {
		parts = append(parts, "engine "+o.tokenizeURL)
	}
	if o.tokenizerFile != "" {
		parts = append(parts, "local "+o.tokenizerFile)
	}
	if len(parts) == 0 {
		return "none (token ids only)"
	}
	return strings.Join(parts, ", then ")
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// subscriberConfigError names the flag a subscriber configuration error
// comes from.
func subscriberConfigError(err error) error {
	msg := strings.TrimPrefix(err.Error(), "zmqtransport: ")
	switch {
	case strings.HasPrefix(msg, "engine allow"):
		return usagef("--engine-allow: %s", msg)
	case strings.HasPrefix(msg, "replay template"):
		return usagef("--replay-template: %s", msg)
	case strings.HasPrefix(msg, "topic"):
		return usagef("--topic-pattern: %s", msg)
	case strings.HasPrefix(msg, "engine"):
		return usagef("--%s", msg)
	}
	return usagef("%s", msg)
}

// forgetAfter maps --forget-after onto SubscriberConfig.ForgetAfter, whose
// zero means its default: the flag's 0 means never.
func forgetAfter(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
