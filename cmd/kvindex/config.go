package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/api/server"
	"github.com/kvindex/kvindex/internal/snapstore"
	"github.com/kvindex/kvindex/kvevents"
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
	memoryBudget   sizeValue
	tokenizeURL    string
	tokenizer      string
	maxQueryTokens int
	readyGrace     time.Duration
	pprof          bool
	stateDir       string
	snapshotEvery  time.Duration
	logLevel       string
	logFormat      string
	check          bool
	limits         limitFlags
	picker         bool
	pick           pickFlags
	security       securityFlags
	nats           natsFlags
	snapshotBucket string
	snapshotKeep   int
	discover       discoverFlags
}

func (f *serveFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.config, "config", "", "YAML file of settings keyed by flag name (e.g. grpc-addr: \":50051\"); the command line and KVINDEX_* variables override it")
	fs.StringVar(&f.grpcAddr, "grpc-addr", ":50051", "gRPC listen address")
	fs.StringVar(&f.httpAddr, "http-addr", ":8080", "HTTP listen address (JSON API, /metrics, /healthz, /readyz)")
	fs.StringVar(&f.model, "model", "", "model of engines that name none, and of queries that name none")
	fs.StringArrayVar(&f.engines, "engine", nil, "engine to connect to (connect mode): NAME=ENDPOINT[,replay=ENDPOINT][,ranks=N][,model=M][,topic=PREFIX]; repeatable")
	fs.StringVar(&f.listen, "listen", "", "bind a SUB socket here for engines to connect to (bind mode), e.g. tcp://*:5557; with --listen-ranks, on that many ports")
	fs.IntVar(&f.listenRanks, "listen-ranks", 1, "bind mode: the engines' data-parallel size; vLLM's rank r connects to the --listen port + r, so kvindex binds that many consecutive ports")
	fs.StringVar(&f.topicPattern, "topic-pattern", zmqtransport.LLMDTopicPattern, "bind mode: how topics name engines, with {pod} and optionally {model}")
	fs.StringVar(&f.replayTemplate, "replay-template", "", "bind mode: engines' replay endpoint; {addr} is the address the engine's events come from, e.g. tcp://{addr}:5567 ({pod} and {model}, from the topic, let whoever reaches --listen choose the host, so with --engine-allow the host must be {addr}); rank r replays on its port + r (default: no replay)")
	fs.StringArrayVar(&f.engineAllow, "engine-allow", nil, "bind mode: POD=CIDR, where the engines of a pod may connect from (POD exact, or a glob such as vllm-* or *; CIDR or one address); once given, connections from other addresses are refused at the ZMQ handshake, messages whose source the topic's pod does not allow are dropped (a pod named by an IP must come from it), both counted; repeatable")
	fs.IntVar(&f.maxEngines, "max-engines", zmqtransport.DefaultMaxEngines, "bind mode: most engine ranks to follow; further topics are refused and counted (kvindex_listener_refused_engines_total)")
	fs.DurationVar(&f.forgetAfter, "forget-after", zmqtransport.DefaultForgetAfter, "bind mode: forget an engine whose connection has been gone this long (its entries dropped, counted in kvindex_listener_forgotten_engines_total); it returns as new if it publishes again; 0: never")
	f.hash.register(fs)
	fs.Var(&f.memoryBudget, "memory-budget", "cap on the index's memory, e.g. 512MiB, 2GiB, 1.5GB or bytes; 0 means unlimited. It also bounds the process: Go memory limit of the budget + "+formatSize(goOverhead)+" (unless GOMEMLIMIT is set), event queues sized from 1/"+strconv.Itoa(queueShareDiv)+" of it")
	fs.StringVar(&f.tokenizeURL, "tokenize-url", "", "engine server root whose /tokenize tokenizes text and chat prompts, e.g. http://vllm:8000")
	fs.StringVar(&f.tokenizer, "tokenizer", "", "local tokenizer.json (or .json.gz) for text prompts (completion form only)")
	fs.IntVar(&f.maxQueryTokens, "max-query-tokens", server.DefaultMaxTokens, "largest prompt a query may carry, in tokens")
	fs.DurationVar(&f.readyGrace, "ready-grace", server.DefaultReadyGrace, "report ready after this long even if some engines never connected")
	fs.BoolVar(&f.pprof, "pprof", false, "removed: Go profiles are served on the admin listener, see --admin-addr")
	_ = fs.MarkHidden("pprof") // still refused with where profiles went; not listed in --help
	fs.StringVar(&f.stateDir, "state-dir", "", "directory where kvindex keeps its index and the engines' positions across restarts (created if missing; default: none, a restart starts empty)")
	fs.DurationVar(&f.snapshotEvery, "snapshot-interval", defaultSnapshotInterval, "with --state-dir: how often the state is saved (also when serve stops); ingest pauses while the index is copied, queries go on")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug|info|warn|error")
	fs.StringVar(&f.logFormat, "log-format", "text", "text|json")
	f.limits.register(fs)
	f.security.register(fs)
	fs.BoolVar(&f.picker, "picker", false, "also serve the endpoint picker (as kvindex picker does) over the index in this process: ext_proc on --extproc-addr, POST /v1/pick on --http-addr")
	f.pick.register(fs)
	f.nats.register(fs, "NATS mode: consume the KV events relays publish to JetStream (kvindex relay) instead of following engines over ZMQ, e.g. nats://nats:4222 (comma-separated for a cluster); replicas start from the newest snapshot in JetStream and are ready once caught up")
	fs.StringVar(&f.snapshotBucket, "snapshot-bucket", snapstore.DefaultBucket, "NATS mode: JetStream object store bucket of index snapshots (with KV buckets BUCKET-meta, the newest snapshot per model, and BUCKET-lease, the writer lease); one replica at a time writes one every --snapshot-interval and when it stops")
	fs.IntVar(&f.snapshotKeep, "snapshot-keep", snapstore.DefaultKeep, "NATS mode: snapshots kept in the bucket; older ones are deleted (a newest one that cannot be read falls back to the one before)")
	f.discover.register(fs, true, true)
	fs.BoolVar(&f.check, "check", false, "validate the settings (flags, KVINDEX_* variables, --config file, tokenizer file), print them and exit without listening or connecting")
}

