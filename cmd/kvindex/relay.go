package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/internal/buildinfo"
	"github.com/kvindex/kvindex/kvevents/natstransport"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// relayFlags are kvindex relay's settings.
type relayFlags struct {
	engines   []string
	model     string
	nats      natsFlags
	buffer    sizeValue
	httpAddr  string
	heartbeat time.Duration
	logLevel  string
	logFormat string
	check     bool
	discover  discoverFlags
}

func (f *relayFlags) register(fs *pflag.FlagSet) {
	f.buffer = sizeValue(natstransport.DefaultRelayBuffer)
	fs.StringArrayVar(&f.engines, "engine", nil, "engine to relay: POD=ENDPOINT[,replay=ENDPOINT][,ranks=N][,model=M][,topic=PREFIX]; repeatable")
	fs.StringVar(&f.model, "model", "", "model of the engines that name none")
	f.nats.register(fs, "NATS server URL(s) to publish to, e.g. nats://nats:4222 (comma-separated for a cluster); required")
	fs.Var(&f.buffer, "relay-buffer", "batches held in memory while NATS is unreachable, in bytes (e.g. 64MiB); beyond it batches are dropped and the hole is published, so replicas mark the engine degraded")
	fs.DurationVar(&f.heartbeat, "heartbeat", time.Second, "how often the relay tells replicas it is alive, with each engine's last seq and health; replicas mark the engines of a silent relay disconnected")
	fs.StringVar(&f.httpAddr, "http-addr", ":9300", "HTTP listen address: /metrics, /healthz, /readyz (ready while NATS is connected)")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug|info|warn|error")
	fs.StringVar(&f.logFormat, "log-format", "text", "text|json")
	f.discover.register(fs, true, false)
	fs.BoolVar(&f.check, "check", false, "validate the settings (flags, KVINDEX_* variables), print them and exit without connecting")
}

// relayOptions is relay's validated configuration.
type relayOptions struct {
	engines  []zmqtransport.EngineConfig
	discover *discoverOptions // nil without --discover-selector
	model    string
	nats     *natsFlags
	stream   natstransport.StreamConfig
	relay    natstransport.RelayConfig
	httpAddr string
}

func (f *relayFlags) options() (*relayOptions, error) {
	o := &relayOptions{model: f.model, nats: &f.nats, httpAddr: f.httpAddr}
	if !f.nats.enabled() {
		return nil, usagef("--nats is required: the NATS server to publish to, e.g. --nats nats://nats:4222")
	}
	var err error
	if o.discover, err = f.discover.options(); err != nil {
		return nil, err
	}
	switch {
	case len(f.engines) == 0 && o.discover == nil:
		return nil, usagef("no engine: give --engine POD=ENDPOINT (e.g. --engine vllm-0=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5558) or --discover-selector LABELS (the pods found on Kubernetes, e.g. one relay per node)")
	case o.discover != nil && f.model == "":
		return nil, usagef("--discover-selector needs --model: the model of the engines it finds")
	}
	if o.engines, err = parseEngines(f.engines, f.model); err != nil {
		return nil, err
	}
	if o.stream, err = f.nats.streamConfig(); err != nil {
		return nil, err
	}
	switch {
	case f.buffer < 1<<20:
		return nil, usagef("--relay-buffer %s: want at least 1MiB", formatSize(int64(f.buffer)))
	case f.heartbeat < 10*time.Millisecond || f.heartbeat > time.Minute:
		return nil, usagef("--heartbeat %v: want 10ms..1m", f.heartbeat)
	case f.httpAddr == "":
		return nil, usagef("--http-addr must not be empty")
	}
	o.relay = natstransport.RelayConfig{Stream: o.stream.Name, Model: f.model, MaxBuffer: int64(f.buffer), Heartbeat: f.heartbeat}
	return o, nil
}

func newRelayCmd() *cobra.Command {
	var f relayFlags
	cmd := &cobra.Command{
		Use:   "relay --engine POD=ENDPOINT ... --nats URL",
		Short: "Forward engines' KV events to NATS JetStream, for replicated kvindex serve --nats",
		Long: `relay runs beside one or more engines (a sidecar in the vLLM pod, or one per
node), follows their KV events exactly as serve does (replay of gaps, engine
restart detection), and publishes each batch unchanged to the JetStream
stream --nats-stream on the subject kvevents.<model>.<pod>.<rank>. Any number
of "kvindex serve --nats" replicas consume that stream, each building the
same index, and start warm from snapshots kept in JetStream.

Publishing is idempotent: a batch re-sent after a reconnect is stored once.
While NATS is unreachable the relay holds up to --relay-buffer bytes of
batches; beyond that it drops them and publishes the hole once NATS is back,
so the replicas report the engine degraded rather than answer from a cache
they no longer mirror. Replicas that stop hearing the relay's heartbeat report
its engines disconnected.`,
		Example: `  kvindex relay --model Qwen/Qwen3-8B --nats nats://nats:4222 \
      --engine "$POD_NAME=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5558,ranks=2"`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := f.options()
			if err != nil {
				return err
			}
			log, err := newLogger(cmd.ErrOrStderr(), f.logLevel, f.logFormat)
			if err != nil {
				return err
			}
			if f.check {
				return checkRelay(cmd.OutOrStdout(), o)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return runRelay(ctx, o, log)
		},
	}
	f.register(cmd.Flags())
	return cmd
}

