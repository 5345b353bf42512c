package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/demo"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/enginesim/simhttp"
	"github.com/kvindex/kvindex/kvevents/enginesim/simzmq"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
	"github.com/kvindex/kvindex/tokenizer"
)

// simFlags are kvindex sim's settings.
type simFlags struct {
	engines    int
	model      string
	hash       hashFlags
	capacity   int
	ranks      int
	port       int
	replayPort int
	noReplay   bool
	connect    string
	rate       float64
	seed       uint64
	sessions   int
	turns      int
	requests   int
	tokenizer  string
	logPrompts string
	httpPort   int
	maxSeqs    int
	prefill    time.Duration
}

// Limits of kvindex sim's settings.
const (
	simMaxEngines  = 256
	simMaxBlocks   = 1 << 24 // over all engine ranks: about 1 GiB of block pools
	simMaxRate     = 10_000
	simMaxSessions = 4096
	simMaxHosts    = 254 // bind mode: 127.0.0.1 to 127.0.0.254
	simMaxSeqs     = 1 << 16
)

func (f *simFlags) register(fs *pflag.FlagSet) {
	fs.IntVar(&f.engines, "engines", 2, "number of simulated engines, named pod-0, pod-1, ... (with --connect: by their hosts 127.0.0.1, 127.0.0.2, ...)")
	fs.StringVar(&f.model, "model", "Qwen/Qwen2.5-7B-Instruct", "model the engines serve")
	f.hash.register(fs)
	fs.IntVar(&f.capacity, "capacity", 4096, "KV-cache blocks per engine (and per data-parallel rank)")
	fs.IntVar(&f.ranks, "ranks", 1, "data-parallel ranks per engine; rank r publishes on the engine's port + r, as vLLM does")
	fs.IntVar(&f.port, "port", 5557, "connect mode: the first engine's event port (PUB, bound on 127.0.0.1); engine i rank r uses port + i*ranks + r")
	fs.IntVar(&f.replayPort, "replay-port", 0, "first replay port, laid out as the event ports (default: the port after the last event port; with --connect, the port after its port)")
	fs.BoolVar(&f.noReplay, "no-replay", false, "engines without a replay socket (kvindex then cannot recover lost batches)")
	fs.StringVar(&f.connect, "connect", "", "bind mode: the engines connect to a kvindex listening here (kvindex serve --listen), e.g. tcp://127.0.0.1:5557, with topics kv@<pod>@<model>; engine i runs on 127.0.0.<i+1> and is named by it")
	fs.Float64Var(&f.rate, "rate", 2, "requests per second, over all engines (Poisson arrivals)")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the workload: the same seed sends the same prompts")
	fs.IntVar(&f.sessions, "sessions", 8, "conversations active at once")
	fs.IntVar(&f.turns, "turns", 8, "requests per conversation before a new one takes its place")
	fs.IntVar(&f.requests, "requests", 0, "stop sending after this many requests and keep the engines up (0: until Ctrl-C)")
	fs.StringVar(&f.tokenizer, "tokenizer", "", "tokenizer.json (or .json.gz) the prompts are written as text through (default: none, random token ids)")
	fs.StringVar(&f.logPrompts, "log-prompts", "", "write every prompt sent to this file (emptied first), one per line: its text, or its token ids comma-separated")
	fs.IntVar(&f.httpPort, "http-port", 0, "serve each engine over vLLM's HTTP API (OpenAI completions and chat, /tokenize, /metrics): engine i on 127.0.0.1 at this port + i (with --connect: on its host 127.0.0.<i+1> at this port); 0: none")
	fs.IntVar(&f.maxSeqs, "max-num-seqs", simhttp.DefaultMaxRunning, "HTTP requests each engine rank runs at once (vLLM's --max-num-seqs); later ones wait")
	fs.DurationVar(&f.prefill, "prefill-per-token", simhttp.DefaultPrefillPerToken, "prefill time of an HTTP request per prompt token not served from the cache (0: none)")
}

// simEngine is one simulated engine rank and where it publishes.
type simEngine struct {
	pod  string
	rank int
	*simzmq.Engine
}

// name prints the engine as the CLI does everywhere: pod, or pod/rank.
func (e *simEngine) name() string { return client.EngineName(e.pod, uint32(e.rank)) }