// parseEngines parses the --engine values: each valid, no name twice, and
// ports that do not overlap (CheckLayout).
func parseEngines(values []string, defaultModel string) ([]zmqtransport.EngineConfig, error) {
	var out []zmqtransport.EngineConfig
	seen := map[string]bool{}
	for _, s := range values {
		ec, err := parseEngine(s, defaultModel)
		if err != nil {
			return nil, err
		}
		if seen[ec.Name] {
			return nil, usagef("--engine %q: the name %q is used twice", s, ec.Name)
		}
		seen[ec.Name] = true
		out = append(out, ec)
	}
	var le *zmqtransport.LayoutError
	if err := zmqtransport.CheckLayout(out); errors.As(err, &le) {
		return nil, usagef("--engine %q: %s", values[le.Index], le.Detail)
	}
	return out, nil
}

// parseEngine parses one --engine value:
// NAME=ENDPOINT[,replay=ENDPOINT][,ranks=N][,model=M][,topic=PREFIX].
// An endpoint without a scheme is taken as tcp://.
func parseEngine(s, defaultModel string) (zmqtransport.EngineConfig, error) {
	var ec zmqtransport.EngineConfig
	name, rest, ok := strings.Cut(s, "=")
	if !ok || rest == "" {
		return ec, usagef("--engine %q: missing \"=ENDPOINT\" (want NAME=ENDPOINT[,replay=ENDPOINT][,ranks=N][,model=M])", s)
	}
	if name == "" || strings.ContainsAny(name, ", \t") {
		return ec, usagef("--engine %q: the name must be non-empty, without commas or spaces", s)
	}
	parts := strings.Split(rest, ",")
	ec.Name, ec.Endpoint, ec.Model, ec.Ranks = name, endpoint(parts[0]), defaultModel, 1
	if parts[0] == "" {
		return ec, usagef("--engine %q: empty endpoint", s)
	}
	for _, opt := range parts[1:] {
		k, v, ok := strings.Cut(opt, "=")
		if !ok || v == "" {
			return ec, usagef("--engine %q: option %q: want KEY=VALUE (replay, ranks, model or topic)", s, opt)
		}
		switch k {
		case "replay":
			ec.ReplayEndpoint = endpoint(v)
		case "ranks":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > kvevents.MaxDPRank {
				return ec, usagef("--engine %q: ranks=%s: want an integer in 1..%d", s, v, kvevents.MaxDPRank)
			}
			ec.Ranks = n
		case "model":
			ec.Model = v
		case "topic":
			ec.Topic = v
		default:
			return ec, usagef("--engine %q: unknown option %q (want replay, ranks, model or topic)", s, k)
		}
	}
	if ec.Model == "" {
		return ec, usagef("--engine %q: no model: add ,model=M or set --model", s)
	}
	if err := zmqtransport.CheckConnectEndpoint(ec.Endpoint, ec.Ranks); err != nil {
		return ec, engineEndpointError(s, ec, false, err)
	}
	if ec.ReplayEndpoint != "" {
		if err := zmqtransport.CheckConnectEndpoint(ec.ReplayEndpoint, ec.Ranks); err != nil {
			return ec, engineEndpointError(s, ec, true, err)
		}
	}
	var le *zmqtransport.LayoutError
	if err := zmqtransport.CheckLayout([]zmqtransport.EngineConfig{ec}); errors.As(err, &le) {
		return ec, usagef("--engine %q: %s", s, le.Detail)
	}
	return ec, nil
}

