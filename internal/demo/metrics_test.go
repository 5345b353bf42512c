package demo

import (
	"testing"
	"time"
)

// TestScore checks every scorecard number on a hand-made run: 4 requests
// of 100 prompt tokens on 2 of 3 engines.
func TestScore(t *testing.T) {
	w := &Workload{}
	for range 4 {
		w.Requests = append(w.Requests, Request{Prompt: make([]uint64, 100), Full: make([]uint64, 110)})
	}
	out := []outcome{
		{Pod: 0, Cached: 100, TTFT: 10 * ms},
		{Pod: 0, Cached: 50, TTFT: 40 * ms},
		{Pod: 0, Cached: 0, TTFT: 30 * ms},
		{Pod: 2, Cached: 90, TTFT: 20 * ms, Arrived: time.Second},
	}
	res := score("x", w, out, 3, CostModel{PrefillPerToken: ms, DecodePerToken: ms})
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"cached fraction", res.CachedFraction, 240.0 / 400},
		{"prefill tokens", float64(res.PrefillTokens), 160},
		{"p50", res.TTFTP50, 20},
		{"p90", res.TTFTP90, 40},
		{"imbalance", res.Imbalance, 3 / (4.0 / 3)},
		// engine 0: 150/300, engine 2: 90/100; engine 1 served nothing.
		{"engine hit rate", res.EngineHitRate, (0.5 + 0.9) / 2},
		{"makespan", res.Makespan.Seconds(), 1.030},
	} {
		if c.got != round(c.want, 4) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if len(res.Timeline) != timelineWindows || res.PerEngine[0] != 3 || res.PerEngine[1] != 0 {
		t.Errorf("timeline %d windows, per engine %v", len(res.Timeline), res.PerEngine)
	}
}
