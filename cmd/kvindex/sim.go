package main

import (
	"fmt"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/internal/sim"
)

// simFlags are kvindex sim's settings: sim's options, and the hashing
// they take as a Hasher.
type simFlags struct {
	o    sim.Options
	hash hashFlags
}

// simFlagNames are the flags of sim's settings, as its errors name them.
var simFlagNames = map[configerr.Field]string{
	"Engines": "--engines", "Ranks": "--ranks", "Capacity": "--capacity", "Model": "--model",
	"Port": "--port", "Connect": "--connect", "ReplayPort": "--replay-port", "NoReplay": "--no-replay",
	"Rate": "--rate", "Seed": "--seed", "Sessions": "--sessions", "Turns": "--turns", "Requests": "--requests",
	"Tokenizer": "--tokenizer", "LogPrompts": "--log-prompts",
	"HTTPPort": "--http-port", "MaxRunning": "--max-num-seqs", "PrefillPerToken": "--prefill-per-token",
	sim.ServeListen: "--listen", // kvindex serve's
}

func (f *simFlags) register(fs *pflag.FlagSet) {
	d := sim.DefaultOptions()
	fs.IntVar(&f.o.Engines, "engines", d.Engines, "number of simulated engines, named pod-0, pod-1, ... (with --connect: by their hosts 127.0.0.1, 127.0.0.2, ...)")
	fs.StringVar(&f.o.Model, "model", d.Model, "model the engines serve")
	f.hash.register(fs)
	fs.IntVar(&f.o.Capacity, "capacity", d.Capacity, "KV-cache blocks per engine (and per data-parallel rank)")
	fs.IntVar(&f.o.Ranks, "ranks", d.Ranks, "data-parallel ranks per engine; rank r publishes on the engine's port + r, as vLLM does")
	fs.IntVar(&f.o.Port, "port", d.Port, "connect mode: the first engine's event port (PUB, bound on 127.0.0.1); engine i rank r uses port + i*ranks + r")
	fs.IntVar(&f.o.ReplayPort, "replay-port", d.ReplayPort, "first replay port, laid out as the event ports (default: the port after the last event port; with --connect, the port after its port)")
	fs.BoolVar(&f.o.NoReplay, "no-replay", d.NoReplay, "engines without a replay socket (kvindex then cannot recover lost batches)")
	fs.StringVar(&f.o.Connect, "connect", d.Connect, "bind mode: the engines connect to a kvindex listening here (kvindex serve --listen), e.g. tcp://127.0.0.1:5557, with topics kv@<pod>@<model>; engine i runs on 127.0.0.<i+1> and is named by it")
	fs.Float64Var(&f.o.Rate, "rate", d.Rate, "requests per second, over all engines (Poisson arrivals)")
	fs.Uint64Var(&f.o.Seed, "seed", d.Seed, "seed of the workload: the same seed sends the same prompts")
	fs.IntVar(&f.o.Sessions, "sessions", d.Sessions, "conversations active at once")
	fs.IntVar(&f.o.Turns, "turns", d.Turns, "requests per conversation before a new one takes its place")
	fs.IntVar(&f.o.Requests, "requests", d.Requests, "stop sending after this many requests and keep the engines up (0: until Ctrl-C)")
	fs.StringVar(&f.o.Tokenizer, "tokenizer", d.Tokenizer, "tokenizer.json (or .json.gz) the prompts are written as text through (default: none, random token ids)")
	fs.StringVar(&f.o.LogPrompts, "log-prompts", d.LogPrompts, "write every prompt sent to this file (emptied first), one per line: its text, or its token ids comma-separated")
	fs.IntVar(&f.o.HTTPPort, "http-port", d.HTTPPort, "serve each engine over vLLM's HTTP API (OpenAI completions and chat, /tokenize, /metrics): engine i on 127.0.0.1 at this port + i (with --connect: on its host 127.0.0.<i+1> at this port); 0: none")
	fs.IntVar(&f.o.MaxRunning, "max-num-seqs", d.MaxRunning, "HTTP requests each engine rank runs at once (vLLM's --max-num-seqs); later ones wait")
	fs.DurationVar(&f.o.PrefillPerToken, "prefill-per-token", d.PrefillPerToken, "prefill time of an HTTP request per prompt token not served from the cache (0: none)")
}