// simRun is a running kvindex sim.
type simRun struct {
	engines []*simEngine
	fronts  []*simhttp.Server // per engine, with --http-port
	// step is held while a request is made and logged: holding it pauses
	// the workload between two requests.
	step sync.Mutex
	sent int // requests made, under step
}

// simStarted, when set (by tests), is called with the run once its
// engines are up and before the first request.
var simStarted func(*simRun)

// simPlan is a validated kvindex sim configuration: the engines' names
// and the endpoints each rank binds or connects to.
type simPlan struct {
	f       *simFlags
	hasher  *blockhash.Hasher
	bind    bool   // connect mode: the engines bind (false: --connect)
	connect string // bind mode: kvindex's listen endpoint
	replay  bool
	pods    []string
	// pub and replay endpoints per engine, then per rank.
	pubs, replays [][]string
	// https are the engines' HTTP addresses (host:port), with --http-port.
	https []string
}

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
by pod IP, so that kvindex finds rank r's replay socket at
--replay-template tcp://{pod}:PORT plus r.

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
			p, err := f.plan(cmd.Flags())
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return p.run(ctx, cmd.OutOrStdout())
		},
	}
	f.register(cmd.Flags())
	return cmd
}

// plan validates the flags and lays out the engines' endpoints.
func (f *simFlags) plan(fs *pflag.FlagSet) (*simPlan, error) {
	h, err := f.hash.hasher()
	if err != nil {
		return nil, err
	}
	switch {
	case f.engines < 1 || f.engines > simMaxEngines:
		return nil, usagef("--engines %d: want 1..%d", f.engines, simMaxEngines)
	case f.ranks < 1 || f.ranks > kvevents.MaxDPRank:
		return nil, usagef("--ranks %d: want 1..%d", f.ranks, kvevents.MaxDPRank)
	case f.capacity < 1 || f.capacity > simMaxBlocks:
		return nil, usagef("--capacity %d: want 1..%d blocks", f.capacity, simMaxBlocks)
	case f.engines*f.ranks*f.capacity > simMaxBlocks:
		return nil, usagef("--engines %d x --ranks %d x --capacity %d = %d blocks: at most %d in all", f.engines, f.ranks, f.capacity, f.engines*f.ranks*f.capacity, simMaxBlocks)
	case f.rate == 0 && f.httpPort == 0:
		return nil, usagef("--rate 0 sends no workload, which leaves nothing to do without --http-port")
	case f.rate == 0 && f.requests > 0:
		return nil, usagef("--requests %d and --rate 0 contradict each other: --rate 0 sends no workload", f.requests)
	case !(f.rate >= 0) || f.rate > simMaxRate:
		return nil, usagef("--rate %v: want a number of requests per second, at most %d (0: no workload, with --http-port)", f.rate, simMaxRate)
	case f.httpPort == 0 && (fs.Changed("max-num-seqs") || fs.Changed("prefill-per-token")):
		return nil, usagef("--max-num-seqs and --prefill-per-token shape the HTTP fronts: give --http-port too")
	case f.maxSeqs < 1 || f.maxSeqs > simMaxSeqs:
		return nil, usagef("--max-num-seqs %d: want 1..%d", f.maxSeqs, simMaxSeqs)
	case f.prefill < 0 || f.prefill > time.Second:
		return nil, usagef("--prefill-per-token %v: want 0 to 1s", f.prefill)
	case f.sessions < 1 || f.sessions > simMaxSessions:
		return nil, usagef("--sessions %d: want 1..%d", f.sessions, simMaxSessions)
	case f.turns < 1:
		return nil, usagef("--turns %d: want at least 1", f.turns)
	case f.requests < 0:
		return nil, usagef("--requests %d: want 0 (until Ctrl-C) or more", f.requests)
	case f.model == "" || strings.ContainsAny(f.model, " \t\n"):
		return nil, usagef("--model %q: want a model name without spaces", f.model)
	case f.noReplay && fs.Changed("replay-port"):
		return nil, usagef("--replay-port and --no-replay contradict each other: give one")
	}
	p := &simPlan{f: f, hasher: h, bind: f.connect == "", replay: !f.noReplay}
	// Connect mode: engine i rank r binds port + i*ranks + r on 127.0.0.1.
	// Bind mode: engine i is the host 127.0.0.<i+1> (Linux answers on all
	// of 127/8), named by it as llm-d names engines by pod IP, so that
	// kvindex finds its replay socket with --replay-template
	// tcp://{pod}:PORT; rank r replays on PORT + r.
	perHost := f.engines * f.ranks
	if !p.bind {
		perHost = f.ranks
		if fs.Changed("port") {
			return nil, usagef("--port %d applies to connect mode, where the engines bind; with --connect they connect to kvindex's --listen endpoint", f.port)
		}
		if f.engines > simMaxHosts {
			return nil, usagef("--engines %d: bind mode runs engine i on 127.0.0.<i+1>, so at most %d", f.engines, simMaxHosts)
		}
		if p.connect, err = simConnectEndpoint(f.connect); err != nil {
			return nil, err
		}
	} else if err := checkPortRange("--port", f.port, perHost); err != nil {
		return nil, err
	}
	if p.replay {
		if !fs.Changed("replay-port") {
			f.replayPort = f.port + perHost
			if !p.bind {
				// The port after kvindex's listen port.
				_, port, _ := net.SplitHostPort(strings.TrimPrefix(p.connect, "tcp://"))
				listen, _ := strconv.Atoi(port)
				f.replayPort = listen + 1
			}
		}
		if err := checkPortRange("--replay-port", f.replayPort, perHost); err != nil {
			return nil, err
		}
		if p.bind && f.replayPort < f.port+perHost && f.port < f.replayPort+perHost {
			return nil, usagef("--port %d and --replay-port %d overlap: %d engine ranks use event ports %s and replay ports %s; vLLM adds the rank to both, so the two ranges must be apart (e.g. --replay-port %d)",
				f.port, f.replayPort, perHost, portRange(f.port, perHost), portRange(f.replayPort, perHost), f.port+perHost)
		}
	}
	if err := p.planHTTP(perHost); err != nil {
		return nil, err
	}
	for i := range f.engines {
		pod, host, base := "pod-"+strconv.Itoa(i), "127.0.0.1", i*f.ranks
		if !p.bind {
			pod, host, base = "127.0.0."+strconv.Itoa(i+1), "127.0.0."+strconv.Itoa(i+1), 0
		}
		var pubs, replays []string
		for r := range f.ranks {
			if p.bind {
				pubs = append(pubs, "tcp://"+host+":"+strconv.Itoa(f.port+base+r))
			} else {
				pubs = append(pubs, p.connect)
			}
			if p.replay {
				replays = append(replays, "tcp://"+host+":"+strconv.Itoa(f.replayPort+base+r))
			}
		}
		p.pods = append(p.pods, pod)
		p.pubs, p.replays = append(p.pubs, pubs), append(p.replays, replays)
		if f.httpPort != 0 {
			port := f.httpPort
			if p.bind {
				port += i
			}
			p.https = append(p.https, net.JoinHostPort(host, strconv.Itoa(port)))
		}
	}
	return p, nil
}

