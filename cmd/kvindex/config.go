package main

import (
	"io"
	"log/slog"
	"strconv"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/internal/bytesize"
	"github.com/kvindex/kvindex/internal/memlimit"
	"github.com/kvindex/kvindex/internal/service"
	"github.com/kvindex/kvindex/internal/snapstore"
	"github.com/kvindex/kvindex/internal/telemetry"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// serveFlags are kvindex serve's settings. Every flag can also come from
// the environment or the --config file (see applySettings).
type serveFlags struct {
	config         string
	grpcAddr       string
	httpAddr       string
	model          string
	engines        []string
	listen         string
	listenRanks    int
	topicPattern   string
	replayTemplate string
	engineAllow    []string
	maxEngines     int
	forgetAfter    time.Duration
	hash           hashFlags
	memoryBudget   bytesize.Value
	tokenizeURL    string
	tok            tokenizerFlags
	maxQueryTokens int
	readyGrace     time.Duration
	pprof          bool
	stateDir       string
	snapshotEvery  time.Duration
	log            logFlags
	check          bool
	limits         limitFlags
	picker         bool
	pick           pickFlags
	security       securityFlags
	nats           natsFlags
	snapshotBucket string
	snapshotKeep   int
	discover       discoverFlags
	trace          telemetry.Flags
}

func (f *serveFlags) register(fs *pflag.FlagSet) {
	d := service.DefaultOptions()
	fs.StringVar(&f.config, "config", "", "YAML file of settings keyed by flag name (e.g. grpc-addr: \":50051\"); the command line and KVINDEX_* variables override it")
	fs.StringVar(&f.grpcAddr, "grpc-addr", d.GRPCAddr, "gRPC listen address")
	fs.StringVar(&f.httpAddr, "http-addr", d.HTTPAddr, "HTTP listen address (JSON API, /metrics, /healthz, /readyz)")
	fs.StringVar(&f.model, "model", "", "model of engines that name none, and of queries that name none")
	fs.StringArrayVar(&f.engines, "engine", nil, "engine to connect to (connect mode): NAME=ENDPOINT[,replay=ENDPOINT][,ranks=N][,model=M][,topic=PREFIX]; repeatable. Without replay= an engine is exact only until its first reconnect (then unconfirmed)")
	fs.StringVar(&f.listen, "listen", "", "bind a SUB socket here for engines to connect to (bind mode), e.g. tcp://*:5557; with --listen-ranks, on that many ports")
	fs.IntVar(&f.listenRanks, "listen-ranks", d.ListenRanks, "bind mode: the engines' data-parallel size; vLLM's rank r connects to the --listen port + r, so kvindex binds that many consecutive ports")
	fs.StringVar(&f.topicPattern, "topic-pattern", d.TopicPattern, "bind mode: how topics name engines, with {pod} and optionally {model}")
	fs.StringVar(&f.replayTemplate, "replay-template", "", "bind mode: engines' replay endpoint; {addr} is the address the engine's events come from, e.g. tcp://{addr}:5567 ({pod} and {model}, from the topic, let whoever reaches --listen choose the host, so with --engine-allow the host must be {addr}); rank r replays on its port + r (default: no replay, and engines without replay are exact only until their first reconnect)")
	fs.StringArrayVar(&f.engineAllow, "engine-allow", nil, "bind mode (required there, unless --discover-selector): POD=CIDR, where the engines of a pod may connect from (POD exact, or a glob such as vllm-* or *; CIDR or one address; '*=127.0.0.0/8' to try it on one machine; a glob over a network lets its engines speak for each other, and is warned about); connections from other addresses are refused at the ZMQ handshake, messages whose source the topic's pod does not allow are dropped (a pod named by an IP must come from it), both counted; repeatable")
	fs.IntVar(&f.maxEngines, "max-engines", d.MaxEngines, "bind mode: most engine ranks admitted by a glob --engine-allow rule (or by none) to follow; engines named by an exact rule, by discovery or by their own IP address are never refused; further topics are refused and counted (kvindex_listener_refused_engines_total); 0: as many as 1/"+strconv.Itoa(memlimit.EngineShareDiv)+" of --memory-budget holds at "+bytesize.Format(memlimit.EngineBytes)+" each, one per "+bytesize.Format(memlimit.EngineShareDiv*memlimit.EngineBytes)+" (at most "+strconv.Itoa(zmqtransport.DefaultMaxEngines)+", the number without a budget)")
	fs.DurationVar(&f.forgetAfter, "forget-after", d.ForgetAfter, "bind mode: forget an engine whose connection has been gone this long (its entries dropped, counted in kvindex_listener_forgotten_engines_total); it returns as new if it publishes again; 0: never")
	f.hash.register(fs)
	memoryBudgetFlag(fs, &f.memoryBudget, "cap on the memory of the index, the event queues, the engines' state and the tokenizers' caches",
		"The queues get up to 1/"+strconv.Itoa(memlimit.QueueShareDiv)+" of it, each engine rank "+bytesize.Format(memlimit.EngineBytes)+", the tokenizers' caches 1/"+strconv.Itoa(memlimit.TokenShareDiv)+" (at most "+bytesize.Format(memlimit.DefaultTokenCacheBytes)+"), the index the rest (at least half). ")
	fs.StringVar(&f.tokenizeURL, "tokenize-url", "", "engine server root whose /tokenize tokenizes text and chat prompts, e.g. http://vllm:8000")
	f.tok.register(fs)
	fs.IntVar(&f.maxQueryTokens, "max-query-tokens", d.MaxQueryTokens, "largest prompt a query may carry, in tokens")
	fs.DurationVar(&f.readyGrace, "ready-grace", d.ReadyGrace, "report ready after this long even if some engines never connected")
	fs.BoolVar(&f.pprof, "pprof", false, "removed: Go profiles are served on the admin listener, see --admin-addr")
	_ = fs.MarkHidden("pprof") // still refused with where profiles went; not listed in --help
	fs.StringVar(&f.stateDir, "state-dir", "", "directory where kvindex keeps its index and the engines' positions across restarts (created if missing; default: none, a restart starts empty)")
	fs.DurationVar(&f.snapshotEvery, "snapshot-interval", d.SnapshotInterval, "with --state-dir: how often the state is saved (also when serve stops); ingest pauses while the index is copied, queries go on")
	f.log.register(fs)
	f.limits.register(fs)
	f.security.register(fs)
	fs.BoolVar(&f.picker, "picker", false, "also serve the endpoint picker (as kvindex picker does) over the index in this process: ext_proc on --extproc-addr, POST /v1/pick on --http-addr")
	f.pick.register(fs)
	f.nats.register(fs, "NATS mode: consume the KV events relays publish to JetStream (kvindex relay) instead of following engines over ZMQ, e.g. nats://nats:4222 (comma-separated for a cluster); replicas start from the newest snapshot in JetStream and are ready once caught up")
	fs.StringVar(&f.snapshotBucket, "snapshot-bucket", snapstore.DefaultBucket, "NATS mode: JetStream object store bucket of index snapshots (with KV buckets BUCKET-meta, the newest snapshot per model, and BUCKET-lease, the writer lease); one replica at a time writes one every --snapshot-interval and when it stops")
	fs.IntVar(&f.snapshotKeep, "snapshot-keep", snapstore.DefaultKeep, "NATS mode: snapshots kept in the bucket; older ones are deleted (a newest one that cannot be read falls back to the one before)")
	f.discover.register(fs, true, true)
	f.trace.Register(fs, "kvindex-serve")
	fs.BoolVar(&f.check, "check", false, "validate the settings (flags, KVINDEX_* variables, --config file, tokenizer file), print them and exit without listening or connecting")
}

// tokenizerFlags are --tokenizer and --chat-template, serve's and picker's.
type tokenizerFlags struct{ file, chatTemplate string }

func (f *tokenizerFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.file, "tokenizer", "", "local tokenizer.json (or .json.gz) for text prompts (and chat, with --chat-template)")
	fs.StringVar(&f.chatTemplate, "chat-template", "", "the model's chat template (tokenizer_config.json or .jinja) with which --tokenizer renders chat prompts")
}

