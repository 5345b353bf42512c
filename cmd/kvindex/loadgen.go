package main

import (
	"fmt"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/internal/loadgen"
)

// loadgenFlags are kvindex loadgen's settings.
type loadgenFlags struct {
	in        loadgen.InputOptions
	o         loadgen.Options
	routes    []string
	endpoints []string
	compare   bool
	jsonOut   bool
}

func (f *loadgenFlags) register(fs *pflag.FlagSet) {
	di, do := loadgen.DefaultInput(), loadgen.DefaultOptions()
	fs.StringVar(&f.in.Trace, "trace", "", "send this trace (Mooncake or kvindex JSONL, as kvindex demo --trace reads it) instead of the built-in agent workload")
	fs.IntVar(&f.in.TraceBlock, "trace-block", 0, "tokens each of the trace's block ids stands for (default: Mooncake's 512)")
	fs.StringVar(&f.in.Tokenizer, "tokenizer", "", "tokenizer.json a kvindex trace's text prompts are tokenized with, for the ceiling (the text itself is sent)")
	fs.Float64Var(&f.in.TimeScale, "time-scale", di.TimeScale, "multiply the trace's timestamps: 0.5 sends it twice as fast")
	fs.IntVar(&f.in.Sessions, "sessions", di.Sessions, "built-in workload: conversations active at once")
	fs.IntVar(&f.in.Turns, "turns", di.Turns, "built-in workload: requests per conversation")
	fs.Float64Var(&f.in.Rate, "rate", di.Rate, "built-in workload: requests per second (Poisson arrivals); a turn also waits for the previous answer")
	fs.Uint64Var(&f.in.Seed, "seed", di.Seed, "built-in workload: the same seed sends the same prompts")
	fs.IntVar(&f.in.Requests, "requests", 0, "send at most this many requests (default: the whole trace, or sessions x turns)")
	fs.DurationVar(&f.o.Duration, "duration", 0, "stop sending after this long, letting the requests in flight finish (0: send everything)")
	fs.IntVar(&f.o.Concurrency, "concurrency", do.Concurrency, "requests in flight at most")
	fs.StringVar(&f.o.API, "api", do.API, "OpenAI API to send to: completions (token ids or text) or chat (text, as one user message)")
	fs.StringVar(&f.o.Model, "model", do.Model, "model the engines serve")
	fs.StringArrayVar(&f.routes, "route", nil, "how to send: round-robin (over --endpoint), pick=URL (ask the kvindex picker at URL, then send to its choice) or gateway=URL (send to a gateway); repeat with --compare")
	fs.StringArrayVar(&f.endpoints, "endpoint", nil, "an engine round-robin sends to, POD=HOST:PORT; repeat for each")
	fs.BoolVar(&f.compare, "compare", false, "run the same input once per route (the --route flags and the arguments), one after the other, and print them side by side")
	fs.BoolVar(&f.jsonOut, "json", false, "print the results as JSON")
}

// parseRoutes returns the routes of the flags and, with --compare, the
// arguments.
func (f *loadgenFlags) parseRoutes(args []string) ([]loadgen.Route, error) {
	var eps []loadgen.Endpoint
	for _, s := range f.endpoints {
		e, err := loadgen.ParseEndpoint(s)
		if err != nil {
			return nil, usagef("--endpoint: %v", err)
		}
		eps = append(eps, e)
	}
	specs := append(append([]string(nil), f.routes...), args...)
	switch {
	case len(args) > 0 && !f.compare:
		return nil, usagef("kvindex loadgen takes routes as arguments with --compare only, got %q", args[0])
	case len(specs) == 0:
		return nil, usagef("no route: give --route round-robin, --route pick=URL or --route gateway=URL")
	case len(specs) > 1 && !f.compare:
		return nil, usagef("%d routes: give --compare to run each", len(specs))
	}
	var routes []loadgen.Route
	for _, s := range specs {
		r, err := loadgen.ParseRoute(s, eps)
		if err != nil {
			return nil, usagef("%v", err)
		}
		routes = append(routes, r)
	}
	return routes, nil
}

func newLoadgenCmd() *cobra.Command {
	var f loadgenFlags
	cmd := &cobra.Command{
		Use:   "loadgen [--compare ROUTE...]",
		Short: "Send a trace or an agent workload to a live fleet and measure the engines' own cached fraction",
		Long: `loadgen sends a trace (--trace) or the built-in agent workload to live engines
over the OpenAI HTTP API (vLLM, or kvindex sim --http-port), streaming, by
a route: round-robin over --endpoint engines (the cache-blind baseline),
pick=URL (ask a kvindex picker's /v1/pick, then send to the endpoint it
chose) or gateway=URL (send to a gateway that routes, such as
deploy/nginx). A conversation's turn waits for the previous answer.

Every second it prints its progress on stderr; at the end a table of
requests, errors, time to first token, throughput, and the fleet's cached
fraction: the sum of the engines' usage.prompt_tokens_details.cached_tokens
over their prompt tokens, beside the input's ceiling (what one unlimited
cache would serve). Each run marks its prompts with a prefix of its own,
so that it starts from cold caches. --compare runs the input once per
route.`,
		Example: `  kvindex loadgen --route pick=127.0.0.1:8081
  kvindex loadgen --compare round-robin pick=127.0.0.1:8081 --endpoint pod-0=127.0.0.1:8000 --endpoint pod-1=127.0.0.1:8001
  kvindex loadgen --trace trace.jsonl --time-scale 0.5 --route gateway=http://127.0.0.1:8080`,
		RunE: func(cmd *cobra.Command, args []string) error {
			routes, err := f.parseRoutes(args)
			if err != nil {
				return err
			}
			if err := f.in.CheckGiven(cmd.Flags().Changed); err != nil {
				return usagef("%v", err)
			}
			in, err := loadgen.Load(f.in)
			if err != nil {
				return usagef("%v", err)
			}
			if err := f.o.Check(in); err != nil {
				return usagef("%v", err)
			}
			stderr := cmd.ErrOrStderr()
			f.o.Progress = func(p loadgen.Progress) { fmt.Fprintln(stderr, p) }
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			rep, err := loadgen.Compare(ctx, in, routes, f.o, func(r loadgen.Route) { fmt.Fprintf(stderr, "sending %d requests by %s\n", len(in.Requests), r) })
			if rep == nil {
				return err
			}
			if f.jsonOut {
				return loadgen.WriteJSON(cmd.OutOrStdout(), rep)
			}
			return loadgen.WriteTable(cmd.OutOrStdout(), rep)
		},
	}
	f.register(cmd.Flags())
	return cmd
}
