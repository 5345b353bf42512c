package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/kvindex/kvindex/internal/demo"
	"github.com/spf13/cobra"
)

func newDemoCmd() *cobra.Command {
	var (
		cfg     = demo.Defaults()
		jsonOut bool
		outDir  string
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Compare routers on a simulated agent fleet: the fleet-wide cached-prefix fraction and the latency it buys",
		Long:  demoHelp(),
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.Validate(); err != nil {
				return usagef("%v", err)
			}
			if outDir != "" {
				// Before the simulation, not after it.
				if err := checkWritableDir(outDir); err != nil {
					return err
				}
			}
			stderr := cmd.ErrOrStderr()
			bar := newProgressBar(stderr, !jsonOut && isTerminal(stderr))
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			start := time.Now()
			rep, err := demo.Run(ctx, demo.Options{Config: cfg, Progress: bar.update})
			bar.finish()
			if errors.Is(err, demo.ErrBadSettings) {
				return usageError{msg: err.Error()}
			}
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if outDir != "" {
				if err := writeCharts(outDir, rep); err != nil {
					return err
				}
			}
			if jsonOut {
				return demo.WriteJSON(out, rep)
			}
			if err := demo.WriteTable(out, rep); err != nil {
				return err
			}
			fmt.Fprintf(out, "(%d router runs in %.1fs)\n", len(rep.Routers)+len(rep.Extra), time.Since(start).Seconds())
			if outDir != "" {
				fmt.Fprintf(out, "wrote %s and %s\n", filepath.Join(outDir, "demo.svg"), filepath.Join(outDir, "demo.html"))
			}
			return nil
		},
	}
	// The run's settings, their defaults, help and limits come from
	// demo.Config; only the output flags are the command's own.
	settings := flag.NewFlagSet("demo", flag.ContinueOnError)
	cfg.RegisterFlags(settings)
	fs := cmd.Flags()
	fs.AddGoFlagSet(settings)
	fs.BoolVar(&jsonOut, "json", false, "print the results as JSON (no progress bar)")
	fs.StringVar(&outDir, "out", "", "directory to write demo.svg and demo.html to")
	return cmd
}

// demoHelp is the long help of "kvindex demo". The router list comes from
// demo.RoutersHelp and the defaults from demo.Defaults.
func demoHelp() string {
	return fmt.Sprintf(`kvindex demo replays one generated agent workload against six routers, each
with its own fresh fleet of simulated vLLM engines, and reports for each the
number that tells the truth: the fleet-wide cached-prefix fraction (of the
prompt tokens every request carried, how many its engine served from cache
after routing), the prefill work left, and the time to first token it buys.
No GPU and no external server is needed; the same --seed gives the same
numbers.

Routers:
%s
Workload (agents): --sessions conversations are active at once. Each shares a
2,048-token system prompt and tool schema, then carries 10-15k tokens of its
own history, growing per turn by the previous answer (50-250 tokens) and the
next message (50-350 tokens). Activity is Zipf-skewed (a few hot
conversations, a long tail). After --turns turns a conversation ends and a new
one takes its place; 30%% of new ones are sub-agents forked from an active
conversation (its whole context plus their own instructions). Arrivals are
Poisson at --load times the rate the fleet could serve if every request hit
the cache on all but its new tokens; a conversation has at most one request in
flight. Token ids come from PRNG streams seeded by --seed, in a 151k
vocabulary; every router replays exactly the same requests.
Scenarios: agents; churn (the same, plus one engine restarting with an empty
cache at 40%% of the run and a new engine joining at 60%%); hot-prefix (70%% of
the requests are one 8,192-token prompt with a short unique suffix, the rest
agent turns; it also runs precise with load weight 0, reported as the extra
row "precise(load=0)"); gateways (agents routed by 3 gateway replicas, request
i to replica i mod 3: each keeps its own router state, so approximate guesses
from a third of the traffic, while all see the pods' load and precise's
replicas share one kvindex); sessions (agents, plus the extra row
"session-affinity" after consistent-hash).

Capacity is realistic: a 32B model on one 80 GB GPU holds ~40k tokens of KV
cache. By default the fleet holds --capacity-factor (%v) copies of the active
working set (shared prefix + every active conversation), so a conversation
duplicated on every pod does not fit. The arithmetic is printed first.

Time model (simulated): an engine is a single server taking one request at a
time from a FIFO queue (real engines batch; the model keeps what routing
changes: work saved by cache hits, work piled on one engine). Service time =
--overhead-ms + --prefill-us per uncached prompt token + --decode-ms per
output token; TTFT = queueing + overhead + prefill. The engine's cache changes
at admission (the prompt) and at completion (prompt + answer, which the next
turn resends).

The precise router takes the real event path. A batch published at simulated
time t becomes visible to it at t + --delay-ms: a delay line between the
subscriber and the index holds what arrives, and before each decision the run
waits (real time) until the subscriber has delivered every batch due, so
wall-clock ZMQ latency is absorbed and results depend only on the flags.

--json prints {"scenario","pods","routers":[{"name","fleet_cached_fraction",
"prefill_tokens","ttft_p50_ms","ttft_p90_ms","imbalance","engine_hit_rate"}],
...}: the six standard routers in the order above; a scenario's extra row goes
to "extra_routers". --out DIR writes demo.svg (charts) and demo.html (a
self-contained report). A progress bar goes to stderr when it is a terminal
(not with --json).`, demo.RoutersHelp(), demo.Defaults().CapacityFactor)
}

func writeCharts(dir string, rep *demo.Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, write := range map[string]func(io.Writer, *demo.Report) error{"demo.svg": demo.WriteSVG, "demo.html": demo.WriteHTML} {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		err = write(f, rep)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("writing %s: %w", name, err)
		}
	}
	return nil
}

// checkWritableDir creates dir if needed and checks that a file can be
// written in it.
func checkWritableDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("--out %s: cannot create the directory: %w", dir, pathCause(err))
	}
	f, err := os.CreateTemp(dir, ".kvindex-demo-*")
	if err != nil {
		return fmt.Errorf("--out %s: cannot write there: %w", dir, pathCause(err))
	}
	f.Close()
	return os.Remove(f.Name())
}

// pathCause drops the operation and path of a *fs.PathError, which the
// message names already.
func pathCause(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progressBar draws "[=====>    ] 45%" on one terminal line.
type progressBar struct {
	w    io.Writer
	on   bool
	mu   sync.Mutex
	last int // last percentage drawn
}

func newProgressBar(w io.Writer, on bool) *progressBar { return &progressBar{w: w, on: on, last: -1} }

func (p *progressBar) update(done, total int) {
	if !p.on || total <= 0 {
		return
	}
	pc := done * 100 / total
	p.mu.Lock()
	defer p.mu.Unlock()
	if pc == p.last {
		return
	}
	p.last = pc
	const width = 40
	fill := pc * width / 100
	bar := strings.Repeat("=", fill)
	if fill < width {
		bar += ">" + strings.Repeat(" ", width-fill-1)
	}
	fmt.Fprintf(p.w, "\r[%s] %3d%% simulating routers", bar, pc)
}

func (p *progressBar) finish() {
	if !p.on || p.last < 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprint(p.w, "\r"+strings.Repeat(" ", 70)+"\r")
}
