package top

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api/client"
)

var update = flag.Bool("update", false, "rewrite the golden frames in testdata/")

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func ptr[T any](v T) *T { return &v }

// fleetSample is a fleet of four engine ranks of two models, serve's page
// and one picker's, as read at t0+at with the counters scaled by k (so
// that two samples give known rates).
func fleetSample(at time.Duration, k float64) *Sample {
	pods := &client.PodsJSON{
		Pods: []client.PodInfoJSON{
			{Pod: "vllm-qwen-0", Model: "Qwen/Qwen2.5-7B", Health: "ok", Events: uint64(1000 * k), Blocks: 2500, BlocksByMedium: map[string]uint64{"GPU": 2000, "CPU": 500}, HashCheck: "verified", LastEventAgeSeconds: ptr(0.2), LastBatchLagSeconds: ptr(0.035)},
			{Pod: "vllm-qwen-0", DPRank: 1, Model: "Qwen/Qwen2.5-7B", Health: "ok", Events: uint64(800 * k), Blocks: 2412, BlocksByMedium: map[string]uint64{"GPU": 2412}, HashCheck: "verified", LastEventAgeSeconds: ptr(0.4), LastBatchLagSeconds: ptr(31.04)},
			{Pod: "vllm-llama-deployment-7f9c6d5b8-x2kqz", Model: "meta-llama/Llama-3.1-8B", Health: "degraded", Events: uint64(300 * k), Blocks: 870, BlocksByMedium: map[string]uint64{"GPU": 870}, Gaps: 2, ReplaysOK: 1, ReplaysFailed: 1, HashCheck: "mismatch", LastEventAgeSeconds: ptr(75.0), LastBatchLagSeconds: ptr(-12.5)},
			{Pod: "vllm-llama-1", Model: "meta-llama/Llama-3.1-8B", Health: "disconnected", HashCheck: "unknown"},
			{Pod: "vllm-llama-2", Model: "meta-llama/Llama-3.1-8B", Health: "restored", Blocks: 1200, BlocksByMedium: map[string]uint64{"LocalDisk": 100, "GPU": 800, "CPU": 300}, HashCheck: "unknown"},
		},
		Fleet: []client.FleetCacheJSON{{Model: "", Fraction: ptr(0.41)}, {Model: "Qwen/Qwen2.5-7B", Fraction: ptr(0.52)}},
	}
	serve := Metrics{
		// Only the first engine has its own series: the rest come from
		// ListPods' counters.
		metricEvents: {{Labels: map[string]string{"pod": "vllm-qwen-0", "dp_rank": "0", "model": "Qwen/Qwen2.5-7B"}, Value: 1000 * k}},
	}
	picker := Metrics{
		metricObservedFraction: {{Labels: map[string]string{"model": ""}, Value: 0.38}, {Labels: map[string]string{"model": "Qwen/Qwen2.5-7B"}, Value: 0.47}},
		metricPredictedTokens:  {{Labels: map[string]string{"model": "Qwen/Qwen2.5-7B"}, Value: 450 * k}, {Labels: map[string]string{"model": "meta-llama/Llama-3.1-8B"}, Value: 50 * k}},
		metricObservedPrompt:   {{Labels: map[string]string{"model": "Qwen/Qwen2.5-7B"}, Value: 800 * k}, {Labels: map[string]string{"model": "meta-llama/Llama-3.1-8B"}, Value: 200 * k}},
		metricPicks:            {{Labels: map[string]string{"result": "ok"}, Value: 100 * k}},
		metricFallbacks: {
			{Labels: map[string]string{"reason": "timeout"}, Value: 4 * k},
			{Labels: map[string]string{"reason": "index_unreachable"}, Value: 0},
		},
	}
	return &Sample{At: t0.Add(at), Pods: pods, Serve: serve, Pickers: []PickerSample{{URL: "http://picker:9090/metrics", Metrics: picker}}}
}

var header = Header{Server: "kvindex:50051", Interval: 2 * time.Second, Interactive: true}

