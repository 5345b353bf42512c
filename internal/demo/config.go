package demo

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/internal/trace"
)

// Config holds the settings of a demo run that a person chooses: each
// field is one flag of "kvindex demo". Defaults gives their default
// values, RegisterFlags their flags and help, and Validate their limits,
// all from one table (settings), so the three cannot drift apart.
//
// Every value is taken as given: zero is a value, not "unset". The few
// fields where zero selects an automatic value say so.
type Config struct {
	Scenario string // one of Scenarios
	Pods     int    // initial engines (churn adds one mid-run)
	Sessions int    // conversations active at once
	Turns    int    // turns per conversation
	Requests int    // total requests; 0: 4 x Sessions x Turns
	// Capacity is each engine's KV cache in blocks; 0 sizes the fleet to
	// CapacityFactor times the working set.
	Capacity       int
	CapacityFactor float64
	// Load is the offered load: the arrival rate as a fraction of what the
	// fleet could serve if every request hit the cache on all but its new
	// tokens.
	Load float64
	Seed uint64
	// Delay is how long, in simulated time, an event takes to reach the
	// precise router's index; 0: instantly.
	Delay   time.Duration
	Weights Weights
	// HashPrefix is the number of leading prompt tokens consistent-hash
	// hashes; 0: the shared prefix plus 256.
	HashPrefix int
	VNodes     int // virtual nodes per pod on the hash ring
	// ApproxBlocks limits the approximate router to the first ApproxBlocks
	// blocks of each prompt; 0: the whole prompt.
	ApproxBlocks int
	Cost         CostModel

	// Trace, if set, is a trace file (package trace: Mooncake's format or
	// kvindex's) replayed instead of the generated workload.
	Trace string
	// TraceBlock is the number of tokens each of the trace's block ids
	// stands for.
	TraceBlock int
	// TraceRequests and TraceWindow take the trace's first requests: at
	// most TraceRequests (0: no limit), arriving within TraceWindow of the
	// first (0: no limit).
	TraceRequests int
	TraceWindow   time.Duration
	// TimeScale multiplies the trace's timestamps: 0.5 replays it twice
	// as fast.
	TimeScale float64
	// Tokenizer is the tokenizer.json a kvindex trace's text prompts are
	// tokenized with.
	Tokenizer string
}

// Defaults returns the default settings: the run README.md and "make
// demo" show.
func Defaults() Config {
	return Config{
		Scenario:       ScenarioAgents,
		Pods:           8,
		Sessions:       16,
		Turns:          16,
		CapacityFactor: 1.5,
		Load:           0.6,
		Seed:           1,
		Delay:          DefaultDelay,
		Weights:        DefaultWeights,
		VNodes:         100,
		Cost:           DefaultCost(),
		TraceBlock:     trace.MooncakeBlockTokens,
		TimeScale:      1,
	}
}

// DefaultDelay is the default simulated event propagation delay.
const DefaultDelay = 20 * time.Millisecond

// engineBlockSize is the simulated engines' block size in tokens.
const engineBlockSize = blockhash.DefaultBlockSize

// maxRequests and maxCapacity bound a run's size, whether given or
// computed: a simulated engine allocates its whole block pool up front.
const (
	maxRequests = 1_000_000
	maxCapacity = 1 << 22 // blocks per engine: 67M tokens, far beyond any GPU
)

// RegisterFlags defines one flag per field of c on fs, each bound to its
// field and defaulting to its current value: register on Defaults() to
// get the documented defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	for _, s := range c.settings() {
		fs.Var(s.value, s.flag, s.usage)
	}
}

