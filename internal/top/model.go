package top

import (
	"cmp"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
)

// Sample is what one poll read. A source that could not be read has its
// error set and its data nil; a source not asked for (no metrics URL) has
// neither.
type Sample struct {
	At      time.Time
	Pods    *client.PodsJSON
	PodsErr string
	// Serve is serve's /metrics page.
	Serve    Metrics
	ServeErr string
	Pickers  []PickerSample
}

// PickerSample is one picker's /metrics page.
type PickerSample struct {
	URL     string
	Metrics Metrics
	Err     string
}

// Num is a figure that may be unknown (shown "-"): a rate before the
// second scrape, a fraction with nothing counted.
type Num struct {
	V  float64
	OK bool
}

func known(v float64, ok bool) Num { return Num{V: v, OK: ok} }

// Model is what one frame shows.
type Model struct {
	Server   string
	Interval time.Duration
	At       time.Time
	// Interactive frames say how to quit.
	Interactive bool
	// Errors are the sources that could not be read, one line each.
	Errors []string
	// PodsKnown is false while ListPods has not answered.
	PodsKnown bool
	Engines   []Engine
	// Health counts the engines in each health state, in the order of
	// kvindex.v1.EngineHealth.
	Health       []HealthCount
	EventsPerSec Num
	Gaps         uint64
	ReplaysOK    uint64
	ReplaysFail  uint64
	// Fractions has the whole fleet ("" model) first, then each model.
	Fractions []Fraction
	Fallbacks []Fallback
}

// HealthCount is how many engines are in one health state.
type HealthCount struct {
	State string
	N     int
}

// Engine is one engine's row.
type Engine struct {
	Name, Model, Health string
	Blocks              uint64
	// ByMedium splits Blocks by storage medium, the GPU first, then the
	// CPU, then the other tiers by name; empty from a kvindex that does
	// not report the split.
	ByMedium      []MediumBlocks
	EventsPerSec  Num
	Gaps          uint64
	ReplaysOK     uint64
	ReplaysFailed uint64
	HashCheck     string
	// LastEvent is the age in seconds of the engine's last applied batch:
	// how far its entries may lag; unknown if it sent none to this
	// process, when Restored says whether its entries came from a
	// snapshot.
	LastEvent Num
	Restored  bool
	// Lag is how many seconds after the engine stamped its last applied
	// batch kvindex applied it, by each side's clock (negative: the
	// engine's clock is ahead); unknown until a stamped batch is applied.
	Lag Num
}

// MediumBlocks is how many of an engine's blocks sit in one medium.
type MediumBlocks struct {
	Medium string
	Blocks uint64
}

// byMedium orders an engine's blocks by medium as Engine.ByMedium says:
// from the fastest tier kvindex knows to the rest by name.
func byMedium(m map[string]uint64) []MediumBlocks {
	rank := func(medium string) int {
		switch medium {
		case "GPU":
			return 0
		case "CPU":
			return 1
		}
		return 2
	}
	var out []MediumBlocks
	for _, medium := range sortedKeys(m) {
		out = append(out, MediumBlocks{Medium: medium, Blocks: m[medium]})
	}
	slices.SortStableFunc(out, func(a, b MediumBlocks) int { return cmp.Compare(rank(a.Medium), rank(b.Medium)) })
	return out
}

// Fraction is the share of prompt tokens served from cache, for one model
// or ("") for all: as the engines' own counters tell it (serve or the
// picker scraping them), as the responses through the picker tell it, and
// as the picker predicted when it chose (over the last interval).
type Fraction struct {
	Model                        string
	Engines, Observed, Predicted Num
}

// Fallback is one reason the picker routed without the index: the count
// so far, per second, and as a share of its picks over the last interval.
type Fallback struct {
	Reason      string
	Total       float64
	PerSec      Num
	ShareOfPick Num
}

// Header is the part of a Model that does not come from a Sample.
type Header struct {
	Server      string
	Interval    time.Duration
	Interactive bool
}

