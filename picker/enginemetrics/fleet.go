package enginemetrics

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// Fraction is a cached-prefix fraction's terms over a window: Hits of
// Queries prompt tokens were served from cache.
type Fraction struct {
	Queries float64 `json:"queries"`
	Hits    float64 `json:"hits"`
}

// Value returns Hits/Queries, and false when no token was queried in the
// window (no traffic is not a fraction of 0).
func (f Fraction) Value() (float64, bool) {
	if f.Queries <= 0 {
		return 0, false
	}
	return min(1, f.Hits/f.Queries), true
}

// Overall is the model name under which the fleet's totals, every model
// together, are reported: by Fleet's methods and as the model label of
// the exported fraction gauges. No served model has an empty name.
const Overall = ""

// ErrBadUsage is returned by Fleet.Observe for token counts no response
// can have.
var ErrBadUsage = errors.New("enginemetrics: bad usage")

// Fleet keeps the live cached-prefix fraction over a sliding window, from
// two sources kept apart:
//
//   - the engines' own prefix-cache counters, as the Scraper reads them:
//     every request every engine served, whoever routed it;
//   - the usage of the responses that passed through the picker
//     (Observe).
//
// It also counts, per model, the cached tokens the picker's decisions
// predicted (Predict) and those the responses then reported (Observe):
// observed falling behind predicted while the engines' own hit rates stay
// high means the picker routes on a wrong view of the caches.
//
// Models are tracked one by one up to a limit (Config.MaxModels); a
// further model's tokens count in the overall figures only, as model
// names arrive with requests and must not grow memory or label sets
// without bound. A Fleet is safe for concurrent use.
type Fleet struct {
	window    time.Duration
	maxModels int
	now       func() time.Time

	mu        sync.Mutex
	models    map[string]*modelStats
	overall   modelStats
	badUsage  uint64
	untracked uint64 // observations of models past the limit
}

// modelStats is one model's (or the overall) figures.
type modelStats struct {
	engines   ring // the engines' counter deltas
	observed  ring // the responses' usage
	predicted float64
	cached    float64 // observed cached tokens, all time
	prompt    float64 // observed prompt tokens, all time
}

// newFleet makes a Fleet; cfg is already defaulted and valid.
func newFleet(cfg Config) *Fleet {
	return &Fleet{window: cfg.Window, maxModels: cfg.MaxModels, now: cfg.Now, models: map[string]*modelStats{},
		overall: modelStats{engines: newRing(cfg.Window), observed: newRing(cfg.Window)}}
}

// stats returns the model's figures, or nil past the model limit. Called
// with mu held.
func (f *Fleet) stats(model string) *modelStats {
	if model == Overall {
		// A page without model_name, or a request without a model: the
		// overall figures have it.
		return nil
	}
	if m, ok := f.models[model]; ok {
		return m
	}
	if len(f.models) >= f.maxModels {
		f.untracked++
		return nil
	}
	m := &modelStats{engines: newRing(f.window), observed: newRing(f.window)}
	f.models[model] = m
	return m
}

// engineDelta records prefix-cache counter increments read from an
// engine at t.
func (f *Fleet) engineDelta(t time.Time, model string, d Counters) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.overall.engines.add(t, d)
	if m := f.stats(model); m != nil {
		m.engines.add(t, d)
	}
}

// Observe records one response's usage as it passed through the picker:
// usage.prompt_tokens and usage.prompt_tokens_details.cached_tokens.
// Counts no response can have (negative, or more cached than prompt
// tokens) are refused with ErrBadUsage and counted.
func (f *Fleet) Observe(model string, promptTokens, cachedTokens int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if promptTokens < 0 || cachedTokens < 0 || cachedTokens > promptTokens {
		f.badUsage++
		return fmt.Errorf("%w: %d cached of %d prompt tokens", ErrBadUsage, cachedTokens, promptTokens)
	}
	t := f.now()
	c := Counters{Queries: float64(promptTokens), Hits: float64(cachedTokens)}
	for _, m := range []*modelStats{&f.overall, f.stats(model)} {
		if m != nil {
			m.observed.add(t, c)
			m.cached += c.Hits
			m.prompt += c.Queries
		}
	}
	return nil
}

// Predict records the cached tokens a pick predicted for a request: the
// chosen candidate's picker.Score.MatchedTokens. Negative counts are
// ignored.
func (f *Fleet) Predict(model string, matchedTokens int) {
	if matchedTokens < 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.overall.predicted += float64(matchedTokens)
	if m := f.stats(model); m != nil {
		m.predicted += float64(matchedTokens)
	}
}

