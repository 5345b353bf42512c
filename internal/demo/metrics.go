package demo

import (
	"math"
	"slices"
	"time"
)

// RouterResult is one router's scorecard. The JSON names are a contract
// other tools rely on.
type RouterResult struct {
	Name string `json:"name"`
	// CachedFraction is the fleet-wide cached-prefix fraction: the sum of
	// cached prompt tokens over the sum of prompt tokens.
	CachedFraction float64 `json:"fleet_cached_fraction"`
	// PrefillTokens is the number of prompt tokens the fleet computed.
	PrefillTokens int64 `json:"prefill_tokens"`
	// TTFT percentiles in simulated milliseconds.
	TTFTP50 float64 `json:"ttft_p50_ms"`
	TTFTP90 float64 `json:"ttft_p90_ms"`
	// Imbalance is the most requests any engine served over the mean.
	Imbalance float64 `json:"imbalance"`
	// EngineHitRate is the mean, over engines that served requests, of
	// each engine's cached over prompt tokens.
	EngineHitRate float64 `json:"engine_hit_rate"`
	// OfCeiling is CachedFraction over the replayed trace's ceiling
	// (TraceInfo.Ceiling); absent for a generated workload.
	OfCeiling *float64 `json:"of_ceiling,omitempty"`

	// Timeline is the cached fraction of consecutive windows of requests
	// (in arrival-plan order), for the chart.
	Timeline []float64 `json:"-"`
	// PerEngine counts the requests each engine served.
	PerEngine []int `json:"-"`
	// Makespan is the simulated time the run took.
	Makespan time.Duration `json:"-"`
}

// timelineWindows is the resolution of RouterResult.Timeline.
const timelineWindows = 24

// score computes a router's scorecard from its outcomes.
func score(name string, w *Workload, out []outcome, pods int, cost CostModel) RouterResult {
	res := RouterResult{Name: name, PerEngine: make([]int, pods)}
	cached := make([]int64, pods)
	prompt := make([]int64, pods)
	ttft := make([]time.Duration, len(out))
	winCached := make([]int64, timelineWindows)
	winPrompt := make([]int64, timelineWindows)
	var totCached, totPrompt int64
	for i := range out {
		o, r := &out[i], &w.Requests[i]
		n := int64(r.PromptLen())
		c := int64(o.Cached)
		totCached += c
		totPrompt += n
		res.PerEngine[o.Pod]++
		cached[o.Pod] += c
		prompt[o.Pod] += n
		ttft[i] = o.TTFT
		win := i * timelineWindows / len(out)
		winCached[win] += c
		winPrompt[win] += n
		done := o.Arrived + o.TTFT + time.Duration(r.Output())*cost.DecodePerToken
		res.Makespan = max(res.Makespan, done)
	}
	res.CachedFraction = ratio(totCached, totPrompt)
	res.PrefillTokens = totPrompt - totCached
	slices.Sort(ttft)
	res.TTFTP50 = millis(percentile(ttft, 0.50))
	res.TTFTP90 = millis(percentile(ttft, 0.90))
	maxServed, served := 0, 0
	var hit float64
	for p := range pods {
		maxServed = max(maxServed, res.PerEngine[p])
		if res.PerEngine[p] > 0 {
			served++
			hit += ratio(cached[p], prompt[p])
		}
	}
	res.Imbalance = round(float64(maxServed)*float64(pods)/float64(len(out)), 3)
	if served > 0 {
		res.EngineHitRate = round(hit/float64(served), 4)
	}
	res.Timeline = make([]float64, timelineWindows)
	for i := range res.Timeline {
		res.Timeline[i] = ratio(winCached[i], winPrompt[i])
	}
	return res
}

// percentile returns the nearest-rank percentile of sorted durations.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return round(float64(a)/float64(b), 4)
}

func millis(d time.Duration) float64 { return round(float64(d)/float64(time.Millisecond), 1) }

// round keeps reports and JSON free of float noise.
func round(x float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(x*p) / p
}