// Build computes a frame's Model from the current sample and the one
// before it (nil for the first frame: rates are then unknown).
func Build(h Header, prev, cur *Sample) Model {
	m := Model{Server: h.Server, Interval: h.Interval, Interactive: h.Interactive, At: cur.At}
	retry := "" // a single frame tries once
	if h.Interactive {
		retry = "; retrying every " + h.Interval.String()
	}
	if cur.PodsErr != "" {
		m.Errors = append(m.Errors, cur.PodsErr+retry)
	}
	if cur.ServeErr != "" {
		m.Errors = append(m.Errors, "serve metrics: "+cur.ServeErr+retry)
	}
	for _, p := range cur.Pickers {
		if p.Err != "" {
			m.Errors = append(m.Errors, "picker "+p.URL+": "+p.Err+retry)
		}
	}
	var dt time.Duration
	if prev != nil {
		dt = cur.At.Sub(prev.At)
	}
	buildEngines(&m, prev, cur, dt)
	m.Fractions = fractions(prev, cur)
	m.Fallbacks = fallbacks(prev, cur, dt)
	return m
}

func buildEngines(m *Model, prev, cur *Sample, dt time.Duration) {
	if cur.Pods == nil {
		return
	}
	m.PodsKnown = true
	counts := map[string]int{}
	var total float64
	var totalOK bool
	for _, p := range cur.Pods.Pods {
		e := Engine{
			Name: client.EngineName(p.Pod, p.DPRank), Model: p.Model, Health: p.Health, Blocks: p.Blocks, ByMedium: byMedium(p.BlocksByMedium),
			Gaps: p.Gaps, ReplaysOK: p.ReplaysOK, ReplaysFailed: p.ReplaysFailed, HashCheck: p.HashCheck, Restored: p.Restored(),
		}
		if p.LastEventAgeSeconds != nil {
			e.LastEvent = known(*p.LastEventAgeSeconds, true)
		}
		if p.LastBatchLagSeconds != nil {
			e.Lag = known(*p.LastBatchLagSeconds, true)
		}
		now := engineEvents(cur, p)
		if prev != nil && prev.Pods != nil {
			if i := slices.IndexFunc(prev.Pods.Pods, func(q client.PodInfoJSON) bool { return sameEngine(p, q) }); i >= 0 {
				e.EventsPerSec = known(Rate(engineEvents(prev, prev.Pods.Pods[i]), now, true, dt))
			}
		}
		if e.EventsPerSec.OK {
			total, totalOK = total+e.EventsPerSec.V, true
		}
		counts[e.Health]++
		m.Gaps += p.Gaps
		m.ReplaysOK += p.ReplaysOK
		m.ReplaysFail += p.ReplaysFailed
		m.Engines = append(m.Engines, e)
	}
	m.EventsPerSec = known(total, totalOK || (len(m.Engines) == 0 && prev != nil && prev.Pods != nil))
	slices.SortFunc(m.Engines, func(a, b Engine) int { return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Model, b.Model)) })
	for _, state := range healthStates() {
		if counts[state] > 0 {
			m.Health = append(m.Health, HealthCount{State: state, N: counts[state]})
			delete(counts, state)
		}
	}
	for _, state := range sortedKeys(counts) { // a state this build does not know
		m.Health = append(m.Health, HealthCount{State: state, N: counts[state]})
	}
}