// Validate checks every field against its limits. The error is a
// *configerr.Error naming the setting by its flag's name (RegisterFlags)
// and the value given, as in "capacity-factor must be > 0 (got 0)"; the
// kvindex command writes the name as its flag.
func (c *Config) Validate() error {
	for _, s := range c.settings() {
		if err := s.check(); err != nil {
			f := configerr.Field(s.flag)
			return configerr.New(f, "%v %w", f, err)
		}
	}
	if c.Weights == (Weights{}) {
		return configerr.New("prefix-weight", "%v and %v must not both be 0", configerr.Field("prefix-weight"), configerr.Field("load-weight"))
	}
	if c.Trace != "" && c.Scenario != ScenarioAgents {
		return configerr.New("scenario", "%v %s and %v: a trace replaces the generated workload", configerr.Field("scenario"), c.Scenario, configerr.Field("trace"))
	}
	if c.Trace == "" && c.Tokenizer != "" {
		return configerr.New("tokenizer", "%v tokenizes the text prompts of a %v, and none is given", configerr.Field("tokenizer"), configerr.Field("trace"))
	}
	if c.Trace != "" {
		return nil // --requests and its default do not apply
	}
	if c.Requests == 0 && c.requests() > maxRequests {
		return configerr.New("requests", "%v 0 means 4 x %v x %v = %d, over the limit of %d",
			configerr.Field("requests"), configerr.Field("sessions"), configerr.Field("turns"), c.requests(), maxRequests)
	}
	return nil
}

// requests is the number of requests the run plans.
func (c *Config) requests() int {
	if c.Requests > 0 {
		return c.Requests
	}
	return 4 * c.Sessions * c.Turns
}

// setting is one field of Config: its flag, help and check.
type setting struct {
	flag  string
	usage string
	value flag.Value   // bound to the field
	check func() error // the field's limits; the error omits the flag name
}

