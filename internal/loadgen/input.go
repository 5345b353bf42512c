package loadgen

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/internal/demo"
)

// InputOptions say what to send: a trace, or the built-in agent workload.
type InputOptions struct {
	// Trace, if set, is a trace file (package trace's formats) sent
	// instead of the built-in workload.
	Trace string
	// TraceBlock is the number of tokens a trace's block id stands for
	// (0: Mooncake's).
	TraceBlock int
	// Tokenizer is the tokenizer.json a trace's text prompts are
	// tokenized with, for the ceiling; the text itself is sent.
	Tokenizer string
	// TimeScale multiplies a trace's timestamps: 0.5 sends it twice as
	// fast.
	TimeScale float64

	// The built-in workload: Sessions conversations at a time, Turns
	// each, Poisson arrivals at Rate requests per second, drawn from Seed.
	Sessions int
	Turns    int
	Rate     float64
	Seed     uint64

	// Requests sends at most that many (0: the whole trace, or for the
	// built-in workload Sessions x Turns).
	Requests int
}

// DefaultInput returns the defaults of kvindex loadgen's input flags.
func DefaultInput() InputOptions {
	return InputOptions{Sessions: 8, Turns: 8, Rate: 4, Seed: 1, TimeScale: 1}
}

// The built-in workload's sizes: conversations sharing a system prompt
// and tool schemas, each starting from a context of its own and resending
// it, grown by a message and an answer, every turn. They are the demo's
// agent workload scaled down to fit a simulated engine's default cache a
// few conversations at a time.
const (
	agentShared          = 1024
	agentHistoryMin      = 512
	agentHistoryMax      = 2048
	agentMessageMin      = 32
	agentMessageMax      = 256
	agentOutputMin       = 16
	agentOutputMax       = 128
	maxGeneratedRequests = 100_000
	maxTimeScale         = 1e6
)

// Input is what a run sends: the requests in arrival order, each with
// the conversation turn it waits for.
type Input struct {
	Name     string // "agents" or the trace file
	Requests []demo.Request
	// Text is whether the prompts are text (a kvindex trace's "text").
	Text bool
	// Trace describes the trace; nil for the built-in workload.
	Trace *demo.TraceInfo
	w     *demo.Workload
}

// Ceiling is the cached fraction one unlimited cache would reach on the
// first n requests: what no routing can beat.
func (in *Input) Ceiling(n int) float64 {
	w := *in.w
	w.Requests = w.Requests[:min(n, len(w.Requests))]
	return demo.Ceiling(&w)
}

// PromptTokens sums the prompt lengths of the first n requests.
func (in *Input) PromptTokens(n int) int64 {
	var t int64
	for i := range in.Requests[:min(n, len(in.Requests))] {
		t += int64(in.Requests[i].PromptLen())
	}
	return t
}

// The flags that shape the built-in workload, and those that shape how a
// trace is read: each set applies without the other.
var (
	generatedFlags = []string{"sessions", "turns", "rate", "seed"}
	traceFlags     = []string{"trace-block", "tokenizer", "time-scale"}
)

// CheckGiven refuses, rather than ignores, the flags given (as given
// reports) that the input does not use: the built-in workload's with
// --trace, the trace's without it.
func (o *InputOptions) CheckGiven(given func(flag string) bool) error {
	unused, why := traceFlags, "applies to --trace only"
	if o.Trace != "" {
		unused, why = generatedFlags, "shapes the built-in workload, which --trace replaces (its timestamps, times --time-scale, set the arrivals)"
	}
	for _, f := range unused {
		if given(f) {
			return fmt.Errorf("--%s %s", f, why)
		}
	}
	return nil
}

// Load reads or generates the input o describes.
func Load(o InputOptions) (*Input, error) {
	if o.Requests < 0 {
		return nil, fmt.Errorf("--requests %d: want 0 (all) or more", o.Requests)
	}
	if o.Trace != "" {
		return loadTrace(o)
	}
	switch {
	case o.Sessions < 1:
		return nil, fmt.Errorf("--sessions %d: want at least 1", o.Sessions)
	case o.Turns < 1:
		return nil, fmt.Errorf("--turns %d: want at least 1", o.Turns)
	case !(o.Rate > 0) || o.Rate > 1e6:
		return nil, fmt.Errorf("--rate %v: want requests per second, above 0", o.Rate)
	}
	c := demo.DefaultWorkload(demo.ScenarioAgents)
	c.Seed, c.Conversations, c.Turns, c.Rate = o.Seed, o.Sessions, o.Turns, o.Rate
	c.Requests = o.Requests
	if c.Requests == 0 {
		c.Requests = o.Sessions * o.Turns
	}
	if c.Requests > maxGeneratedRequests {
		return nil, fmt.Errorf("--requests %d: at most %d for the built-in workload", c.Requests, maxGeneratedRequests)
	}
	c.SharedTokens = agentShared
	c.HistoryMin, c.HistoryMax = agentHistoryMin, agentHistoryMax
	c.MessageMin, c.MessageMax = agentMessageMin, agentMessageMax
	c.OutputMin, c.OutputMax = agentOutputMin, agentOutputMax
	c.ForkProb = 0 // every conversation makes Turns requests
	h, err := demo.Hasher()
	if err != nil {
		return nil, err
	}
	// No service time is planned: a turn waits, live, for the answer
	// to the one before.
	w, err := demo.Plan(c, h, func(int, int) time.Duration { return 0 })
	if err != nil {
		return nil, err
	}
	return &Input{Name: demo.ScenarioAgents, Requests: w.Requests, w: w}, nil
}

func loadTrace(o InputOptions) (*Input, error) {
	c := demo.Defaults()
	c.Trace, c.Tokenizer, c.TimeScale, c.TraceRequests = o.Trace, o.Tokenizer, o.TimeScale, o.Requests
	if o.TraceBlock != 0 {
		c.TraceBlock = o.TraceBlock
	}
	w, info, err := demo.LoadTrace(c, true)
	if err != nil {
		return nil, flagError(err)
	}
	in := &Input{Name: o.Trace, Requests: w.Requests, Trace: info, w: w}
	for i := range w.Requests {
		if w.Requests[i].Text() != "" {
			in.Text = true
		} else if in.Text {
			return nil, errors.New("--trace mixes text prompts with token or block ids: a run sends one kind")
		}
	}
	return in, nil
}

// flagError writes a demo configuration error (its settings are named as
// kvindex demo's flags) with kvindex loadgen's flags.
func flagError(err error) error {
	ce, ok := configerr.As(err)
	if !ok {
		return err
	}
	return errors.New(ce.Render(func(f configerr.Field) string {
		if f == "trace-requests" {
			return "--requests"
		}
		return "--" + string(f)
	}))
}
