package enginemetrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// The exported metrics. The fraction gauges carry model="" (Overall) for
// the whole fleet; the counters do not, as sum() over models gives it.
var (
	descFraction = prometheus.NewDesc("kvindex_fleet_cached_fraction",
		"Share of prompt tokens the engines served from their prefix caches over the window, from their own counters (vllm:prefix_cache_hits / vllm:prefix_cache_queries); model=\"\" is the whole fleet. Absent while no token was queried in the window.",
		[]string{"model"}, nil)
	descObservedFraction = prometheus.NewDesc("kvindex_picker_observed_cached_fraction",
		"Share of prompt tokens served from cache over the window, from the usage of responses that passed through the picker; model=\"\" is every model. Absent while none did.",
		[]string{"model"}, nil)
	descWaiting = prometheus.NewDesc("kvindex_engine_requests_waiting",
		"The engine's vllm:num_requests_waiting, summed over its data-parallel ranks, as last scraped; absent once the sample is stale.",
		[]string{"pod"}, nil)
	descUsage = prometheus.NewDesc("kvindex_engine_kv_cache_usage",
		"The engine's vllm:kv_cache_usage_perc (a fraction), averaged over its data-parallel ranks, as last scraped; absent once the sample is stale.",
		[]string{"pod"}, nil)
	descScrapeErrors = prometheus.NewDesc("kvindex_engine_scrape_errors_total",
		"Failed scrapes of the engine's metrics page: unreachable, timed out, not 200, too large or not parsable.",
		[]string{"pod"}, nil)
	descPredicted = prometheus.NewDesc("kvindex_picker_predicted_cached_tokens_total",
		"Prompt tokens the picker's decisions expected the chosen pods to serve from cache.",
		[]string{"model"}, nil)
	descObserved = prometheus.NewDesc("kvindex_picker_observed_cached_tokens_total",
		"Prompt tokens the responses that passed through the picker report as cached (usage.prompt_tokens_details.cached_tokens).",
		[]string{"model"}, nil)
	descObservedPrompt = prometheus.NewDesc("kvindex_picker_observed_prompt_tokens_total",
		"Prompt tokens of the responses that passed through the picker (usage.prompt_tokens).",
		[]string{"model"}, nil)
	descBadUsage = prometheus.NewDesc("kvindex_picker_bad_usage_total",
		"Response usages refused: negative counts, or more cached than prompt tokens.",
		nil, nil)
)

// Collector returns a prometheus.Collector of the Scraper's and its
// Fleet's figures, read at collection time.
func (s *Scraper) Collector() prometheus.Collector { return collector{s} }

type collector struct{ s *Scraper }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descFraction, descObservedFraction, descWaiting, descUsage,
		descScrapeErrors, descPredicted, descObserved, descObservedPrompt, descBadUsage} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	for _, sm := range c.s.Samples() {
		ch <- prometheus.MustNewConstMetric(descWaiting, prometheus.GaugeValue, float64(sm.Waiting), sm.Pod)
		ch <- prometheus.MustNewConstMetric(descUsage, prometheus.GaugeValue, sm.KVUsage, sm.Pod)
	}
	for _, st := range c.s.Status() {
		ch <- prometheus.MustNewConstMetric(descScrapeErrors, prometheus.CounterValue, float64(st.Errors), st.Pod)
	}
	f := c.s.fleet
	for _, m := range f.Summary().Models {
		if v, ok := m.Engines.Value(); ok {
			ch <- prometheus.MustNewConstMetric(descFraction, prometheus.GaugeValue, v, m.Model)
		}
		if v, ok := m.Observed.Value(); ok {
			ch <- prometheus.MustNewConstMetric(descObservedFraction, prometheus.GaugeValue, v, m.Model)
		}
		if m.Model == Overall {
			continue
		}
		ch <- prometheus.MustNewConstMetric(descPredicted, prometheus.CounterValue, m.Predicted, m.Model)
		ch <- prometheus.MustNewConstMetric(descObserved, prometheus.CounterValue, m.ObservedCached, m.Model)
		ch <- prometheus.MustNewConstMetric(descObservedPrompt, prometheus.CounterValue, m.ObservedPrompt, m.Model)
	}
	ch <- prometheus.MustNewConstMetric(descBadUsage, prometheus.CounterValue, float64(f.BadUsage()))
}