func (c *Config) settings() []setting {
	return []setting{
		{"scenario", "workload: " + strings.Join(Scenarios, "|"),
			(*stringFlag)(&c.Scenario), oneOf(&c.Scenario, Scenarios)},
		{"pods", "engines in the fleet (churn adds one mid-run)",
			numFlag[int]{&c.Pods}, inRange(&c.Pods, 1, 256)},
		{"sessions", "conversations active at once",
			numFlag[int]{&c.Sessions}, inRange(&c.Sessions, 1, 10_000)},
		{"turns", "requests per conversation before it ends (forks: half)",
			numFlag[int]{&c.Turns}, inRange(&c.Turns, 1, 100_000)},
		{"requests", "total requests (0: 4 x sessions x turns)",
			numFlag[int]{&c.Requests}, inRange(&c.Requests, 0, maxRequests)},
		{"capacity", "KV-cache blocks (16 tokens) per engine (0: --capacity-factor x the working set over the fleet)",
			numFlag[int]{&c.Capacity}, inRange(&c.Capacity, 0, maxCapacity)},
		{"capacity-factor", "fleet capacity as a multiple of the active working set, when --capacity is 0",
			numFlag[float64]{&c.CapacityFactor}, above(&c.CapacityFactor, 0, 100)},
		{"load", "arrival rate as a fraction of the fleet's throughput with ideal caching",
			numFlag[float64]{&c.Load}, above(&c.Load, 0, 100)},
		{"seed", "seed of the workload (same seed, same results)",
			numFlag[uint64]{&c.Seed}, func() error { return atLeast(c.Seed, 1) }},
		{"prefix-weight", "scoring routers: weight of the matched prefix fraction (picker.Weights)",
			numFlag[float64]{&c.Weights.Prefix}, from(&c.Weights.Prefix, 0, 1000)},
		{"load-weight", "scoring routers: weight of the load score, 1 - depth (picker.Weights)",
			numFlag[float64]{&c.Weights.Load}, from(&c.Weights.Load, 0, 1000)},
		{"approx-blocks", "approximate: leading blocks of a prompt it tracks (0: all; the Gateway API Inference Extension's default is 256)",
			numFlag[int]{&c.ApproxBlocks}, intAtLeast(&c.ApproxBlocks, 0)},
		{"hash-prefix", "consistent-hash: leading prompt tokens hashed (0: the shared prefix + 256; with --trace, one --trace-block)",
			numFlag[int]{&c.HashPrefix}, intAtLeast(&c.HashPrefix, 0)},
		{"vnodes", "consistent-hash: virtual nodes per pod on the ring",
			numFlag[int]{&c.VNodes}, inRange(&c.VNodes, 1, 10_000)},
		{"delay-ms", "simulated time for an engine's event to reach kvindex's index (0: instant)",
			durationFlag{&c.Delay, time.Millisecond}, durationFrom(&c.Delay, time.Millisecond, false)},
		{"prefill-us", "prefill cost per uncached prompt token, µs (100 = 10k tokens/s: a 32B model on one H100)",
			durationFlag{&c.Cost.PrefillPerToken, time.Microsecond}, durationFrom(&c.Cost.PrefillPerToken, time.Microsecond, true)},
		{"decode-ms", "decode cost per output token, ms (amortized over a batch)",
			durationFlag{&c.Cost.DecodePerToken, time.Millisecond}, durationFrom(&c.Cost.DecodePerToken, time.Millisecond, false)},
		{"overhead-ms", "fixed cost per request, ms",
			durationFlag{&c.Cost.Overhead, time.Millisecond}, durationFrom(&c.Cost.Overhead, time.Millisecond, false)},
		{"trace", "replay this trace (JSONL: Mooncake's format or kvindex's, detected) instead of the generated workload",
			(*stringFlag)(&c.Trace), func() error { return nil }},
		{"trace-block", "tokens each block id of the trace stands for (Mooncake: 512); a multiple of the engines' 16",
			numFlag[int]{&c.TraceBlock}, multipleOf(&c.TraceBlock, engineBlockSize, 1<<20)},
		{"trace-requests", "replay the trace's first N requests (0: all)",
			numFlag[int]{&c.TraceRequests}, inRange(&c.TraceRequests, 0, maxRequests)},
		{"trace-window", "replay the trace's requests arriving within this duration of its first, e.g. 10m (0: all)",
			durationTextFlag{&c.TraceWindow}, func() error {
				if c.TraceWindow < 0 {
					return fmt.Errorf("must be >= 0 (got %v)", c.TraceWindow)
				}
				return nil
			}},
		{"time-scale", "multiplies the trace's timestamps: 0.5 replays it twice as fast",
			numFlag[float64]{&c.TimeScale}, above(&c.TimeScale, 0, 1000)},
		{"tokenizer", "tokenizer.json (or .json.gz) for a kvindex trace's text prompts",
			(*stringFlag)(&c.Tokenizer), func() error { return nil }},
	}
}

// The checks. Each returns the end of a sentence that starts with the
// flag's name.

func oneOf(p *string, allowed []string) func() error {
	return func() error {
		if !slices.Contains(allowed, *p) {
			return fmt.Errorf("must be one of %s (unknown scenario %q)", strings.Join(allowed, "|"), *p)
		}
		return nil
	}
}

func inRange(p *int, lo, hi int) func() error {
	return func() error {
		if *p < lo || *p > hi {
			return fmt.Errorf("must be in %d..%d (got %d)", lo, hi, *p)
		}
		return nil
	}
}

func multipleOf(p *int, unit, hi int) func() error {
	return func() error {
		if *p < unit || *p > hi || *p%unit != 0 {
			return fmt.Errorf("must be a multiple of %d in %d..%d (got %d)", unit, unit, hi, *p)
		}
		return nil
	}
}

func intAtLeast(p *int, lo int) func() error {
	return func() error {
		if *p < lo {
			return fmt.Errorf("must be >= %d (got %d)", lo, *p)
		}
		return nil
	}
}

func atLeast(v, lo uint64) error {
	if v < lo {
		return fmt.Errorf("must be >= %d (got %d)", lo, v)
	}
	return nil
}

