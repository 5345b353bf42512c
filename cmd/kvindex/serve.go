package main

import (
	"cmp"
	"fmt"
	"io"
	"log/slog"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/bytesize"
	"github.com/kvindex/kvindex/internal/service"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

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
default, see --topic-pattern) name them, and --engine-allow rules (or
discovery) say who may speak for which pod: bind mode refuses to start
without either (--engine-allow '*=127.0.0.0/8' tries it on one machine).

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
		Example: `  kvindex serve --model Qwen/Qwen2.5-7B-Instruct --hash-algo sha256_cbor --hash-seed 0 \
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
			log, err := f.log.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if f.check {
				return checkServe(cmd.OutOrStdout(), opts, log)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			svc, err := service.New(opts, log)
			if err == nil {
				err = svc.Run(ctx)
			}
			return configUsage(err, serveFlagNames)
		},
	}
	f.register(cmd.Flags())
	return cmd
}

// options turns the flags into the service's options, checking what
// only the flags know (their syntax, and which apply together); the
// service checks the rest.
func (f *serveFlags) options() (*service.Options, error) {
	h, err := f.hash.hasher()
	if err != nil {
		return nil, err
	}
	o := &service.Options{
		GRPCAddr: f.grpcAddr, HTTPAddr: f.httpAddr, Model: f.model,
		Listen: zmqtransport.TCPEndpoint(f.listen), ListenRanks: f.listenRanks, TopicPattern: f.topicPattern, ReplayTemplate: f.replayTemplate,
		MaxEngines: f.maxEngines, ForgetAfter: f.forgetAfter,
		Index:       indexer.Options{Hasher: h, MemoryBudget: int64(f.memoryBudget)},
		TokenizeURL: f.tokenizeURL, TokenizerFile: f.tok.file, ChatTemplateFile: f.tok.chatTemplate,
		MaxQueryTokens: f.maxQueryTokens, ReadyGrace: f.readyGrace,
		StateDir: f.stateDir, SnapshotInterval: f.snapshotEvery,
	}
	if o.Engines, err = parseEngines(f.engines, f.model); err != nil {
		return nil, err
	}
	if err := f.checkBindMode(); err != nil {
		return nil, err
	}
	if o.EngineAllow, err = f.allowRules(); err != nil {
		return nil, err
	}
	if o.Discover, err = f.discover.options(); err != nil {
		return nil, err
	}
	if o.NATS, err = f.natsOptions(); err != nil {
		return nil, err
	}
	if err := o.Validate(); err != nil {
		return nil, configUsage(err, serveFlagNames)
	}
	if o.Limits, err = f.limits.limits(o.MaxQueryTokens); err != nil {
		return nil, err
	}
	if o.Security, o.AdminAddr, err = f.security.options(f.pprof); err != nil {
		return nil, err
	}
	if o.Picker, err = f.pickerOptions(o.Discover != nil); err != nil {
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
	if err := zmqtransport.CheckBindEndpoint(zmqtransport.TCPEndpoint(f.listen), f.listenRanks); err != nil {
		return usagef("--listen %q: %s", f.listen, service.EndpointReason(err))
	}
	if f.replayTemplate != "" {
		if err := zmqtransport.CheckReplayTemplate(f.replayTemplate, f.listenRanks); err != nil {
			return usagef("--replay-template %q: %s", f.replayTemplate, service.EndpointReason(err))
		}
	}
	return nil
}

// checkServe builds every part from the settings without starting any,
// prints what serve would run, and reports the first bad setting.
func checkServe(w io.Writer, o *service.Options, log *slog.Logger) error {
	if err := service.Check(o, log); err != nil {
		return configUsage(err, serveFlagNames)
	}
	hc := o.Index.Hasher.Config()
	fmt.Fprintf(w, "settings ok: hash %s seed %q, block size %d, memory budget %s, model %q\n",
		hc.Algo, hc.Seed, hc.BlockSize, bytesize.Format(o.Index.MemoryBudget), o.Model)
	fmt.Fprintf(w, "  gRPC %s, HTTP %s, tokenizer %s\n", o.GRPCAddr, o.HTTPAddr, service.TokenizerSummary(o))
	for _, e := range o.Engines {
		fmt.Fprintf(w, "  engine %s (model %s): %s, replay %s, %d rank(s)\n", e.Name, e.Model, e.Endpoint, cmp.Or(e.ReplayEndpoint, "none"), max(e.Ranks, 1))
	}
	if d := o.Discover; d != nil && o.Listen == "" {
		fmt.Fprintf(w, "  discover pods %s in namespace %s: %s, replay %s, %d rank(s), grace %v\n", d.Selector, cmp.Or(d.Namespace, "(kvindex's own)"), d.Endpoint, cmp.Or(d.Replay, "none"), d.Ranks, d.Grace)
	} else if d != nil {
		fmt.Fprintf(w, "  discover pods %s in namespace %s: admitted from their IPs, grace %v\n", d.Selector, cmp.Or(d.Namespace, "(kvindex's own)"), d.Grace)
	}
	if o.Listen != "" {
		fmt.Fprintf(w, "  listen %s, %d rank(s), topics %s, replay %s, engine allow rules %d\n", o.Listen, o.ListenRanks, o.TopicPattern, cmp.Or(o.ReplayTemplate, "none"), len(o.EngineAllow))
	}
	if n := o.NATS; n != nil {
		fmt.Fprintf(w, "  NATS %s, stream %s (max age %v, max bytes %s, %d replica(s)), snapshots in %s every %v, %d kept\n",
			n.Conn.Redacted(), n.Stream.Name, n.Stream.MaxAge, bytesize.Format(n.Stream.MaxBytes), n.Stream.Replicas,
			n.Snapshot.Bucket, n.Interval, n.Snapshot.Keep)
	}
	if o.StateDir != "" {
		fmt.Fprintf(w, "  state dir %s (%s), snapshot every %v\n", o.StateDir, service.DescribeState(o.StateDir), o.SnapshotInterval)
	}
	return nil
}
