package sim

import (
	"strings"
	"time"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/enginesim/simhttp"
)

// Options are a sim's settings. Every field is used as given, zero
// included (a zero Port is a port out of range, not a default):
// DefaultOptions has kvindex sim's defaults.
type Options struct {
	// Engines is the number of simulated engines. In connect mode they
	// are named pod-0, pod-1, ...; in bind mode engine i runs on the
	// loopback host 127.0.0.<i+1> and is named by it.
	Engines int
	// Ranks is the number of data-parallel ranks per engine.
	Ranks int
	// Capacity is the KV-cache blocks of each engine rank.
	Capacity int
	// Model is the model the engines serve.
	Model string
	// Hasher is the engines' block hashing.
	Hasher *blockhash.Hasher

	// Port, in connect mode, is the first event port: engine i rank r
	// binds 127.0.0.1 at Port + i*Ranks + r. It is unused in bind mode.
	Port int
	// Connect selects bind mode: the engines connect to the kvindex
	// listening there (tcp://HOST:PORT, the scheme may be left out), on
	// topics kv@<pod>@<model>. "": connect mode.
	Connect string
	// ReplayPort is the first replay port, laid out as the event ports
	// (in bind mode each engine host's rank r at ReplayPort + r). 0: the
	// port after the last event port, or in bind mode after Connect's.
	ReplayPort int
	// NoReplay runs the engines without replay sockets.
	NoReplay bool

	// Rate is the workload's requests per second over all engines
	// (Poisson arrivals); 0 sends none, leaving the engines to their HTTP
	// clients.
	Rate float64
	// Seed draws the workload: the same seed sends the same requests.
	Seed uint64
	// Sessions is the number of conversations active at once.
	Sessions int
	// Turns is the number of requests of a conversation, after which a
	// new one takes its place.
	Turns int
	// Requests stops the workload after that many requests, the engines
	// staying up; 0: no end.
	Requests int
	// Tokenizer, if set, is the tokenizer.json (or .json.gz) the prompts
	// are written as text through; otherwise they are token ids.
	Tokenizer string
	// LogPrompts, if set, is the file Run writes every prompt to (emptied
	// first), one per line: its text, or its token ids comma-separated.
	LogPrompts string

	// HTTPPort, if not 0, serves each engine over vLLM's HTTP API: in
	// connect mode engine i on 127.0.0.1 at HTTPPort + i, in bind mode on
	// its own host at HTTPPort.
	HTTPPort int
	// MaxRunning is the number of HTTP requests a rank runs at once
	// (vLLM's max_num_seqs); later ones wait.
	MaxRunning int
	// PrefillPerToken is an HTTP request's prefill time per prompt token
	// not served from the cache.
	PrefillPerToken time.Duration

	// Observe, if set, is told what the sim does: Started, then Request,
	// HTTPRequest and Finished events. It is called one event at a time,
	// from the workload's and the HTTP fronts' goroutines, never after
	// Run has returned.
	Observe func(Event)
}

// DefaultOptions returns kvindex sim's defaults: two engines in connect
// mode from port 5557, vLLM's default hashing, two requests a second.
func DefaultOptions() Options {
	h, err := blockhash.New(blockhash.Config{Algo: blockhash.SHA256Pickle, Seed: blockhash.DefaultSeed, BlockSize: blockhash.DefaultBlockSize})
	if err != nil {
		panic(err) // vLLM's default hashing is always valid
	}
	return Options{
		Engines: 2, Ranks: 1, Capacity: 4096, Model: "Qwen/Qwen2.5-7B-Instruct", Hasher: h,
		Port: 5557, Rate: 2, Seed: 1, Sessions: 8, Turns: 8,
		MaxRunning: simhttp.DefaultMaxRunning, PrefillPerToken: simhttp.DefaultPrefillPerToken,
	}
}

// Limits of the options.
const (
	maxEngines  = 256
	maxRanks    = kvevents.MaxDPRank
	maxBlocks   = 1 << 24 // over all engine ranks: about 1 GiB of block pools
	maxRate     = 10_000
	maxSessions = 4096
	maxHosts    = 254 // bind mode: 127.0.0.1 to 127.0.0.254
	maxRunning  = 1 << 16
	maxPrefill  = time.Second // per token
)