// engineEndpointError explains why kvindex cannot connect to an --engine
// value's event (or replay) endpoint. A "*" host is what the engine's own
// configuration says where it binds; kvindex needs the engine's address,
// or bind mode.
func engineEndpointError(s string, ec zmqtransport.EngineConfig, replay bool, err error) error {
	var ee *zmqtransport.EndpointError
	if !errors.As(err, &ee) {
		return usagef("--engine %q: %v", s, err)
	}
	which := ""
	if replay {
		which = "replay "
	}
	if !ee.Wildcard {
		return usagef("--engine %q: %s%v", s, which, ee)
	}
	port := ee.Endpoint[strings.LastIndexByte(ee.Endpoint, ':')+1:]
	if !replay {
		return usagef("--engine %q: a connect-mode endpoint needs the engine's host, e.g. tcp://10.0.0.5:%s; %q binds — for engines that connect to kvindex, use --listen 'tcp://*:%s' (bind mode)",
			s, port, hostOf(ee.Endpoint), port)
	}
	example := "tcp://10.0.0.5:" + port
	if zmqtransport.CheckConnectEndpoint(ec.Endpoint, 1) == nil && strings.HasPrefix(ec.Endpoint, "tcp://") {
		example = "tcp://" + hostOf(ec.Endpoint) + ":" + port
	}
	return usagef("--engine %q: the replay endpoint needs the engine's host, e.g. replay=%s (%q is where the engine binds it)", s, example, hostOf(ee.Endpoint))
}

// hostOf returns the host of a tcp://HOST:PORT endpoint.
func hostOf(ep string) string {
	rest := strings.TrimPrefix(ep, "tcp://")
	if i := strings.LastIndexByte(rest, ':'); i >= 0 {
		return rest[:i]
	}
	return rest
}

// endpoint adds tcp:// to a bare host:port.
func endpoint(s string) string {
	if s == "" || strings.Contains(s, "://") {
		return s
	}
	return "tcp://" + s
}

// parseSize parses a memory size: plain bytes, or a number (fractions
// allowed) with a decimal (kB, MB, GB, TB; k, M, G, T) or binary (KiB, MiB,
// GiB, TiB; Ki, Mi, Gi, Ti) unit. A trailing "B" alone means bytes.
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := len(t)
	for i > 0 && (t[i-1] < '0' || t[i-1] > '9') && t[i-1] != '.' {
		i--
	}
	num, unit := strings.TrimSpace(t[:i]), strings.TrimSpace(t[i:])
	if num == "" {
		return 0, fmt.Errorf("%q: want a size such as 512MiB, 2GiB, 1.5GB or a byte count", s)
	}
	mult := float64(1)
	switch strings.ToLower(unit) {
	case "", "b":
	case "k", "kb":
		mult = 1e3
	case "m", "mb":
		mult = 1e6
	case "g", "gb":
		mult = 1e9
	case "t", "tb":
		mult = 1e12
	case "ki", "kib":
		mult = 1 << 10
	case "mi", "mib":
		mult = 1 << 20
	case "gi", "gib":
		mult = 1 << 30
	case "ti", "tib":
		mult = 1 << 40
	default:
		return 0, fmt.Errorf("%q: unknown unit %q (want B, kB, MB, GB, TB, KiB, MiB, GiB or TiB)", s, unit)
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("%q: %q is not a non-negative number", s, num)
	}
	bytes := v * mult
	if bytes >= math.MaxInt64 {
		return 0, fmt.Errorf("%q: too large", s)
	}
	return int64(bytes), nil
}

// sizeValue is a flag holding a byte count, written as parseSize accepts.
type sizeValue int64

func (v *sizeValue) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	*v = sizeValue(n)
	return nil
}

func (v *sizeValue) Type() string { return "size" }

// String prints the size exactly, in the largest binary unit that divides
// it, so the value reads back unchanged.
func (v *sizeValue) String() string {
	n := int64(*v)
	for _, u := range []struct {
		name  string
		bytes int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.bytes == 0 {
			return fmt.Sprintf("%d%s", n/u.bytes, u.name)
		}
	}
	return fmt.Sprintf("%d", n)
}

// formatSize prints a byte count for logs.
func formatSize(n int64) string {
	if n == 0 {
		return "unlimited"
	}
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	v, i := float64(n), 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	return fmt.Sprintf("%.4g%s", v, units[i])
}

// newLogger builds the process logger from --log-level and --log-format.
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
