package service

import (
	"strings"
	"time"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/server"
	"github.com/kvindex/kvindex/api/server/security"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/internal/memlimit"
	"github.com/kvindex/kvindex/internal/snapstore"
	"github.com/kvindex/kvindex/internal/telemetry"
	"github.com/kvindex/kvindex/kvevents/natstransport"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// Defaults and bounds of the state directory's snapshots.
const (
	DefaultSnapshotInterval = 30 * time.Second
	// MinSnapshotInterval keeps a mistyped interval (1ms) from turning
	// snapshots into a standing ingest pause.
	MinSnapshotInterval = 100 * time.Millisecond
)

// ShutdownGrace bounds how long a stop waits for in-flight requests and
// the parts' other stopping work, all together.
const ShutdownGrace = 10 * time.Second

// Options is the index service's configuration. Validate checks the
// combinations; the parts check their own settings when built.
type Options struct {
	GRPCAddr, HTTPAddr string
	// Model is the model of engines and queries that name none.
	Model string
	// Engines are followed in connect mode.
	Engines []zmqtransport.EngineConfig
	// Listen is bind mode's endpoint, ListenRanks its ports.
	Listen         string
	ListenRanks    int
	TopicPattern   string
	ReplayTemplate string
	EngineAllow    []zmqtransport.AllowRule
	// MaxEngines caps bind mode's engine ranks; 0: from the memory
	// budget (memlimit.MaxEngines).
	MaxEngines int
	// ForgetAfter: bind mode forgets engines gone this long; 0: never.
	ForgetAfter time.Duration
	Index       indexer.Options
	// TokenizeURL is the engine's /tokenize root; TokenizerFile a local
	// tokenizer.json. Either, both (the engine first) or none.
	// ChatTemplateFile (a tokenizer_config.json or .jinja) lets the local
	// tokenizer render chat prompts too; it needs TokenizerFile.
	TokenizeURL, TokenizerFile, ChatTemplateFile string
	MaxQueryTokens                               int
	ReadyGrace                                   time.Duration
	Limits                                       server.Limits
	// StateDir keeps the index across restarts, written every
	// SnapshotInterval and at stop; "" for none.
	StateDir         string
	SnapshotInterval time.Duration
	Security         security.Config
	// AdminAddr serves profiles and metrics; "" for none.
	AdminAddr string
	Picker    *PickerOptions // nil: no in-process picker
	// Tracing exports spans of the API's calls and queries (and the
	// in-process picker's) over OTLP; off when its Endpoint is "".
	Tracing  telemetry.Config
	Discover *DiscoverOptions // nil: no discovery
	NATS     *NATSOptions     // nil: not a NATS replica
}

// DefaultOptions are the index service's defaults, kvindex serve's
// flags' among them: gRPC on client.DefaultPort and HTTP on 8080 on every
// interface, vLLM's default hashing, no event source yet.
func DefaultOptions() *Options {
	return &Options{
		GRPCAddr: ":" + client.DefaultPort, HTTPAddr: ":8080",
		ListenRanks: 1, TopicPattern: zmqtransport.LLMDTopicPattern,
		ForgetAfter:    zmqtransport.DefaultForgetAfter,
		Index:          indexer.Options{Hasher: blockhash.MustNew(blockhash.DefaultConfig())},
		MaxQueryTokens: server.DefaultMaxTokens, ReadyGrace: server.DefaultReadyGrace,
		Limits: server.DefaultLimits, SnapshotInterval: DefaultSnapshotInterval,
	}
}

// NATSOptions make the service a NATS replica.
type NATSOptions struct {
	Conn     NATSConn
	Stream   natstransport.StreamConfig
	Snapshot snapstore.Config
	// Interval is how often the lease holder writes a snapshot.
	Interval time.Duration
}

// Validate checks the settings' combinations: an event source, settings
// that apply to the chosen one, and the bounds.
func (o *Options) Validate() error {
	f := func(s string) configerr.Field { return configerr.Field(s) }
	switch {
	case o.NATS != nil && (len(o.Engines) > 0 || o.Listen != "" || o.Discover != nil):
		return configerr.New("NATS", "%v replaces %v, %v and %v: in NATS mode the engines' events come from relays (kvindex relay) through JetStream",
			f("NATS"), f("Engines"), f("Listen"), f("Discover"))
	case o.NATS != nil && o.StateDir != "":
		return configerr.New("StateDir", "%v does not apply with %v: NATS mode keeps its snapshots in JetStream (%v)", f("StateDir"), f("NATS"), f("NATS.Snapshot.Bucket"))
	case o.NATS != nil && o.Model == "":
		return configerr.New("Model", "%v needs %v: a replica consumes one model's events", f("NATS"), f("Model"))
	case o.NATS != nil && o.NATS.Conn.checkAuth() != nil:
		return o.NATS.Conn.checkAuth()
	case len(o.Engines) == 0 && o.Listen == "" && o.Discover == nil && o.NATS == nil:
		return configerr.New("Engines", "no event source: give %v NAME=ENDPOINT (connect mode), %v LABELS (connect mode, pods found on Kubernetes), %v ENDPOINT (bind mode) or %v URL (NATS mode, fed by kvindex relay)",
			f("Engines"), f("Discover"), f("Listen"), f("NATS"))
	case o.Discover != nil && o.Listen == "" && o.Model == "":
		return configerr.New("Model", "%v needs %v: the model of the engines it finds", f("Discover"), f("Model"))
	case o.Discover != nil && o.Listen != "" && o.Discover.connectSettingsSet():
		return configerr.New("Discover.Endpoint", "%v, %v and %v apply to connect mode; with %v (bind mode) the pods connect to kvindex (see %v and %v)",
			f("Discover.Endpoint"), f("Discover.Replay"), f("Discover.Ranks"), f("Listen"), f("ListenRanks"), f("ReplayTemplate"))
	case o.Discover != nil && o.Listen != "" && !strings.HasPrefix(o.Listen, "tcp://"):
		return configerr.New("Listen", "%v in bind mode needs a tcp %v endpoint, not %q: the discovered pods are allowed by their source address", f("Discover"), f("Listen"), o.Listen)
	case o.GRPCAddr == "" || o.HTTPAddr == "":
		return configerr.New("GRPCAddr", "%v and %v must not be empty", f("GRPCAddr"), f("HTTPAddr"))
	case o.GRPCAddr == o.HTTPAddr && !strings.HasSuffix(o.GRPCAddr, ":0"):
		return configerr.New("GRPCAddr", "%v and %v are both %q", f("GRPCAddr"), f("HTTPAddr"), o.GRPCAddr)
	case o.MaxQueryTokens < 1 || o.MaxQueryTokens > server.MaxMaxTokens:
		return configerr.New("MaxQueryTokens", "%v %d: want an integer in 1..%d", f("MaxQueryTokens"), o.MaxQueryTokens, server.MaxMaxTokens)
	case o.ReadyGrace < 0:
		return configerr.New("ReadyGrace", "%v %v: must not be negative", f("ReadyGrace"), o.ReadyGrace)
	case o.ForgetAfter < 0:
		return configerr.New("ForgetAfter", "%v %v: must not be negative (0: never)", f("ForgetAfter"), o.ForgetAfter)
	case o.MaxEngines < 0:
		return configerr.New("MaxEngines", "%v %d: want at least 1 (0: from the memory budget)", f("MaxEngines"), o.MaxEngines)
	case o.splitErr() != nil:
		return configerr.New("Index.MemoryBudget", "%v: %w: raise it, or follow fewer engines (%v, %v)", f("Index.MemoryBudget"), o.splitErr(), f("Engines"), f("MaxEngines"))
	case o.SnapshotInterval < MinSnapshotInterval:
		return configerr.New("SnapshotInterval", "%v %v: want at least %v", f("SnapshotInterval"), o.SnapshotInterval, MinSnapshotInterval)
	case o.Listen != "" && len(o.EngineAllow) == 0 && o.Discover == nil:
		return configerr.New("EngineAllow", "bind mode (%v) needs engine allow rules (%v POD=CIDR) or discovery (%v): without either, whoever reaches the listen socket writes, or wipes, any pod's entries. "+
			"To try it on one machine: %v '*=127.0.0.0/8'. In a cluster, discovery ties each pod's name to its IP; pods named by their IP address may speak only for themselves",
			f("Listen"), f("EngineAllow"), f("Discover"), f("EngineAllow"))
	}
	return nil
}

// maxEngines is MaxEngines, or, at 0, what the memory budget allows
// (memlimit.MaxEngines).
func (o *Options) maxEngines() int {
	if o.MaxEngines > 0 {
		return o.MaxEngines
	}
	return memlimit.MaxEngines(o.Index.MemoryBudget, zmqtransport.DefaultMaxEngines)
}

// hasLocalTokenizer: the settings name a local tokenizer (or only its
// chat template, which LoadLocalTokenizer refuses).
func (o *Options) hasLocalTokenizer() bool { return o.TokenizerFile != "" || o.ChatTemplateFile != "" }

// shares is how the memory budget is split between the index, the event
// queues, the engines' state and the tokenizers' caches (memlimit.Split).
func (o *Options) shares() memlimit.Shares {
	s, _ := memlimit.Split(o.Index.MemoryBudget, o.streams(), o.TokenizeURL != "" || o.hasLocalTokenizer())
	return s
}

// splitErr says that the memory budget cannot hold the streams' state and
// queues beside the index (memlimit.Split).
func (o *Options) splitErr() error {
	_, err := memlimit.Split(o.Index.MemoryBudget, o.streams(), o.TokenizeURL != "" || o.hasLocalTokenizer())
	return err
}

// limits are Limits with, unless set, the request bodies in flight the
// memory budget allows (server.BodyBytesInFlight).
func (o *Options) limits() server.Limits {
	l := o.Limits
	if l.MaxBodyBytesInFlight <= 0 {
		l.MaxBodyBytesInFlight = server.BodyBytesInFlight(o.MaxQueryTokens, o.Index.MemoryBudget)
	}
	return l
}

// streams is the most event streams the settings may open: every
// connect-mode engine rank and, in bind mode, up to MaxEngines.
func (o *Options) streams() int {
	n := expectedStreams(o.Engines)
	if o.Listen != "" {
		n += o.maxEngines()
	}
	return n
}

// expectedStreams counts the listed engines' ranks.
func expectedStreams(engines []zmqtransport.EngineConfig) int {
	n := 0
	for _, e := range engines {
		n += max(e.Ranks, 1)
	}
	return n
}