// planHTTP checks --http-port: in connect mode the engines' HTTP ports
// follow one another on 127.0.0.1, apart from the event and replay ports;
// in bind mode each engine has its own host and they share the port.
func (p *simPlan) planHTTP(perHost int) error {
	f := p.f
	if f.httpPort == 0 {
		return nil
	}
	n := 1
	if p.bind {
		n = f.engines
	}
	if err := checkPortRange("--http-port", f.httpPort, n); err != nil {
		return err
	}
	if !p.bind {
		return nil
	}
	for _, r := range []struct {
		flag  string
		first int
		used  bool
	}{{"--port", f.port, true}, {"--replay-port", f.replayPort, p.replay}} {
		if r.used && f.httpPort < r.first+perHost && r.first < f.httpPort+n {
			return usagef("--http-port %d overlaps %s %d: %d engines serve HTTP on ports %s, %d engine ranks use ports %s",
				f.httpPort, r.flag, r.first, n, portRange(f.httpPort, n), perHost, portRange(r.first, perHost))
		}
	}
	return nil
}

// checkPortRange checks that n ports from first exist.
func checkPortRange(flag string, first, n int) error {
	if first < 1 || first+n-1 > 65535 {
		return usagef("%s %d: %d engine ranks need ports %s, beyond 1..65535", flag, first, n, portRange(first, n))
	}
	return nil
}

