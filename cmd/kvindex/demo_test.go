package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/demo"
)

// tiny keeps CLI runs quick: two pods, two conversations, a few turns.
var tiny = []string{"--pods", "2", "--sessions", "2", "--turns", "3", "--requests", "16"}

func TestDemoJSON(t *testing.T) {
	// --delay-ms 0 (an instantaneous event path) is valid.
	out, errOut, code := runCLI(t, append([]string{"demo", "--json", "--seed", "4", "--delay-ms", "0"}, tiny...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if errOut != "" {
		t.Fatalf("--json wrote to stderr (no progress bar expected): %q", errOut)
	}
	var rep struct {
		Scenario string `json:"scenario"`
		Pods     int    `json:"pods"`
		Routers  []struct {
			Name           string   `json:"name"`
			CachedFraction *float64 `json:"fleet_cached_fraction"`
			PrefillTokens  *int64   `json:"prefill_tokens"`
			P50            *float64 `json:"ttft_p50_ms"`
			P90            *float64 `json:"ttft_p90_ms"`
			Imbalance      *float64 `json:"imbalance"`
			HitRate        *float64 `json:"engine_hit_rate"`
		} `json:"routers"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if rep.Scenario != "agents" || rep.Pods != 2 {
		t.Fatalf("scenario %q pods %d", rep.Scenario, rep.Pods)
	}
	var names []string
	for _, r := range rep.Routers {
		names = append(names, r.Name)
		if r.CachedFraction == nil || r.PrefillTokens == nil || r.P50 == nil || r.P90 == nil || r.Imbalance == nil || r.HitRate == nil {
			t.Fatalf("router %s misses a field: %s", r.Name, out)
		}
		if *r.CachedFraction < 0 || *r.CachedFraction > 1 || *r.Imbalance < 1 {
			t.Fatalf("router %s: cached %v imbalance %v out of range", r.Name, *r.CachedFraction, *r.Imbalance)
		}
	}
	want := []string{"round-robin", "least-loaded", "consistent-hash", "approximate", "precise", "oracle"}
	if !slices.Equal(names, want) {
		t.Fatalf("routers %v, want %v", names, want)
	}
}

func TestDemoTableAndCharts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "report")
	out, errOut, code := runCLI(t, append([]string{"demo", "--scenario", "hot-prefix", "--out", dir}, tiny...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"scenario hot-prefix", "working set:", "fleet capacity 1.5x", "precise(load=0)", "TTFT p90", "demo.svg"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	svg, err := os.ReadFile(filepath.Join(dir, "demo.svg"))
	if err != nil || !strings.HasPrefix(string(svg), "<svg") {
		t.Fatalf("demo.svg: %v %.40q", err, svg)
	}
	page, err := os.ReadFile(filepath.Join(dir, "demo.html"))
	if err != nil || !strings.Contains(string(page), "<svg") || !strings.Contains(string(page), demo.Why(demo.RouterPrecise)[:40]) {
		t.Fatalf("demo.html lacks the chart or the explanations: %v", err)
	}
}

func TestDemoBadFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
		code int
	}{
		{"scenario", []string{"--scenario", "nope"}, "unknown scenario", exitUsage},
		{"pods", []string{"--pods", "0"}, "--pods", exitUsage},
		// A zero the user gave is checked, not replaced by the default.
		{"capacity factor", []string{"--capacity-factor", "0"}, "--capacity-factor must be > 0 (got 0)", exitUsage},
		{"load", []string{"--load", "-1"}, "--load", exitUsage},
		{"seed", []string{"--seed", "0"}, "--seed", exitUsage},
		{"weights", []string{"--prefix-weight", "-1"}, "--prefix-weight", exitUsage},
		{"cost", []string{"--prefill-us", "0"}, "--prefill-us", exitUsage},
		{"delay", []string{"--delay-ms", "-1"}, "--delay-ms", exitUsage},
		{"capacity too small", []string{"--capacity", "5"}, "cannot hold the largest request", exitUsage},
		{"argument", []string{"extra"}, "takes no arguments", exitUsage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, errOut, code := runCLI(t, append(append([]string{"demo"}, tiny...), tc.args...)...)
			if code != tc.code || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
				t.Fatalf("exit %d, stderr %q: want exit %d and one line mentioning %q", code, errOut, tc.code, tc.want)
			}
		})
	}
}

func TestDemoHelpStatesTheModel(t *testing.T) {
	out, _, code := runCLI(t, "demo", "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"--prefill-us", "--decode-ms", "--overhead-ms", "t + --delay-ms", "--capacity-factor", "extra_routers", "approximate"} {
		if !strings.Contains(out, want) {
			t.Errorf("help lacks %q", want)
		}
	}
	// The router list is the demo package's, verbatim.
	if !strings.Contains(out, "Routers:\n"+demo.RoutersHelp()+"\n") {
		t.Errorf("help lacks demo.RoutersHelp():\n%s", out)
	}
}

// TestDemoNewScenarios runs the gateways and sessions scenarios through
// the CLI: each prints what makes it different.
func TestDemoNewScenarios(t *testing.T) {
	for _, tc := range []struct {
		scenario string
		want     []string
	}{
		{"gateways", []string{"scenario gateways", "gateways: 3 replicas", "approximate", "precise"}},
		{"sessions", []string{"scenario sessions", "consistent-hash", "session-affinity"}},
	} {
		t.Run(tc.scenario, func(t *testing.T) {
			out, errOut, code := runCLI(t, append([]string{"demo", "--scenario", tc.scenario}, tiny...)...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			for _, want := range tc.want {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
		})
	}
}

// shippedTrace is the conversation trace the repository ships.
const shippedTrace = "../../internal/trace/testdata/conversations.jsonl"

// TestDemoTrace replays the shipped trace's first requests: the table
// states the format, the load and the ceiling; --json carries them.
func TestDemoTrace(t *testing.T) {
	args := []string{"demo", "--trace", shippedTrace, "--trace-requests", "120", "--pods", "4"}
	out, errOut, code := runCLI(t, args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"kvindex demo: trace " + shippedTrace, "Mooncake format (detected): 120 requests (the first 120)",
		"load ", "ceiling: one unlimited cache would serve", "of ceiling", "precise(load=0)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	out, errOut, code = runCLI(t, append(args, "--json")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep struct {
		Scenario string `json:"scenario"`
		Trace    struct {
			Format   string   `json:"format"`
			Requests int      `json:"requests"`
			Load     *float64 `json:"load"`
			Ceiling  *float64 `json:"ceiling_cached_fraction"`
		} `json:"trace"`
		Routers []struct {
			Name      string   `json:"name"`
			Cached    float64  `json:"fleet_cached_fraction"`
			OfCeiling *float64 `json:"of_ceiling"`
		} `json:"routers"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if rep.Scenario != "trace" || rep.Trace.Format != "mooncake" || rep.Trace.Requests != 120 || rep.Trace.Load == nil || rep.Trace.Ceiling == nil {
		t.Fatalf("trace section %+v", rep.Trace)
	}
	for _, r := range rep.Routers {
		if r.OfCeiling == nil || *r.OfCeiling <= 0 || r.Cached > *rep.Trace.Ceiling {
			t.Errorf("%s: cached %v, of ceiling %v, ceiling %v", r.Name, r.Cached, r.OfCeiling, *rep.Trace.Ceiling)
		}
	}
}

// TestDemoBadTrace checks that a bad trace is one line of error naming
// the flag, the file and the line.
func TestDemoBadTrace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.jsonl")
	data := `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}` + "\n" +
		`{"timestamp": 1, "input_length": -600, "output_length": 5, "hash_ids": [1, 2]}` + "\n"
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--trace", path}, "--trace " + path + `: line 2: negative "input_length" -600`},
		{[]string{"--trace", path, "--scenario", "churn"}, "--scenario churn and --trace"},
		{[]string{"--trace", path, "--trace-block", "100"}, "--trace-block must be a multiple of 16"},
		{[]string{"--trace", path, "--load", "0.9"}, "--load shapes the generated workload, which --trace replaces"},
	} {
		_, errOut, code := runCLI(t, append([]string{"demo"}, tc.args...)...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q: want exit %d and one line with %q", tc.args, code, errOut, exitUsage, tc.want)
		}
	}
}