// The settings as configuration errors name them: Options' fields.
const (
	fieldEngines         configerr.Field = "Engines"
	fieldRanks           configerr.Field = "Ranks"
	fieldCapacity        configerr.Field = "Capacity"
	fieldModel           configerr.Field = "Model"
	fieldHasher          configerr.Field = "Hasher"
	fieldPort            configerr.Field = "Port"
	fieldConnect         configerr.Field = "Connect"
	fieldReplayPort      configerr.Field = "ReplayPort"
	fieldNoReplay        configerr.Field = "NoReplay"
	fieldRate            configerr.Field = "Rate"
	fieldSessions        configerr.Field = "Sessions"
	fieldTurns           configerr.Field = "Turns"
	fieldRequests        configerr.Field = "Requests"
	fieldTokenizer       configerr.Field = "Tokenizer"
	fieldLogPrompts      configerr.Field = "LogPrompts"
	fieldHTTPPort        configerr.Field = "HTTPPort"
	fieldMaxRunning      configerr.Field = "MaxRunning"
	fieldPrefillPerToken configerr.Field = "PrefillPerToken"
)

// ServeListen stands, in messages, for kvindex serve's listen endpoint,
// which the engines connect to in bind mode. It is not a setting of the
// sim's: the command names it as kvindex serve's flag.
const ServeListen configerr.Field = "ServeListen"

// check returns the first setting that cannot work, leaving out the
// engines' layout (NewPlan checks it).
func (o *Options) check() error {
	switch {
	case o.Hasher == nil:
		return configerr.New(fieldHasher, "%v: none given", fieldHasher)
	case o.Engines < 1 || o.Engines > maxEngines:
		return configerr.New(fieldEngines, "%v %d: want 1..%d", fieldEngines, o.Engines, maxEngines)
	case o.Ranks < 1 || o.Ranks > maxRanks:
		return configerr.New(fieldRanks, "%v %d: want 1..%d", fieldRanks, o.Ranks, maxRanks)
	case o.Capacity < 1 || o.Capacity > maxBlocks:
		return configerr.New(fieldCapacity, "%v %d: want 1..%d blocks", fieldCapacity, o.Capacity, maxBlocks)
	case o.Engines*o.Ranks*o.Capacity > maxBlocks:
		return configerr.New(fieldCapacity, "%v %d x %v %d x %v %d = %d blocks: at most %d in all",
			fieldEngines, o.Engines, fieldRanks, o.Ranks, fieldCapacity, o.Capacity, o.Engines*o.Ranks*o.Capacity, maxBlocks)
	case o.Rate == 0 && o.HTTPPort == 0:
		return configerr.New(fieldRate, "%v 0 sends no workload, which leaves nothing to do without %v", fieldRate, fieldHTTPPort)
	case o.Rate == 0 && o.Requests > 0:
		return configerr.New(fieldRequests, "%v %d and %v 0 contradict each other: %v 0 sends no workload", fieldRequests, o.Requests, fieldRate, fieldRate)
	case !(o.Rate >= 0) || o.Rate > maxRate:
		return configerr.New(fieldRate, "%v %v: want a number of requests per second, at most %d (0: no workload, with %v)", fieldRate, o.Rate, maxRate, fieldHTTPPort)
	case o.MaxRunning < 1 || o.MaxRunning > maxRunning:
		return configerr.New(fieldMaxRunning, "%v %d: want 1..%d", fieldMaxRunning, o.MaxRunning, maxRunning)
	case o.PrefillPerToken < 0 || o.PrefillPerToken > maxPrefill:
		return configerr.New(fieldPrefillPerToken, "%v %v: want 0 to %v", fieldPrefillPerToken, o.PrefillPerToken, maxPrefill)
	case o.Sessions < 1 || o.Sessions > maxSessions:
		return configerr.New(fieldSessions, "%v %d: want 1..%d", fieldSessions, o.Sessions, maxSessions)
	case o.Turns < 1:
		return configerr.New(fieldTurns, "%v %d: want at least 1", fieldTurns, o.Turns)
	case o.Requests < 0:
		return configerr.New(fieldRequests, "%v %d: want 0 (until Ctrl-C) or more", fieldRequests, o.Requests)
	case o.Model == "" || strings.ContainsAny(o.Model, " \t\n"):
		return configerr.New(fieldModel, "%v %q: want a model name without spaces", fieldModel, o.Model)
	case o.NoReplay && o.ReplayPort != 0:
		return configerr.New(fieldReplayPort, "%v and %v contradict each other: give one", fieldReplayPort, fieldNoReplay)
	}
	return nil
}
