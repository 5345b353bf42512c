package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/kvindex/kvindex/internal/demo"
)

// Report is the outcome of one run per route over the same input. Its
// JSON form is kvindex loadgen --json's output.
type Report struct {
	Input    string `json:"input"` // "agents" or the trace file
	Requests int    `json:"requests"`
	// PromptTokens sums the input's prompt lengths (before the marker).
	PromptTokens int64 `json:"prompt_tokens"`
	// Ceiling is the cached fraction one unlimited cache would serve of
	// the whole input; each result's is over the requests it sent.
	Ceiling float64         `json:"ceiling_cached_fraction"`
	Trace   *demo.TraceInfo `json:"trace,omitempty"` // the trace's description
	API     string          `json:"api"`
	Results []*Result       `json:"routes"`
}

// Compare runs in once per route, one after the other, and reports them
// side by side. onStart, if set, is called before each run.
func Compare(ctx context.Context, in *Input, routes []Route, o Options, onStart func(Route)) (*Report, error) {
	if err := o.Check(in); err != nil {
		return nil, err
	}
	rep := &Report{Input: in.Name, Requests: len(in.Requests), PromptTokens: in.PromptTokens(len(in.Requests)),
		Ceiling: round(in.Ceiling(len(in.Requests)), 4), Trace: in.Trace, API: o.API}
	for _, rt := range routes {
		if ctx.Err() != nil {
			break
		}
		if onStart != nil {
			onStart(rt)
		}
		res, err := Run(ctx, in, rt, o)
		if err != nil {
			return nil, err
		}
		rep.Results = append(rep.Results, res)
	}
	return rep, ctx.Err()
}

// WriteJSON writes the report as indented JSON.
func WriteJSON(w io.Writer, rep *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// WriteTable writes the report as a table, a route a row, and what its
// cached fraction means.
func WriteTable(w io.Writer, rep *Report) error {
	fmt.Fprintf(w, "input: %s, %d requests, %d prompt tokens, --api %s\n", rep.Input, rep.Requests, rep.PromptTokens, rep.API)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "route\trequests\terrors\tTTFT p50\tp90\tp99\treq/s\tprompt tok/s\tcached\tceiling\tof ceiling\t")
	for _, r := range rep.Results {
		of := "-"
		if r.Ceiling > 0 {
			of = pct(r.CachedFraction / r.Ceiling)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%.1f\t%s\t%s\t%s\t%s\t\n", r.Route, r.Requests, r.Errors,
			ms(r.TTFT.P50), ms(r.TTFT.P90), ms(r.TTFT.P99), r.RequestsPerSecond,
			strconv.FormatFloat(r.PromptTokensPerSecond, 'f', 0, 64), pct(r.CachedFraction), pct(r.Ceiling), of)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "cached: the engines' own prompt_tokens_details.cached_tokens over their prompt_tokens; ceiling: what one unlimited cache would serve of the requests sent")
	for _, r := range rep.Results {
		if r.FirstError != "" {
			fmt.Fprintf(w, "%s: first error: %s\n", r.Route, r.FirstError)
		}
	}
	return nil
}

func pct(f float64) string { return strconv.FormatFloat(100*f, 'f', 1, 64) + "%" }

func ms(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) + "ms" }