// above accepts lo < x <= hi.
func above(p *float64, lo, hi float64) func() error {
	return func() error {
		switch {
		case !(*p > lo): // NaN too
			return fmt.Errorf("must be > %v (got %v)", lo, *p)
		case *p > hi:
			return fmt.Errorf("must be at most %v (got %v)", hi, *p)
		}
		return nil
	}
}

// from accepts lo <= x <= hi.
func from(p *float64, lo, hi float64) func() error {
	return func() error {
		switch {
		case !(*p >= lo): // NaN too
			return fmt.Errorf("must be >= %v (got %v)", lo, *p)
		case *p > hi:
			return fmt.Errorf("must be at most %v (got %v)", hi, *p)
		}
		return nil
	}
}

// durationFrom accepts positive durations, and zero unless positive is
// set; the error shows the value in the flag's unit.
func durationFrom(p *time.Duration, unit time.Duration, positive bool) func() error {
	return func() error {
		got := durationFlag{p, unit}.String()
		switch {
		case positive && *p <= 0:
			return fmt.Errorf("must be > 0 (got %s)", got)
		case *p < 0:
			return fmt.Errorf("must be >= 0 (got %s)", got)
		}
		return nil
	}
}

// Flag values. Each also has the Type method of spf13/pflag's Value, so a
// pflag.FlagSet that adopts these flags names their types in its help.

type stringFlag string

func (f *stringFlag) String() string     { return string(*f) }
func (f *stringFlag) Set(s string) error { *f = stringFlag(s); return nil }
func (*stringFlag) Type() string         { return "string" }

type numFlag[T int | uint64 | float64] struct{ p *T }

func (f numFlag[T]) String() string {
	if f.p == nil {
		return "0"
	}
	switch v := any(*f.p).(type) {
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	default:
		return fmt.Sprint(v)
	}
}

func (f numFlag[T]) Set(s string) error {
	switch p := any(f.p).(type) {
	case *int:
		v, err := strconv.ParseInt(s, 0, strconv.IntSize)
		if err != nil {
			return numError(err)
		}
		*p = int(v)
	case *uint64:
		v, err := strconv.ParseUint(s, 0, 64)
		if err != nil {
			return numError(err)
		}
		*p = v
	case *float64:
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return numError(err)
		}
		*p = v
	}
	return nil
}

func (f numFlag[T]) Type() string {
	switch any(f.p).(type) {
	case *int:
		return "int"
	case *uint64:
		return "uint64"
	}
	return "float64"
}

// durationFlag reads and shows a duration as a number of units.
type durationFlag struct {
	p    *time.Duration
	unit time.Duration
}

func (f durationFlag) String() string {
	if f.p == nil {
		return "0"
	}
	return strconv.FormatFloat(float64(*f.p)/float64(f.unit), 'g', -1, 64)
}

func (f durationFlag) Set(s string) error {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return numError(err)
	}
	d := math.Round(v * float64(f.unit))
	if math.IsNaN(d) || math.Abs(d) > math.MaxInt64/2 {
		return errors.New("out of range")
	}
	*f.p = time.Duration(d)
	return nil
}

func (durationFlag) Type() string { return "float64" }

// durationTextFlag reads and shows a duration as Go writes one: 90s, 10m
// (0 for none).
type durationTextFlag struct{ p *time.Duration }

func (f durationTextFlag) String() string {
	if f.p == nil || *f.p == 0 {
		return "0" // as pflag writes an unset default: not at all
	}
	return f.p.String()
}

func (f durationTextFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("not a duration (e.g. 90s, 10m)")
	}
	*f.p = d
	return nil
}

func (durationTextFlag) Type() string { return "duration" }

// numError drops strconv's function name and input, which the flag
// package already reports.
func numError(err error) error {
	if ne, ok := errors.AsType[*strconv.NumError](err); ok {
		return ne.Err
	}
	return err
}
