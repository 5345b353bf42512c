package main

import (
	"cmp"
	"fmt"
	"io"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/internal/bytesize"
	"github.com/kvindex/kvindex/internal/service"
	"github.com/kvindex/kvindex/kvevents/natstransport"
)

// relayFlags are kvindex relay's settings.
type relayFlags struct {
	engines   []string
	model     string
	nats      natsFlags
	buffer    bytesize.Value
	httpAddr  string
	heartbeat time.Duration
	log       logFlags
	check     bool
	discover  discoverFlags
}

func (f *relayFlags) register(fs *pflag.FlagSet) {
	f.buffer = bytesize.Value(natstransport.DefaultRelayBuffer)
	fs.StringArrayVar(&f.engines, "engine", nil, "engine to relay: POD=ENDPOINT[,replay=ENDPOINT][,ranks=N][,model=M][,topic=PREFIX]; repeatable")
	fs.StringVar(&f.model, "model", "", "model of the engines that name none")
	f.nats.register(fs, "NATS server URL(s) to publish to, e.g. nats://nats:4222 (comma-separated for a cluster); required")
	fs.Var(&f.buffer, "relay-buffer", "batches held in memory while NATS is unreachable, in bytes (e.g. 64MiB); beyond it batches are dropped and the hole is published, so replicas mark the engine degraded")
	fs.DurationVar(&f.heartbeat, "heartbeat", time.Second, "how often the relay tells replicas it is alive, with each engine's last seq and health; replicas mark the engines of a silent relay disconnected")
	fs.StringVar(&f.httpAddr, "http-addr", ":9300", "HTTP listen address: /metrics, /healthz, /readyz (ready while NATS is connected)")
	f.log.register(fs)
	f.discover.register(fs, true, false)
	fs.BoolVar(&f.check, "check", false, "validate the settings (flags, KVINDEX_* variables), print them and exit without connecting")
}

// options turns the flags into the relay's options.
func (f *relayFlags) options() (*service.RelayOptions, error) {
	o := &service.RelayOptions{Model: f.model, Conn: f.nats.conn(), HTTPAddr: f.httpAddr}
	if f.nats.url == "" {
		return nil, usagef("--nats is required: the NATS server to publish to, e.g. --nats nats://nats:4222")
	}
	var err error
	if o.Discover, err = f.discover.options(); err != nil {
		return nil, err
	}
	switch {
	case len(f.engines) == 0 && o.Discover == nil:
		return nil, usagef("no engine: give --engine POD=ENDPOINT (e.g. --engine vllm-0=%s) or --discover-selector LABELS (the pods found on Kubernetes, e.g. one relay per node)", relayExampleEngine)
	case o.Discover != nil && f.model == "":
		return nil, usagef("--discover-selector needs --model: the model of the engines it finds")
	}
	if o.Engines, err = parseEngines(f.engines, f.model); err != nil {
		return nil, err
	}
	if o.Stream, err = f.nats.streamConfig(); err != nil {
		return nil, err
	}
	switch {
	case f.buffer < 1<<20:
		return nil, usagef("--relay-buffer %s: want at least 1MiB", bytesize.Format(int64(f.buffer)))
	case f.heartbeat < 10*time.Millisecond || f.heartbeat > time.Minute:
		return nil, usagef("--heartbeat %v: want 10ms..1m", f.heartbeat)
	case f.httpAddr == "":
		return nil, usagef("--http-addr must not be empty")
	}
	o.Relay = natstransport.RelayConfig{Stream: o.Stream.Name, Model: f.model, MaxBuffer: int64(f.buffer), Heartbeat: f.heartbeat}
	return o, nil
}

// relayExampleEngine is the engine the help and the "no engine" hint show:
// two ranks, with the replay ports clear of the event ports vLLM offsets by
// the rank.
const relayExampleEngine = "tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5567,ranks=2"

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
		Example: `  kvindex relay --model Qwen/Qwen2.5-7B-Instruct --nats nats://nats:4222 --nats-auth-key nats.key \
      --engine "$POD_NAME=` + relayExampleEngine + `"`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := f.options()
			if err != nil {
				return err
			}
			log, err := f.log.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if f.check { // service.NewRelay loads the key otherwise
				if _, err := o.Conn.Auth(); err != nil {
					return configUsage(err, serveFlagNames)
				}
				return checkRelay(cmd.OutOrStdout(), o)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			r, err := service.NewRelay(o, log)
			if err == nil {
				err = r.Run(ctx)
			}
			return configUsage(err, serveFlagNames)
		},
	}
	f.register(cmd.Flags())
	return cmd
}

// checkRelay prints what relay would run.
func checkRelay(w io.Writer, o *service.RelayOptions) error {
	fmt.Fprintf(w, "settings ok: NATS %s, stream %s (max age %v, max bytes %s, %d replica(s)), buffer %s, HTTP %s\n",
		o.Conn.Redacted(), o.Stream.Name, o.Stream.MaxAge, bytesize.Format(o.Stream.MaxBytes), o.Stream.Replicas,
		bytesize.Format(o.Relay.MaxBuffer), o.HTTPAddr)
	if d := o.Discover; d != nil {
		fmt.Fprintf(w, "  discovery: pods %q in namespace %q, grace %v\n", d.Selector, cmp.Or(d.Namespace, "(kvindex's own)"), d.Grace)
	}
	for _, e := range o.Engines {
		fmt.Fprintf(w, "  engine %s (model %s): %s, replay %s, %d rank(s)\n", e.Name, e.Model, e.Endpoint, cmp.Or(e.ReplayEndpoint, "none"), max(e.Ranks, 1))
	}
	return nil
}