// Each frame is checked against testdata/NAME.txt; go test -update
// rewrites them.
func TestFrames(t *testing.T) {
	unreachable := &Sample{At: t0, PodsErr: "cannot reach kvindex at kvindex:50051: connection refused", ServeErr: `Get "http://kvindex:8080/metrics": dial tcp: connection refused`}
	noEngines := &Sample{At: t0, Pods: &client.PodsJSON{}}
	for _, tc := range []struct {
		name          string
		prev, cur     *Sample
		width, height int
	}{
		{"first", nil, fleetSample(0, 1), 160, 40},
		{"second", fleetSample(0, 1), fleetSample(2*time.Second, 2), 160, 40},
		{"medium", fleetSample(0, 1), fleetSample(2*time.Second, 2), 110, 40},
		{"narrow", fleetSample(0, 1), fleetSample(2*time.Second, 2), 72, 40},
		{"tiny", fleetSample(0, 1), fleetSample(2*time.Second, 2), 40, 40},
		{"short", fleetSample(0, 1), fleetSample(2*time.Second, 2), 160, 8},
		{"unreachable", fleetSample(0, 1), unreachable, 100, 40},
		{"no-engines", nil, noEngines, 100, 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lines := Render(Build(header, tc.prev, tc.cur), tc.width, tc.height)
			for i, l := range lines {
				if n := len([]rune(l)); n > tc.width {
					t.Errorf("line %d is %d wide, more than %d: %q", i, n, tc.width, l)
				}
			}
			if len(lines) > tc.height {
				t.Errorf("%d lines, more than %d", len(lines), tc.height)
			}
			golden(t, filepath.Join("testdata", tc.name+".txt"), strings.Join(lines, "\n")+"\n")
		})
	}
}

func golden(t *testing.T, file, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s missing: run go test -run %s -update", file, t.Name())
	}
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("frame differs from %s (go test -update rewrites it):\n%s\nwant:\n%s", file, got, want)
	}
}

// An engine's BLOCKS cell splits its blocks by medium, the GPU first, then
// the CPU, then the other tiers by name; a kvindex that does not report
// the split shows the total.
func TestBlocksCell(t *testing.T) {
	for _, tc := range []struct {
		blocks   uint64
		byMedium map[string]uint64
		want     string
	}{
		{0, nil, "0"},
		{0, map[string]uint64{}, "0"},
		{42, nil, "42"},
		{42, map[string]uint64{"GPU": 42}, "GPU:42"},
		{160, map[string]uint64{"CPU": 40, "GPU": 120}, "GPU:120 CPU:40"},
		{7, map[string]uint64{"STORAGE": 1, "LocalDisk": 2, "CPU": 4}, "CPU:4 LocalDisk:2 STORAGE:1"},
	} {
		pods := &client.PodsJSON{Pods: []client.PodInfoJSON{{Pod: "p", Blocks: tc.blocks, BlocksByMedium: tc.byMedium}}}
		m := Build(header, nil, &Sample{At: t0, Pods: pods})
		if got := blocks(m.Engines[0]); got != tc.want {
			t.Errorf("%d blocks, %v by medium: %q, want %q", tc.blocks, tc.byMedium, got, tc.want)
		}
	}
}

// A picker that restarted between two scrapes has counters lower than
// before: their values are what it counted since, not a negative rate.
func TestBuildCounterReset(t *testing.T) {
	prev, cur := fleetSample(0, 10), fleetSample(2*time.Second, 1)
	m := Build(header, prev, cur)
	for _, f := range m.Fallbacks {
		if f.Reason == "timeout" && (!f.PerSec.OK || f.PerSec.V != 2) {
			t.Errorf("timeout fallbacks per second = %+v, want 2 (4 counted since the restart, over 2s)", f.PerSec)
		}
		if f.PerSec.V < 0 {
			t.Errorf("%s: negative rate %v", f.Reason, f.PerSec.V)
		}
	}
	for _, e := range m.Engines {
		if e.EventsPerSec.OK && e.EventsPerSec.V < 0 {
			t.Errorf("%s: negative events/s %v", e.Name, e.EventsPerSec.V)
		}
	}
	if got := m.Engines[len(m.Engines)-1]; got.Name != "vllm-qwen-0/1" || got.EventsPerSec.V != 400 {
		t.Errorf("last engine %s: %v events/s, want vllm-qwen-0/1 at 800/2s = 400", got.Name, got.EventsPerSec)
	}
}

// Rates are per page: one picker restarting does not hide another's
// increase, and a page read only now gives no rate.
func TestIncreaseIsPerPage(t *testing.T) {
	page := func(v float64) Metrics {
		return Metrics{metricPicks: {{Labels: map[string]string{"result": "ok"}, Value: v}}}
	}
	prev := &Sample{At: t0, Pickers: []PickerSample{{URL: "a", Metrics: page(100)}, {URL: "b", Metrics: page(50)}}}
	cur := &Sample{At: t0.Add(time.Second), Pickers: []PickerSample{{URL: "a", Metrics: page(3)}, {URL: "b", Metrics: page(60)}, {URL: "c", Metrics: page(1000)}}}
	if got, ok := increase(prev, cur, metricPicks, nil); !ok || got != 13 {
		t.Errorf("increase = %v, %v; want 13 (3 since a restarted, 10 on b, c not read before)", got, ok)
	}
	if _, ok := increase(nil, cur, metricPicks, nil); ok {
		t.Error("increase without an earlier sample is known")
	}
}
