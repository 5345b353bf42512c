package top

import (
	"fmt"
	"io"
	"maps"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The metric names top reads, as serve and the picker export them (and as
// deploy/monitoring's dashboard and rules use them).
const (
	metricEvents           = "kvindex_ingest_events_total"
	metricGaps             = "kvindex_ingest_gaps_total"
	metricReplays          = "kvindex_ingest_replays_total"
	metricFleetFraction    = "kvindex_fleet_cached_fraction"
	metricObservedFraction = "kvindex_picker_observed_cached_fraction"
	metricPredictedTokens  = "kvindex_picker_predicted_cached_tokens_total"
	metricObservedPrompt   = "kvindex_picker_observed_prompt_tokens_total"
	metricFallbacks        = "kvindex_picker_index_fallbacks_total"
	metricPicks            = "kvindex_picker_picks_total"
)

// wanted are the families kept from a scrape; the rest of the page is
// dropped at once.
var wanted = map[string]bool{
	metricEvents: true, metricGaps: true, metricReplays: true, metricFleetFraction: true,
	metricObservedFraction: true, metricPredictedTokens: true, metricObservedPrompt: true,
	metricFallbacks: true, metricPicks: true,
}

// Series is one sample of a metric family: its labels and its value
// (a counter's or a gauge's).
type Series struct {
	Labels map[string]string
	Value  float64
}

// Metrics is a scraped page: the series of each wanted family by name.
type Metrics map[string][]Series

// ParseMetrics reads a Prometheus text page and keeps the families top
// shows. A page that is not the text format is an error.
func ParseMetrics(r io.Reader) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parsing metrics: %w", err)
	}
	out := Metrics{}
	for name, f := range fams {
		if !wanted[name] {
			continue
		}
		for _, m := range f.GetMetric() {
			v, ok := value(m)
			if !ok {
				continue
			}
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out[name] = append(out[name], Series{Labels: labels, Value: v})
		}
	}
	return out, nil
}

// value is a counter's, gauge's or untyped sample's value.
func value(m *dto.Metric) (float64, bool) {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue(), true
	case m.Gauge != nil:
		return m.Gauge.GetValue(), true
	case m.Untyped != nil:
		return m.Untyped.GetValue(), true
	}
	return 0, false
}

// Sum adds the series of name whose labels include match; ok is false
// when there is none.
func (m Metrics) Sum(name string, match map[string]string) (sum float64, ok bool) {
	for _, s := range m[name] {
		if matches(s.Labels, match) {
			sum, ok = sum+s.Value, true
		}
	}
	return sum, ok
}

// Max is the largest value of the series of name whose labels include
// match; ok is false when there is none.
func (m Metrics) Max(name string, match map[string]string) (mx float64, ok bool) {
	for _, s := range m[name] {
		if matches(s.Labels, match) && (!ok || s.Value > mx) {
			mx, ok = s.Value, true
		}
	}
	return mx, ok
}

// Values lists the values label takes among the series of name.
func (m Metrics) Values(name, label string) []string {
	seen := map[string]bool{}
	for _, s := range m[name] {
		if v, ok := s.Labels[label]; ok {
			seen[v] = true
		}
	}
	return sortedKeys(seen)
}

func matches(labels, match map[string]string) bool {
	for k, v := range match {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// merge adds every series of other to m (the pages of several pickers
// are read as one).
func (m Metrics) merge(other Metrics) {
	for name, ss := range other {
		for _, s := range ss {
			m[name] = append(m[name], Series{Labels: maps.Clone(s.Labels), Value: s.Value})
		}
	}
}
