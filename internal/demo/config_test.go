package demo

import (
	"context"
	"flag"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/configerr"
)

// parse registers a Config's flags on a fresh flag set, starting from
// Defaults(), and parses args as a command line would.
func parse(t *testing.T, args ...string) Config {
	t.Helper()
	c := Defaults()
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse %v: %v", args, err)
	}
	return c
}

func TestDefaultsAreValid(t *testing.T) {
	c := Defaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestFlagsDefaultToDefaults checks that each flag's shown default is the
// field's value in Defaults(), and that parsing nothing changes nothing.
func TestFlagsDefaultToDefaults(t *testing.T) {
	c := Defaults()
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	c.RegisterFlags(fs)
	for name, want := range map[string]string{
		"scenario": ScenarioAgents, "pods": "8", "sessions": "16", "turns": "16", "requests": "0",
		"capacity": "0", "capacity-factor": "1.5", "load": "0.6", "seed": "1",
		"prefix-weight": "0.7", "load-weight": "0.3", "approx-blocks": "0", "hash-prefix": "0", "vnodes": "100",
		"delay-ms": "20", "prefill-us": "100", "decode-ms": "2", "overhead-ms": "10",
		"trace": "", "trace-block": "512", "trace-requests": "0", "trace-window": "0", "time-scale": "1", "tokenizer": "",
	} {
		f := fs.Lookup(name)
		if f == nil {
			t.Errorf("no flag --%s", name)
			continue
		}
		if f.DefValue != want {
			t.Errorf("--%s defaults to %q, want %q", name, f.DefValue, want)
		}
		if f.Usage == "" {
			t.Errorf("--%s has no help", name)
		}
	}
	if got := parse(t); !reflect.DeepEqual(got, Defaults()) {
		t.Fatalf("parsing no flags gave %+v, want Defaults() %+v", got, Defaults())
	}
}

// TestEveryFieldHasAFlag sets every flag to a value other than its
// default and checks that every leaf field of Config changed: a field
// added without a flag fails here.
func TestEveryFieldHasAFlag(t *testing.T) {
	got := parse(t,
		"--scenario", ScenarioChurn, "--pods", "3", "--sessions", "5", "--turns", "7", "--requests", "99",
		"--capacity", "4000", "--capacity-factor", "2.5", "--load", "0.4", "--seed", "9",
		"--prefix-weight", "0.5", "--load-weight", "0.2", "--approx-blocks", "256", "--hash-prefix", "512", "--vnodes", "50",
		"--delay-ms", "0.5", "--prefill-us", "50", "--decode-ms", "1.5", "--overhead-ms", "0",
		"--trace", "t.jsonl", "--trace-block", "256", "--trace-requests", "10", "--trace-window", "90s", "--time-scale", "0.5",
		"--tokenizer", "tokenizer.json")
	var walk func(path string, a, b reflect.Value)
	walk = func(path string, a, b reflect.Value) {
		if a.Kind() == reflect.Struct {
			for i := range a.NumField() {
				walk(path+"."+a.Type().Field(i).Name, a.Field(i), b.Field(i))
			}
			return
		}
		if a.Equal(b) {
			t.Errorf("%s kept its default %v: no flag sets it", path, a)
		}
	}
	walk("Config", reflect.ValueOf(got), reflect.ValueOf(Defaults()))
	if got.TraceWindow != 90*time.Second {
		t.Errorf("--trace-window 90s gave %v", got.TraceWindow)
	}
	if got.Delay.String() != "500µs" || got.Cost.PrefillPerToken.String() != "50µs" || got.Cost.DecodePerToken.String() != "1.5ms" {
		t.Errorf("units: delay %v, prefill %v, decode %v", got.Delay, got.Cost.PrefillPerToken, got.Cost.DecodePerToken)
	}
}

// TestValidateNamesTheFlag gives each flag a bad value, on the command
// line, and checks the error names the flag and the value given.
func TestValidateNamesTheFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--scenario", "nope"}, `--scenario must be one of agents|churn|hot-prefix|gateways|sessions (unknown scenario "nope")`},
		{[]string{"--pods", "0"}, "--pods must be in 1..256 (got 0)"},
		{[]string{"--pods", "257"}, "--pods must be in 1..256 (got 257)"},
		{[]string{"--sessions", "0"}, "--sessions must be in 1..10000 (got 0)"},
		{[]string{"--turns", "-1"}, "--turns must be in 1..100000 (got -1)"},
		{[]string{"--requests", "-1"}, "--requests must be in 0..1000000 (got -1)"},
		{[]string{"--sessions", "10000", "--turns", "100"}, "--requests 0 means 4 x --sessions x --turns = 4000000, over the limit of 1000000"},
		{[]string{"--capacity", "-5"}, "--capacity must be in 0..4194304 (got -5)"},
		// Zero is a value the user gave, not "unset": it must not turn
		// into the default 1.5.
		{[]string{"--capacity-factor", "0"}, "--capacity-factor must be > 0 (got 0)"},
		{[]string{"--capacity-factor", "-1"}, "--capacity-factor must be > 0 (got -1)"},
		{[]string{"--capacity-factor", "NaN"}, "--capacity-factor must be > 0 (got NaN)"},
		{[]string{"--capacity-factor", "+Inf"}, "--capacity-factor must be at most 100 (got +Inf)"},
		{[]string{"--load", "0"}, "--load must be > 0 (got 0)"},
		{[]string{"--load", "101"}, "--load must be at most 100 (got 101)"},
		{[]string{"--seed", "0"}, "--seed must be >= 1 (got 0)"},
		{[]string{"--prefix-weight", "-1"}, "--prefix-weight must be >= 0 (got -1)"},
		{[]string{"--load-weight", "NaN"}, "--load-weight must be >= 0 (got NaN)"},
		{[]string{"--prefix-weight", "0", "--load-weight", "0"}, "--prefix-weight and --load-weight must not both be 0"},
		{[]string{"--approx-blocks", "-1"}, "--approx-blocks must be >= 0 (got -1)"},
		{[]string{"--hash-prefix", "-1"}, "--hash-prefix must be >= 0 (got -1)"},
		{[]string{"--vnodes", "0"}, "--vnodes must be in 1..10000 (got 0)"},
		{[]string{"--delay-ms", "-1"}, "--delay-ms must be >= 0 (got -1)"},
		{[]string{"--prefill-us", "0"}, "--prefill-us must be > 0 (got 0)"},
		{[]string{"--decode-ms", "-0.5"}, "--decode-ms must be >= 0 (got -0.5)"},
		{[]string{"--overhead-ms", "-2"}, "--overhead-ms must be >= 0 (got -2)"},
		{[]string{"--trace-block", "500"}, "--trace-block must be a multiple of 16 in 16..1048576 (got 500)"},
		{[]string{"--trace-block", "0"}, "--trace-block must be a multiple of 16 in 16..1048576 (got 0)"},
		{[]string{"--trace-requests", "-1"}, "--trace-requests must be in 0..1000000 (got -1)"},
		{[]string{"--trace-window", "-1s"}, "--trace-window must be >= 0 (got -1s)"},
		{[]string{"--time-scale", "0"}, "--time-scale must be > 0 (got 0)"},
		{[]string{"--trace", "t.jsonl", "--scenario", "churn"}, "--scenario churn and --trace: a trace replaces the generated workload"},
		{[]string{"--tokenizer", "tokenizer.json"}, "--tokenizer tokenizes the text prompts of a --trace, and none is given"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			c := parse(t, tc.args...)
			err := c.Validate()
			if got := asFlags(err); got != tc.want {
				t.Fatalf("Validate() = %v, want %q", got, tc.want)
			}
			// Run refuses the same settings rather than replacing them.
			if _, err := Run(context.Background(), Options{Config: c}); asFlags(err) != tc.want {
				t.Fatalf("Run: %v, want %q", err, tc.want)
			}
		})
	}
}