func portRange(first, n int) string {
	if n == 1 {
		return strconv.Itoa(first)
	}
	return strconv.Itoa(first) + "-" + strconv.Itoa(first+n-1)
}

// simConnectEndpoint checks a --connect endpoint: tcp://HOST:PORT (the
// scheme may be left out).
func simConnectEndpoint(s string) (string, error) {
	ep := zmqtransport.TCPEndpoint(s)
	rest, ok := strings.CutPrefix(ep, "tcp://")
	host, port, err := net.SplitHostPort(rest)
	n, perr := strconv.Atoi(port)
	if !ok || err != nil || host == "" || host == "*" || perr != nil || n < 1 || n > 65535 {
		return "", usagef("--connect %q: want tcp://HOST:PORT, where a kvindex serve --listen binds (e.g. tcp://127.0.0.1:5557)", s)
	}
	return ep, nil
}

// serveArgs is the kvindex serve command line that follows the planned
// engines.
func (p *simPlan) serveArgs() []string {
	f := p.f
	hc := p.hasher.Config()
	args := []string{"kvindex", "serve", "--model", f.model,
		"--hash-algo", string(hc.Algo), "--hash-seed", hc.Seed, "--block-size", strconv.Itoa(hc.BlockSize)}
	if f.tokenizer != "" {
		args = append(args, "--tokenizer", f.tokenizer)
	}
	if p.bind {
		for i := range f.engines {
			e := p.pods[i] + "=" + p.pubs[i][0]
			if p.replay {
				e += ",replay=" + p.replays[i][0]
			}
			if f.ranks > 1 {
				e += ",ranks=" + strconv.Itoa(f.ranks)
			}
			args = append(args, "--engine", e)
		}
		return args
	}
	args = append(args, "--listen", listenEndpoint(p.connect))
	if p.replay {
		args = append(args, "--replay-template", "tcp://{pod}:"+strconv.Itoa(f.replayPort))
	}
	return args
}

// listenEndpoint is where kvindex binds for engines connecting to ep: the
// same address on a loopback host, every interface otherwise.
func listenEndpoint(ep string) string {
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
	if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() {
		return ep
	}
	return "tcp://*:" + port
}

// formatIDs writes token ids as --tokens takes them: comma-separated.
func formatIDs(ids []uint64) string {
	b := make([]byte, 0, len(ids)*7)
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, id, 10)
	}
	return string(b)
}

