package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// serveFlags are kvindex serve's settings. Every flag can also be given as
// a key of the same name in a YAML --config file; flags given on the
// command line win over the file.
type serveFlags struct {
	config         string
	grpcAddr       string
	httpAddr       string
	model          string
	engines        []string
	listen         string
	topicPattern   string
	replayTemplate string
	hash           hashFlags
	memoryBudget   string
	tokenizeURL    string
	tokenizer      string
	maxQueryTokens int
	readyGrace     time.Duration
	pprof          bool
	logLevel       string
	logFormat      string
}

func (f *serveFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.config, "config", "", "YAML file of settings, keyed by flag name (e.g. grpc-addr: \":50051\"); flags override it")
	fs.StringVar(&f.grpcAddr, "grpc-addr", ":50051", "gRPC listen address")
	fs.StringVar(&f.httpAddr, "http-addr", ":8080", "HTTP listen address (JSON API, /metrics, /healthz, /readyz)")
	fs.StringVar(&f.model, "model", "", "model of engines that name none, and of queries that name none")
	fs.StringArrayVar(&f.engines, "engine", nil, "engine to connect to (connect mode): NAME=ENDPOINT[,replay=ENDPOINT][,ranks=N][,model=M][,topic=PREFIX]; repeatable")
	fs.StringVar(&f.listen, "listen", "", "bind one SUB socket here for engines to connect to (bind mode), e.g. tcp://*:5557")
	fs.StringVar(&f.topicPattern, "topic-pattern", zmqtransport.LLMDTopicPattern, "bind mode: how topics name engines, with {pod} and optionally {model}")
	fs.StringVar(&f.replayTemplate, "replay-template", "", "bind mode: engines' replay endpoint, with {pod}, e.g. tcp://{pod}:5558 (default: no replay)")
	f.hash.register(fs, "hash-algo", "hash-seed")
	fs.StringVar(&f.memoryBudget, "memory-budget", "0", "cap on the index's memory, e.g. 512MiB, 2GiB, 1.5GB or bytes; 0 means unlimited")
	fs.StringVar(&f.tokenizeURL, "tokenize-url", "", "engine server root whose /tokenize tokenizes text and chat prompts, e.g. http://vllm:8000")
	fs.StringVar(&f.tokenizer, "tokenizer", "", "local tokenizer.json (or .json.gz) for text prompts (completion form only)")
	fs.IntVar(&f.maxQueryTokens, "max-query-tokens", api.DefaultMaxTokens, "largest prompt a query may carry, in tokens")
	fs.DurationVar(&f.readyGrace, "ready-grace", api.DefaultReadyGrace, "report ready after this long even if some engines never connected")
	fs.BoolVar(&f.pprof, "pprof", false, "serve Go profiles under /debug/pprof/ on the HTTP address")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug|info|warn|error")
	fs.StringVar(&f.logFormat, "log-format", "text", "text|json")
}

// fileConfig is the YAML form of serveFlags. Pointers tell a key that is
// absent from one set to its zero value.
type fileConfig struct {
	GRPCAddr       *string  `yaml:"grpc-addr"`
	HTTPAddr       *string  `yaml:"http-addr"`
	Model          *string  `yaml:"model"`
	Engine         []string `yaml:"engine"`
	Listen         *string  `yaml:"listen"`
	TopicPattern   *string  `yaml:"topic-pattern"`
	ReplayTemplate *string  `yaml:"replay-template"`
	HashAlgo       *string  `yaml:"hash-algo"`
	HashSeed       *string  `yaml:"hash-seed"`
	BlockSize      *int     `yaml:"block-size"`
	MemoryBudget   *string  `yaml:"memory-budget"`
	TokenizeURL    *string  `yaml:"tokenize-url"`
	Tokenizer      *string  `yaml:"tokenizer"`
	MaxQueryTokens *int     `yaml:"max-query-tokens"`
	ReadyGrace     *string  `yaml:"ready-grace"`
	Pprof          *bool    `yaml:"pprof"`
	LogLevel       *string  `yaml:"log-level"`
	LogFormat      *string  `yaml:"log-format"`
}

// maxConfigFile bounds a --config file.
const maxConfigFile = 1 << 20

// applyConfigFile reads path and sets every flag it names that the
// command line did not set, so that flags override the file. Unknown keys
// are errors.
func applyConfigFile(fs *pflag.FlagSet, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return usagef("--config: %v", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigFile+1))
	if err != nil {
		return usagef("--config %s: %v", path, err)
	}
	if len(data) > maxConfigFile {
		return usagef("--config %s: larger than %d bytes", path, maxConfigFile)
	}
	var fc fileConfig
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&fc); err != nil && !errors.Is(err, io.EOF) {
		return usagef("--config %s: %s", path, yamlError(err))
	}
	set := func(name string, v string) error {
		if fs.Changed(name) {
			return nil
		}
		if err := fs.Set(name, v); err != nil {
			return usagef("--config %s: %s: %v", path, name, err)
		}
		return nil
	}
	str := func(name string, p *string) error {
		if p == nil {
			return nil
		}
		return set(name, *p)
	}
	for _, e := range []error{
		str("grpc-addr", fc.GRPCAddr), str("http-addr", fc.HTTPAddr), str("model", fc.Model),
		str("listen", fc.Listen), str("topic-pattern", fc.TopicPattern), str("replay-template", fc.ReplayTemplate),
		str("hash-algo", fc.HashAlgo), str("hash-seed", fc.HashSeed), str("memory-budget", fc.MemoryBudget),
		str("tokenize-url", fc.TokenizeURL), str("tokenizer", fc.Tokenizer), str("ready-grace", fc.ReadyGrace),
		str("log-level", fc.LogLevel), str("log-format", fc.LogFormat),
	} {
		if e != nil {
			return e
		}
	}
	if fc.BlockSize != nil {
		if err := set("block-size", strconv.Itoa(*fc.BlockSize)); err != nil {
			return err
		}
	}
	if fc.MaxQueryTokens != nil {
		if err := set("max-query-tokens", strconv.Itoa(*fc.MaxQueryTokens)); err != nil {
			return err
		}
	}
	if fc.Pprof != nil {
		if err := set("pprof", strconv.FormatBool(*fc.Pprof)); err != nil {
			return err
		}
	}
	if !fs.Changed("engine") {
		for _, e := range fc.Engine {
			if err := fs.Set("engine", e); err != nil {
				return usagef("--config %s: engine: %v", path, err)
			}
		}
	}
	return nil
}

// yamlError turns yaml.v3's multi-line errors into one line, naming
// unknown keys as such.
func yamlError(err error) string {
	var parts []string
	for _, l := range strings.Split(err.Error(), "\n") {
		l = strings.TrimSpace(strings.TrimPrefix(l, "yaml: "))
		if l == "" || l == "unmarshal errors:" {
			continue
		}
		if i := strings.Index(l, ": field "); i >= 0 && strings.Contains(l, " not found in type ") {
			key := l[i+len(": field ") : strings.Index(l, " not found in type ")]
			l = l[:i] + ": unknown key " + strconv.Quote(key) + " (keys are serve's flag names)"
		}
		parts = append(parts, l)
	}
	return strings.Join(parts, "; ")
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
	return ec, nil
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