// TestValidAtTheLimits checks that the edges of each range are accepted,
// zero included where it means something.
func TestValidAtTheLimits(t *testing.T) {
	for _, args := range [][]string{
		{"--pods", "1"}, {"--pods", "256"}, {"--requests", "1000000"}, {"--capacity", "0"},
		{"--delay-ms", "0"}, {"--decode-ms", "0"}, {"--overhead-ms", "0"},
		{"--prefix-weight", "0"}, {"--load-weight", "0"}, {"--load", "100"}, {"--capacity-factor", "100"},
		{"--trace-block", "16"}, {"--trace-block", "1048576"}, {"--trace-window", "0"},
	} {
		c := parse(t, args...)
		if err := c.Validate(); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
}

func TestFlagParseErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--pods", "x"}, {"--pods", "1.5"}, {"--seed", "-1"}, {"--load", "lots"}, {"--delay-ms", "1e300"},
		{"--trace-window", "10"},
	} {
		c := Defaults()
		fs := flag.NewFlagSet("demo", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c.RegisterFlags(fs)
		name := strings.TrimLeft(args[0], "-")
		if err := fs.Parse(args); err == nil || !strings.Contains(err.Error(), "-"+name+":") {
			t.Errorf("%v: %v, want an error naming %s", args, err, name)
		}
	}
}

// TestCapacityErrorNamesItsSource checks that a capacity too small for
// the largest request is blamed on the flag it came from.
func TestCapacityErrorNamesItsSource(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--capacity", "5"}, "--capacity 5 cannot hold the largest request"},
		{[]string{"--capacity-factor", "0.01"}, "--capacity-factor 0.01 gives"},
	} {
		_, err := Run(context.Background(), Options{Config: parse(t, tc.args...)})
		if got := asFlags(err); !strings.HasPrefix(got, tc.want) {
			t.Errorf("%v: %v, want an error starting %q", tc.args, got, tc.want)
		}
	}
}

// asFlags is a configuration error as the kvindex command prints it:
// each setting named by its flag. Anything else is "not a configuration
// error: ...".
func asFlags(err error) string {
	ce, ok := configerr.As(err)
	if !ok || !ce.Usage() {
		return fmt.Sprintf("not a configuration error: %v", err)
	}
	return ce.Render(func(f configerr.Field) string { return "--" + string(f) })
}

// TestValidateGivenRefusesGeneratedFlags checks that, with a trace, each
// flag of the generated workload that was given is refused by its name,
// and that generatedOnly names flags.
func TestValidateGivenRefusesGeneratedFlags(t *testing.T) {
	c := Defaults()
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	c.RegisterFlags(fs)
	for _, name := range generatedOnly {
		if fs.Lookup(name) == nil {
			t.Fatalf("generatedOnly names %q, not a flag", name)
		}
		given := func(f string) bool { return f == name }
		if err := c.ValidateGiven(given); err != nil {
			t.Errorf("--%s without --trace: %v", name, err)
		}
		c.Trace = "t.jsonl"
		want := "--" + name + " shapes the generated workload, which --trace replaces"
		if got := asFlags(c.ValidateGiven(given)); !strings.HasPrefix(got, want) {
			t.Errorf("--%s with --trace: %q, want %q...", name, got, want)
		}
		c.Trace = ""
	}
	c.Trace = "t.jsonl"
	if err := c.ValidateGiven(func(f string) bool { return f == "pods" || f == "capacity" }); err != nil {
		t.Errorf("--pods and --capacity with --trace: %v", err)
	}
}
