package simhttp

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// The engine metrics, with vLLM's names, help texts and labels. Counters
// carry the _total suffix that vLLM's prometheus_client appends on the
// wire.
var (
	labels      = []string{"model_name", "engine"}
	descRunning = prometheus.NewDesc("vllm:num_requests_running",
		"Number of requests in model execution batches.", labels, nil)
	descWaiting = prometheus.NewDesc("vllm:num_requests_waiting",
		"Number of requests waiting to be processed.", labels, nil)
	descUsage = prometheus.NewDesc("vllm:kv_cache_usage_perc",
		"KV-cache usage. 1 means 100 percent usage.", labels, nil)
	descQueries = prometheus.NewDesc("vllm:prefix_cache_queries_total",
		"Prefix cache queries, in terms of number of queried tokens.", labels, nil)
	descHits = prometheus.NewDesc("vllm:prefix_cache_hits_total",
		"Prefix cache hits, in terms of number of cached tokens.", labels, nil)
)

// collector reads the engine metrics at scrape time from the ranks: the
// prefix-cache counters are the engines' own (every request they
// processed, the workload's included), the rest the front's scheduler
// state.
type collector struct{ s *Server }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRunning, descWaiting, descUsage, descQueries, descHits} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	for i, rk := range c.s.ranks {
		lv := []string{c.s.cfg.Model, strconv.Itoa(i)}
		ch <- prometheus.MustNewConstMetric(descRunning, prometheus.GaugeValue, float64(rk.running.Load()), lv...)
		ch <- prometheus.MustNewConstMetric(descWaiting, prometheus.GaugeValue, float64(rk.waiting.Load()), lv...)
		ch <- prometheus.MustNewConstMetric(descUsage, prometheus.GaugeValue, min(1, float64(rk.held.Load())/float64(rk.capacity)), lv...)
		ch <- prometheus.MustNewConstMetric(descQueries, prometheus.CounterValue, float64(rk.e.Queries()), lv...)
		ch <- prometheus.MustNewConstMetric(descHits, prometheus.CounterValue, float64(rk.e.Hits()), lv...)
	}
}