// Engines returns the fraction from the engines' own counters over the
// window, for model or, with Overall, the whole fleet.
func (f *Fleet) Engines(model string) Fraction {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m := f.lookup(model); m != nil {
		return m.engines.sum(f.now())
	}
	return Fraction{}
}

// Observed returns the fraction from the usage of responses that passed
// through the picker, over the window.
func (f *Fleet) Observed(model string) Fraction {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m := f.lookup(model); m != nil {
		return m.observed.sum(f.now())
	}
	return Fraction{}
}

// Totals are the picker's counts since start, in tokens.
type Totals struct {
	// Predicted cached tokens, from the picks (Predict).
	Predicted float64 `json:"predicted_cached_tokens"`
	// Observed cached and prompt tokens, from the responses (Observe).
	ObservedCached float64 `json:"observed_cached_tokens"`
	ObservedPrompt float64 `json:"observed_prompt_tokens"`
}

// Totals returns the picker's predicted and observed token counts for
// model or Overall.
func (f *Fleet) Totals(model string) Totals {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m := f.lookup(model); m != nil {
		return Totals{Predicted: m.predicted, ObservedCached: m.cached, ObservedPrompt: m.prompt}
	}
	return Totals{}
}

// BadUsage returns how many observations Observe refused.
func (f *Fleet) BadUsage() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.badUsage
}

// lookup returns a model's figures without creating them. Called with mu
// held.
func (f *Fleet) lookup(model string) *modelStats {
	if model == Overall {
		return &f.overall
	}
	return f.models[model]
}

// ModelSummary is one model's (or the overall) figures, as kvindex pods
// shows them.
type ModelSummary struct {
	Model string `json:"model"`
	// Engines and Observed are the window's terms; see Fleet.Engines
	// and Fleet.Observed.
	Engines  Fraction `json:"engines"`
	Observed Fraction `json:"observed"`
	// EnginesFraction and ObservedFraction are their values, absent
	// while the window saw no query.
	EnginesFraction  *float64 `json:"engines_fraction,omitempty"`
	ObservedFraction *float64 `json:"observed_fraction,omitempty"`
	Totals
}

// Summary is the fleet's figures for an API answer.
type Summary struct {
	WindowSeconds float64 `json:"window_seconds"`
	// Models lists the overall figures first (Model == Overall), then each
	// model by name.
	Models []ModelSummary `json:"models"`
}

// Summary returns every tracked model's figures and the overall ones.
func (f *Fleet) Summary() Summary {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	one := func(name string, m *modelStats) ModelSummary {
		ms := ModelSummary{Model: name, Engines: m.engines.sum(now), Observed: m.observed.sum(now),
			Totals: Totals{Predicted: m.predicted, ObservedCached: m.cached, ObservedPrompt: m.prompt}}
		if v, ok := ms.Engines.Value(); ok {
			ms.EnginesFraction = &v
		}
		if v, ok := ms.Observed.Value(); ok {
			ms.ObservedFraction = &v
		}
		return ms
	}
	s := Summary{WindowSeconds: f.window.Seconds(), Models: []ModelSummary{one(Overall, &f.overall)}}
	for _, n := range slices.Sorted(maps.Keys(f.models)) {
		s.Models = append(s.Models, one(n, f.models[n]))
	}
	return s
}

// ring sums token counts over a sliding window in one-second buckets, so
// that its size is fixed by the window, not by the traffic.
type ring struct {
	buckets []bucket
}

type bucket struct {
	sec int64 // unix second the bucket holds; stale when out of the window
	c   Counters
}

func newRing(window time.Duration) ring {
	n := int((window + time.Second - 1) / time.Second)
	return ring{buckets: make([]bucket, max(n, 1))}
}

func (r *ring) add(t time.Time, c Counters) {
	s := t.Unix()
	b := &r.buckets[int(mod(s, int64(len(r.buckets))))]
	if b.sec != s {
		*b = bucket{sec: s}
	}
	b.c.Queries += c.Queries
	b.c.Hits += c.Hits
}

// sum adds up the buckets of the last len(buckets) seconds up to now.
func (r *ring) sum(now time.Time) Fraction {
	n := now.Unix()
	var f Fraction
	for _, b := range r.buckets {
		if b.sec > n-int64(len(r.buckets)) && b.sec <= n {
			f.Queries += b.c.Queries
			f.Hits += b.c.Hits
		}
	}
	return f
}

func mod(a, n int64) int64 { return ((a % n) + n) % n }