// memoryBudgetFlag declares --memory-budget, serve's and picker's: what
// it caps, how it is shared out (a sentence, or none), then the process
// bound and the request bodies' share.
func memoryBudgetFlag(fs *pflag.FlagSet, v *bytesize.Value, what, shares string) {
	fs.Var(v, "memory-budget", what+", e.g. 512MiB, 2GiB, 1.5GB or bytes; 0 means unlimited. "+shares+"It also bounds the process, to the budget + 10% + "+bytesize.Format(memlimit.FixedOverhead)+": the Go memory limit within that (unless GOMEMLIMIT is set); the request bodies buffered at once get 1/"+strconv.Itoa(memlimit.BodyShareDiv)+" of the budget (at least one of the largest)")
}

// parseEngines parses the --engine values (zmqtransport.ParseEngines).
func parseEngines(values []string, defaultModel string) ([]zmqtransport.EngineConfig, error) {
	engines, err := zmqtransport.ParseEngines(values, defaultModel)
	return engines, configUsage(err, serveFlagNames)
}

// logFlags are --log-level and --log-format, the same in every command
// that runs until stopped.
type logFlags struct{ level, format string }

func (f *logFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.level, "log-level", "info", "debug|info|warn|error")
	fs.StringVar(&f.format, "log-format", "text", "text|json")
}

// logger builds the process logger, writing to w.
func (f *logFlags) logger(w io.Writer) (*slog.Logger, error) { return newLogger(w, f.level, f.format) }

// newLogger builds a logger of level and format.
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usagef("--log-format %q: want text or json", format)
}