// healthStates are the health words in the order of kvindex.v1.EngineHealth.
func healthStates() []string {
	nums := slices.Sorted(maps.Keys(kvindexv1.EngineHealth_name))
	var out []string
	for _, n := range nums {
		if s := client.HealthName(kvindexv1.EngineHealth(n)); !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

func sameEngine(a, b client.PodInfoJSON) bool {
	return a.Pod == b.Pod && a.DPRank == b.DPRank && a.Model == b.Model
}

// engineEvents is the engine's kvindex_ingest_events_total from serve's
// page, or the same counter from ListPods when the page has no series of
// its own for the engine (serve caps the engines it exports).
func engineEvents(s *Sample, p client.PodInfoJSON) float64 {
	match := map[string]string{"pod": p.Pod, "dp_rank": strconv.FormatUint(uint64(p.DPRank), 10), "model": p.Model}
	if v, ok := s.Serve.Sum(metricEvents, match); ok {
		return v
	}
	return float64(p.Events)
}

// pages are a sample's metric pages, each from one process, by source.
func (s *Sample) pages() map[string]Metrics {
	out := map[string]Metrics{}
	if s.Serve != nil {
		out["serve"] = s.Serve
	}
	for _, p := range s.Pickers {
		if p.Metrics != nil {
			out["picker "+p.URL] = p.Metrics
		}
	}
	return out
}

// all is every page of the sample read as one.
func (s *Sample) all() Metrics {
	out := Metrics{}
	for _, m := range s.pages() {
		out.merge(m)
	}
	return out
}

// increase is how much the counters name{match} grew between prev and
// cur, page by page so that one process's restart is counted as a reset of
// its own counters; ok is false when no page was read both times.
func increase(prev, cur *Sample, name string, match map[string]string) (float64, bool) {
	if prev == nil {
		return 0, false
	}
	before := prev.pages()
	var sum float64
	var any bool
	for src, page := range cur.pages() {
		old, ok := before[src]
		if !ok {
			continue
		}
		c, okC := page.Sum(name, match)
		p, okP := old.Sum(name, match)
		if !okC {
			continue
		}
		if inc, ok := Increase(p, c, okP); ok {
			sum, any = sum+inc, true
		} else if !okP { // the series appeared since: it counted from 0
			sum, any = sum+c, true
		}
	}
	return sum, any
}

func fractions(prev, cur *Sample) []Fraction {
	all := cur.all()
	models := map[string]bool{"": true}
	for _, name := range []string{metricFleetFraction, metricObservedFraction, metricPredictedTokens} {
		for _, v := range all.Values(name, "model") {
			models[v] = true
		}
	}
	if cur.Pods != nil {
		for _, f := range cur.Pods.Fleet {
			models[f.Model] = true
		}
	}
	var out []Fraction
	any := false
	for _, model := range sortedKeys(models) {
		f := Fraction{Model: model}
		exact := map[string]string{"model": model}
		f.Engines = known(all.Max(metricFleetFraction, exact))
		if !f.Engines.OK && cur.Pods != nil {
			for _, fl := range cur.Pods.Fleet {
				if fl.Model == model && fl.Fraction != nil {
					f.Engines = known(*fl.Fraction, true)
				}
			}
		}
		f.Observed = known(all.Max(metricObservedFraction, exact))
		counters := exact
		if model == "" {
			counters = nil // the counters carry no model="": their sum is the fleet's
		}
		pred, okP := increase(prev, cur, metricPredictedTokens, counters)
		prompt, okQ := increase(prev, cur, metricObservedPrompt, counters)
		f.Predicted = known(pred/prompt, okP && okQ && prompt > 0)
		any = any || f.Engines.OK || f.Observed.OK || f.Predicted.OK
		out = append(out, f)
	}
	if !any {
		return nil
	}
	return out
}

func fallbacks(prev, cur *Sample, dt time.Duration) []Fallback {
	all := cur.all()
	picks, okPicks := increase(prev, cur, metricPicks, nil)
	var out []Fallback
	for _, reason := range all.Values(metricFallbacks, "reason") {
		match := map[string]string{"reason": reason}
		f := Fallback{Reason: reason}
		f.Total, _ = all.Sum(metricFallbacks, match)
		if inc, ok := increase(prev, cur, metricFallbacks, match); ok {
			f.PerSec = known(inc/dt.Seconds(), dt > 0)
			f.ShareOfPick = known(inc/picks, okPicks && picks > 0)
		}
		out = append(out, f)
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