// shellSafe matches words a POSIX shell reads as themselves.
var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_@%+=:,./-]+$`)

// shellLine joins args into a line a shell reads back as args.
func shellLine(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if shellSafe.MatchString(a) {
			out[i] = a
		} else {
			out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(out, " ")
}

// run starts the engines, prints how to follow them and sends the
// workload until ctx is done.
func (p *simPlan) run(ctx context.Context, w io.Writer) (err error) {
	f := p.f
	var tok *tokenizer.Local
	if f.tokenizer != "" {
		if tok, err = tokenizer.LoadFile(f.tokenizer); err != nil {
			return usagef("--tokenizer %s: %s", f.tokenizer, strings.TrimPrefix(err.Error(), "tokenizer: "))
		}
	}
	var logw io.Writer // nil: prompts are not logged
	if f.logPrompts != "" {
		lf, err := os.Create(f.logPrompts)
		if err != nil {
			return fmt.Errorf("--log-prompts %s: %w", f.logPrompts, pathCause(err))
		}
		logw = lf
		defer func() {
			if cerr := lf.Close(); err == nil && cerr != nil {
				err = fmt.Errorf("--log-prompts %s: %w", f.logPrompts, cerr)
			}
		}()
	}
	// The HTTP fronts print their requests' lines beside the workload's.
	w = &lockedWriter{w: w}
	r := &simRun{}
	defer func() {
		for _, s := range r.fronts {
			s.Close()
		}
		for _, e := range r.engines {
			e.Close()
		}
	}()
	for i := range f.engines {
		for rank := range f.ranks {
			pcfg := zmqtransport.PublisherConfig{Endpoint: p.pubs[i][rank], Connect: !p.bind}
			if !p.bind {
				pcfg.Topic = "kv@" + p.pods[i] + "@" + f.model
			}
			if p.replay {
				pcfg.ReplayEndpoint = p.replays[i][rank]
			}
			e, err := simzmq.New(enginesim.Config{
				Pod: p.pods[i], Model: f.model, DPRank: rank, Hasher: p.hasher, CapacityBlocks: f.capacity,
			}, pcfg)
			if err != nil {
				return fmt.Errorf("%s: %s (another program holds the port? choose others with --port and --replay-port)",
					client.EngineName(p.pods[i], uint32(rank)), strings.TrimPrefix(err.Error(), "zmqtransport: "))
			}
			r.engines = append(r.engines, &simEngine{pod: p.pods[i], rank: rank, Engine: e})
		}
	}
	if err := p.startHTTP(r, tok, w); err != nil {
		return err
	}
	p.printStart(w, r)
	if simStarted != nil {
		simStarted(r)
	}

	if f.rate == 0 {
		<-ctx.Done()
		fmt.Fprintf(w, "stopped after %d requests\n", r.sent)
		return nil
	}
	wl := newSimWorkload(f.seed, tok != nil, f.sessions, f.turns, len(r.engines), demo.DefaultWorkload(demo.ScenarioAgents).Vocab)
	arrivals := rand.New(rand.NewPCG(f.seed, 0xa771))
	timer := time.NewTimer(0)
	defer timer.Stop()
	for f.requests == 0 || r.sent < f.requests {
		select {
		case <-ctx.Done():
			fmt.Fprintf(w, "stopped after %d requests\n", r.sent)
			return nil
		case <-timer.C:
		}
		if err := r.request(ctx, w, wl.next(), tok, f.model, logw); err != nil {
			if ctx.Err() != nil { // stopped (Ctrl-C) mid-request: not a failure
				fmt.Fprintf(w, "stopped after %d requests\n", r.sent)
				return nil
			}
			return err
		}
		timer.Reset(time.Duration(arrivals.ExpFloat64() / f.rate * float64(time.Second)))
	}
	fmt.Fprintf(w, "sent %d requests; the engines stay up (kvindex can still replay and query them) until Ctrl-C\n", r.sent)
	<-ctx.Done()
	fmt.Fprintf(w, "stopped after %d requests\n", r.sent)
	return nil
}

// startHTTP starts each engine's HTTP front (--http-port), whose requests
// print lines as the workload's do.
func (p *simPlan) startHTTP(r *simRun, tok *tokenizer.Local, w io.Writer) error {
	f := p.f
	for i, addr := range p.https {
		ranks := r.engines[i*f.ranks : (i+1)*f.ranks]
		cfg := simhttp.Config{
			Model: f.model, MaxRunning: f.maxSeqs, PrefillPerToken: f.prefill,
			Observe: func(q simhttp.Request) { printHTTP(w, ranks, q) },
		}
		if tok != nil {
			cfg.Tokenizer = tok
		}
		for _, e := range ranks {
			cfg.Ranks = append(cfg.Ranks, e.Engine.Engine)
		}
		s, err := simhttp.New(cfg)
		if err == nil {
			err = s.Start(addr)
		}
		if err != nil {
			return fmt.Errorf("%s: HTTP: %s (another program holds the port? choose another --http-port)", p.pods[i], strings.TrimPrefix(err.Error(), "simhttp: "))
		}
		r.fronts = append(r.fronts, s)
	}
	return nil
}

// printHTTP prints an HTTP request's line: for inference, its engine, its
// prompt's tokens and how many were cached, as the workload's lines say;
// for a refused request, why. Tokenizations that succeed print nothing
// (kvindex serve --tokenize-url sends one per query).
func printHTTP(w io.Writer, ranks []*simEngine, q simhttp.Request) {
	now := time.Now().Format("15:04:05.000")
	switch {
	case q.Status != 200:
		fmt.Fprintf(w, "%s http %s -> %s: %d %s\n", now, q.Path, ranks[0].pod, q.Status, q.Err)
	case q.Rank >= 0:
		fmt.Fprintf(w, "%s http %s -> %s: %d tokens, %d cached (%.1f%%)\n",
			now, q.Path, ranks[q.Rank].name(), q.PromptTokens, q.CachedTokens, math.Round(1000*float64(q.CachedTokens)/float64(q.PromptTokens))/10)
	}
}

// lockedWriter serializes writes: the workload and the HTTP fronts print
// concurrently.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// request makes one request on its engine, logs its prompt and prints its
// line.
func (r *simRun) request(ctx context.Context, w io.Writer, req simRequest, tok *tokenizer.Local, model string, logw io.Writer) error {
	r.step.Lock()
	defer r.step.Unlock()
	ids := req.prompt.ids
	if tok != nil {
		var err error
		if ids, err = tok.Tokenize(ctx, model, tokenizer.Input{Prompt: req.prompt.text}); err != nil {
			return fmt.Errorf("tokenizing request %d: %w", r.sent, err)
		}
	}
	e := r.engines[req.target]
	cached, err := e.Process(ids, nil)
	if err != nil {
		return fmt.Errorf("%s: %w", e.name(), err)
	}
	if logw != nil {
		line := req.prompt.text
		if tok == nil {
			line = formatIDs(ids)
		}
		if _, err := io.WriteString(logw, line+"\n"); err != nil {
			return fmt.Errorf("--log-prompts: %w", err)
		}
	}
	pct := 0.0
	if len(ids) > 0 {
		pct = 100 * float64(cached) / float64(len(ids))
	}
	fmt.Fprintf(w, "%s req %d conv %d turn %d -> %s: %d tokens, %d cached (%.1f%%)\n",
		time.Now().Format("15:04:05.000"), r.sent, req.conv, req.turn+1, e.name(), len(ids), cached, math.Round(pct*10)/10)
	r.sent++
	return nil
}

// printStart says what runs where, and the kvindex serve line that follows
// it.
func (p *simPlan) printStart(w io.Writer, r *simRun) {
	f := p.f
	hc := p.hasher.Config()
	ranks := ""
	if f.ranks > 1 {
		ranks = fmt.Sprintf(" x %d data-parallel ranks", f.ranks)
	}
	fmt.Fprintf(w, "kvindex sim: %d simulated vLLM engines%s of %s (%d blocks of %d tokens each, hash %s seed %q)\n",
		f.engines, ranks, f.model, f.capacity, hc.BlockSize, hc.Algo, hc.Seed)
	for _, e := range r.engines {
		how := "publishes on " + e.PubEndpoint()
		if !p.bind {
			how = "connects to " + e.PubEndpoint() + " (topic kv@" + e.pod + "@" + f.model + ")"
		}
		fmt.Fprintf(w, "  %s %s, replay %s\n", e.name(), how, cmp.Or(e.ReplayEndpoint(), "none"))
	}
	if len(r.fronts) > 0 {
		fmt.Fprintf(w, "vLLM's HTTP API (POST /v1/completions, /v1/chat/completions, /tokenize; GET /metrics, /v1/models, /health), %d requests at once per rank, prefill %v per uncached token:\n", f.maxSeqs, f.prefill)
		for i, s := range r.fronts {
			fmt.Fprintf(w, "  %s http://%s\n", p.pods[i], s.Addr())
		}
	}
	prompts := "random token ids"
	if f.tokenizer != "" {
		prompts = "text through " + f.tokenizer
	}
	limit := "until Ctrl-C"
	if f.requests > 0 {
		limit = strconv.Itoa(f.requests) + " requests"
	}
	if f.rate == 0 {
		fmt.Fprintf(w, "workload: none (--rate 0); prompts over HTTP are %s\n", map[bool]string{true: "text or token ids", false: "token ids"}[f.tokenizer != ""])
	} else {
		fmt.Fprintf(w, "workload: %d conversations at a time sharing a system prompt, %d turns each, %v requests/s, %s; prompts are %s; seed %d\n",
			f.sessions, f.turns, f.rate, limit, prompts, f.seed)
	}
	if f.logPrompts != "" {
		q := `kvindex query --prompt "$(tail -n 1 ` + shellLine([]string{f.logPrompts}) + `)"`
		if f.tokenizer == "" {
			q = "tail -n 1 " + shellLine([]string{f.logPrompts}) + " | kvindex query --tokens-file -"
		}
		fmt.Fprintf(w, "prompts go to %s, one per line; ask about the last one with:\n  %s\n", f.logPrompts, q)
	}
	fmt.Fprintf(w, "follow these engines with:\n%s\n", shellLine(p.serveArgs()))
}