// checkRelay prints what relay would run.
func checkRelay(w io.Writer, o *relayOptions) error {
	fmt.Fprintf(w, "settings ok: NATS %s, stream %s (max age %v, max bytes %s, %d replica(s)), buffer %s, HTTP %s\n",
		o.nats.url, o.stream.Name, o.stream.MaxAge, formatSize(o.stream.MaxBytes), o.stream.Replicas,
		formatSize(o.relay.MaxBuffer), o.httpAddr)
	if d := o.discover; d != nil {
		fmt.Fprintf(w, "  discovery: pods %q in namespace %q, grace %v\n", d.selector, cmpOr(d.namespace, "(kvindex's own)"), d.grace)
	}
	for _, e := range o.engines {
		fmt.Fprintf(w, "  engine %s (model %s): %s, replay %s, %d rank(s)\n", e.Name, e.Model, e.Endpoint, cmpOr(e.ReplayEndpoint, "none"), max(e.Ranks, 1))
	}
	return nil
}

// runRelay relays until ctx ends.
func runRelay(ctx context.Context, o *relayOptions, log *slog.Logger) error {
	r, err := startRelay(ctx, o, log)
	if err != nil {
		return err
	}
	<-ctx.Done()
	return r.stop()
}

// runningRelay is a started relay: NATS connection, publisher, subscriber
// and HTTP server.
type runningRelay struct {
	log   *slog.Logger
	relay *natstransport.Relay
	sub   *zmqtransport.Subscriber
	http  *http.Server
	addr  string // resolved HTTP address
	close func()
}

func startRelay(ctx context.Context, o *relayOptions, log *slog.Logger) (*runningRelay, error) {
	host, _ := os.Hostname()
	nc, js, err := o.nats.connect("kvindex-relay "+host, log.With("component", "nats"))
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", o.httpAddr)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("--http-addr %s: %w", o.httpAddr, err)
	}
	relay, err := natstransport.NewRelay(js, o.relay, log.With("component", "relay"))
	if err != nil {
		lis.Close()
		nc.Close()
		return nil, err
	}
	sub, err := zmqtransport.NewSubscriber(zmqtransport.SubscriberConfig{Engines: o.engines}, relay, log.With("component", "kvevents"))
	if err != nil {
		lis.Close()
		nc.Close()
		return nil, subscriberConfigError(err)
	}
	relay.SetStreams(sub.Streams)
	var discover func(context.Context) error
	if o.discover != nil {
		discover, err = discoveredEngines(o.discover, o.model, log.With("component", "discovery"), sub.AddEngine,
			func(name string) { sub.RemoveEngine(name) })
		if err != nil {
			sub.Close()
			lis.Close()
			nc.Close()
			return nil, err
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildInfoGauge(buildinfo.Read()))
	for _, c := range relay.Collectors() {
		reg.MustRegister(c)
	}
	log.Info("kvindex relay starting", "nats", nc.ConnectedUrlRedacted(), "stream", o.stream.Name, "model", o.model,
		"engines", len(o.engines), "buffer", formatSize(o.relay.MaxBuffer))
	// The stream is ensured in the background: the events of an engine
	// are buffered (up to --relay-buffer) until it exists.
	go func() {
		if err := ensureStream(ctx, js, o.stream, log); err != nil && ctx.Err() == nil {
			log.Error("giving up on the stream", "err", err)
		}
	}()
	if err := relay.Start(ctx); err != nil {
		sub.Close()
		lis.Close()
		nc.Close()
		return nil, err
	}
	if err := sub.Start(); err != nil {
		relay.Close()
		lis.Close()
		nc.Close()
		return nil, fmt.Errorf("%s", strings.TrimPrefix(err.Error(), "zmqtransport: "))
	}
	if discover != nil {
		go func() {
			if err := discover(ctx); err != nil && ctx.Err() == nil {
				log.Error("discovery stopped", "err", err)
			}
		}()
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !nc.IsConnected() {
			http.Error(w, "NATS not connected", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute}
	go func() {
		if err := hs.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("HTTP server", "err", err)
		}
	}()
	log.Info("relaying", "http", lis.Addr().String())
	return &runningRelay{
		log: log, relay: relay, sub: sub, http: hs, addr: lis.Addr().String(),
		close: nc.Close,
	}, nil
}

// stop closes the subscriber first (no new batches), then lets the relay
// flush what it holds, then the NATS connection.
func (r *runningRelay) stop() error {
	r.sub.Close()
	err := r.relay.Close()
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	r.http.Shutdown(ctx)
	r.close()
	r.log.Info("relay stopped")
	return err
}
