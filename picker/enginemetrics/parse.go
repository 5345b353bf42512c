package enginemetrics

import (
	"errors"
	"fmt"
	"io"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Reading is what one /metrics page says: an engine's load, summed over
// its data-parallel ranks, and its prefix-cache counters per model.
type Reading struct {
	// Waiting and Running are vllm:num_requests_waiting and
	// vllm:num_requests_running summed over the ranks (each rank queues
	// its own requests; the pod's queue is their sum).
	Waiting, Running int
	// KVUsage is vllm:kv_cache_usage_perc averaged over the ranks, a
	// fraction in [0, 1]: ranks have pools of one size, so the mean is
	// the pod's share of blocks in use.
	KVUsage float64
	// Prefix holds the prefix-cache counters by model_name, summed over
	// the ranks.
	Prefix map[string]Counters
}

// Counters are an engine's prefix-cache counters, in tokens: Queries are
// the prompt tokens looked up, Hits those found cached.
type Counters struct {
	Queries, Hits float64
}

// Metric names, most recent first: the first one present on a page is
// read, so an engine exposing a deprecated name next to its replacement
// (vLLM 0.10 exposes both vllm:gpu_prefix_cache_* and vllm:prefix_cache_*)
// is not counted twice. prometheus_client writes a counter's family with
// the _total suffix; exporters that follow OpenMetrics names, or older
// parsers, name it without; both are read.
var (
	namesWaiting = []string{"vllm:num_requests_waiting"}
	namesRunning = []string{"vllm:num_requests_running"}
	// vllm:gpu_cache_usage_perc was replaced by vllm:kv_cache_usage_perc
	// in vLLM 0.10 and is gone from later releases.
	namesUsage = []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}
	// vllm:gpu_prefix_cache_* were V1's names before 0.10, deprecated
	// there in favour of vllm:prefix_cache_*.
	namesQueries = []string{"vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries",
		"vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries"}
	namesHits = []string{"vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits",
		"vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits"}
)

// Labels vLLM puts on its engine metrics.
const (
	labelModel = "model_name"
)

// ErrNoMetrics is returned by Parse for a page without any of vLLM's
// engine metrics: the endpoint is not a vLLM engine's /metrics, or the
// engine has not started its stat loggers.
var ErrNoMetrics = errors.New("enginemetrics: no vLLM engine metrics on the page")

// Parse reads a page in Prometheus' text exposition format. A page that
// does not parse, or a value that is negative or not finite, is an error;
// a page with none of the metrics is ErrNoMetrics.
func Parse(r io.Reader) (Reading, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Reading{}, fmt.Errorf("enginemetrics: parse: %w", err)
	}
	var rd Reading
	found := false
	if f := first(fams, namesWaiting); f != nil {
		found = true
		v, err := sum(f)
		if err != nil {
			return Reading{}, err
		}
		rd.Waiting = int(min(v, maxValue))
	}
	if f := first(fams, namesRunning); f != nil {
		found = true
		v, err := sum(f)
		if err != nil {
			return Reading{}, err
		}
		rd.Running = int(min(v, maxValue))
	}
	if f := first(fams, namesUsage); f != nil && len(f.Metric) > 0 {
		found = true
		v, err := sum(f)
		if err != nil {
			return Reading{}, err
		}
		rd.KVUsage = min(1, v/float64(len(f.Metric)))
	}
	for _, q := range []struct {
		names []string
		set   func(*Counters, float64)
	}{
		{namesQueries, func(c *Counters, v float64) { c.Queries += v }},
		{namesHits, func(c *Counters, v float64) { c.Hits += v }},
	} {
		f := first(fams, q.names)
		if f == nil {
			continue
		}
		found = true
		for _, m := range f.Metric {
			v, err := value(f, m)
			if err != nil {
				return Reading{}, err
			}
			if rd.Prefix == nil {
				rd.Prefix = map[string]Counters{}
			}
			name := labelValue(m, labelModel)
			c := rd.Prefix[name]
			q.set(&c, v)
			rd.Prefix[name] = c
		}
	}
	if !found {
		return Reading{}, ErrNoMetrics
	}
	return rd, nil
}

// first returns the first family of names present.
func first(fams map[string]*dto.MetricFamily, names []string) *dto.MetricFamily {
	for _, n := range names {
		if f, ok := fams[n]; ok {
			return f
		}
	}
	return nil
}

// sum adds up a family's samples: every model and rank.
func sum(f *dto.MetricFamily) (float64, error) {
	var s float64
	for _, m := range f.Metric {
		v, err := value(f, m)
		if err != nil {
			return 0, err
		}
		s += v
	}
	return s, nil
}

// value reads a counter, gauge or untyped sample (an exporter may type a
// counter as untyped); a negative or non-finite value is refused, as no
// metric read here can be one.
func value(f *dto.MetricFamily, m *dto.Metric) (float64, error) {
	var v float64
	switch {
	case m.Counter != nil:
		v = m.Counter.GetValue()
	case m.Gauge != nil:
		v = m.Gauge.GetValue()
	case m.Untyped != nil:
		v = m.Untyped.GetValue()
	default:
		return 0, fmt.Errorf("enginemetrics: %s is a %s, want a counter or gauge", f.GetName(), f.GetType())
	}
	if !(v >= 0 && v <= maxValue) {
		return 0, fmt.Errorf("enginemetrics: %s%s = %v, want a finite value >= 0", f.GetName(), labelString(m), v)
	}
	return v, nil
}

// maxValue bounds a sample: 2^53, past which float64 counts stop being
// exact; no engine counts that many tokens.
const maxValue = 1 << 53

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func labelString(m *dto.Metric) string {
	if len(m.Label) == 0 {
		return ""
	}
	s := "{"
	for i, l := range m.Label {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprintf("%s=%q", l.GetName(), l.GetValue())
	}
	return s + "}"
}