// simStarted, when set (by tests), is called with the sim once its
// engines are up and before the first request.
var simStarted func(*sim.Sim)

func newSimCmd() *cobra.Command {
	var f simFlags
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Run simulated vLLM engines on real ZMQ sockets, fed an agent workload, for a kvindex to follow",
		Long: `sim runs --engines simulated vLLM engines (each with --ranks data-parallel ranks)
on real ZMQ sockets, publishing KV events byte for byte as vLLM does, and
feeds them a seeded agent workload: --sessions conversations sharing one
system prompt, each resending its growing context every turn, at --rate
requests per second. A conversation stays on the engine it started on.

It prints the exact "kvindex serve" command line that follows its engines,
then one line per request: the engine, the prompt's tokens and how many of
them the engine had cached. Ctrl-C stops it.

Connect mode (default): engine pod-i binds its event socket on 127.0.0.1
at --port + i*ranks + r for rank r, and its replay socket at --replay-port
+ i*ranks + r. Bind mode (--connect ENDPOINT): the engines connect to a
kvindex listening there, on topics kv@<pod>@<model>; engine i runs on the
loopback address 127.0.0.<i+1> and is named by it, as llm-d names engines
by pod IP, so that kvindex admits each only from its own address
(--engine-allow '*=127.0.0.0/8') and finds rank r's replay socket at
--replay-template tcp://{addr}:PORT plus r.

With --tokenizer the prompts are text (one line each) tokenized by that
tokenizer.json, so "kvindex query --prompt TEXT" finds them when kvindex
uses the same file; --log-prompts records them. Without it the prompts are
random token ids.

With --http-port each engine also serves vLLM's HTTP API, so that a
gateway, a picker or curl can send it requests: OpenAI /v1/completions
(a text prompt, with --tokenizer, or token ids) and /v1/chat/completions
(messages rendered as ChatML, with --tokenizer), whose usage reports
prompt_tokens_details.cached_tokens from the engine's cache; /tokenize
(for kvindex serve --tokenize-url); /metrics with vLLM's
vllm:num_requests_running, vllm:num_requests_waiting,
vllm:kv_cache_usage_perc, vllm:prefix_cache_queries and
vllm:prefix_cache_hits. Those requests change the cache and publish events
as the workload's do. A rank runs --max-num-seqs of them at once, each for
--prefill-per-token per uncached prompt token; the rest wait. --rate 0
sends no workload, leaving the engines to their HTTP clients.`,
		Example: `  kvindex sim --tokenizer tokenizer/testdata/qwen2.5/tokenizer.json.gz --log-prompts prompts.txt
  kvindex sim --engines 4 --ranks 2 --rate 20 --hash-algo sha256_cbor --hash-seed 0
  kvindex sim --connect tcp://127.0.0.1:5557 --engines 3
  kvindex sim --http-port 8000 --rate 0 --tokenizer tokenizer/testdata/qwen2.5/tokenizer.json.gz`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := f.options(cmd.Flags())
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			var s *sim.Sim // set before Run, the only caller of Observe
			o.Observe = func(ev sim.Event) {
				sim.WriteEvent(w, s.Plan(), ev)
				if _, ok := ev.(sim.Started); ok && simStarted != nil {
					simStarted(s)
				}
			}
			if s, err = sim.New(o); err != nil {
				return configUsage(err, simFlagNames)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if err := s.Run(ctx); err != nil {
				return configUsage(err, simFlagNames)
			}
			fmt.Fprintf(w, "stopped after %d requests\n", s.Sent())
			return nil
		},
	}
	f.register(cmd.Flags())
	return cmd
}

// options returns sim's options from the flags. It refuses the flags
// that apply only beside another one, which sim cannot tell from their
// defaults.
func (f *simFlags) options(fs *pflag.FlagSet) (sim.Options, error) {
	o := f.o
	var err error
	if o.Hasher, err = f.hash.hasher(); err != nil {
		return o, err
	}
	switch {
	case o.HTTPPort == 0 && (fs.Changed("max-num-seqs") || fs.Changed("prefill-per-token")):
		return o, usagef("--max-num-seqs and --prefill-per-token shape the HTTP fronts: give --http-port too")
	case o.Connect != "" && fs.Changed("port"):
		return o, usagef("--port %d applies to connect mode, where the engines bind; with --connect they connect to kvindex's --listen endpoint", o.Port)
	}
	return o, nil
}
