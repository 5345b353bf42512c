package gateway

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/picker"
)

type metrics struct {
	picks        *prometheus.CounterVec
	fallbacks    *prometheus.CounterVec
	bad          *prometheus.CounterVec
	warmups      *prometheus.CounterVec
	indexSeconds prometheus.Histogram
	queueSeconds *prometheus.HistogramVec
	queries      *prometheus.CounterVec
	hashConfig   *prometheus.CounterVec
	hashMemo     *prometheus.CounterVec
	hashBlocks   *prometheus.CounterVec
}

// newMetrics registers the picker's metrics on reg (none if nil);
// bodyBytes reads the request body bytes buffered now.
func newMetrics(reg prometheus.Registerer, bodyBytes func() int64) (*metrics, error) {
	m := &metrics{
		picks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_picker_picks_total",
			Help: "Routing decisions by result: ok, no_endpoint (answered 503), unknown_model (answered 404: the index does not know the model; always on /v1/pick, on ext_proc with --unknown-model reject), error.",
		}, []string{"result"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_picker_index_fallbacks_total",
			Help: "Requests routed without the index's answer (load and session only), by reason: " + fallbackReasons() + ".",
		}, []string{"reason"}),
		bad: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_picker_bad_requests_total",
			Help: "Requests refused before routing, by reason: body (not an inference request the picker reads), too_large, busy (the bodies buffered at once would pass their bound), read_timeout (an HTTP body not sent within the read deadline), protocol (an ext_proc stream out of order).",
		}, []string{"reason"}),
		warmups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_picker_index_warmups_total",
			Help: "Warm-ups of the remote index's connection (at start and after each reconnect), by result: ok, error.",
		}, []string{"result"}),
		indexSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvindex_picker_index_seconds",
			Help:    "Time to get the index's answer for a request, failures and timeouts included.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 14),
		}),
		queueSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvindex_picker_queue_seconds",
			Help:    "Time a request waited for its turn, by turn: body (a request's turn to read its body, over ext_proc or /v1/pick, until its answer has gone: as many at once as cores), cpu (its turn to render, tokenize and hash: one fewer than the cores). Turns keep the index queries' round trips from queueing behind the work of many requests at once.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 14),
		}, []string{"turn"}),
		queries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_picker_index_queries_total",
			Help: "Queries of the index by what the prompt was sent as: hashes (block keys the picker computed), tokens (ids), text, messages.",
		}, []string{"input"}),
		hashConfig: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_picker_hash_config_total",
			Help: "Learning the index's hashing (at each warm-up) and checks of it, by result: ok (the picker hashes prompts itself), unknown (an index that does not say: token ids are sent), mismatch (the picker would hash differently, or the index refused its hashes: logged as an error, token ids are sent), error.",
		}, []string{"result"}),
		hashMemo: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_picker_hash_memo_total",
			Help: "Prompts hashed by the picker, by whether the chain memo knew a prefix of them: hit, miss.",
		}, []string{"result"}),
		hashBlocks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_picker_hash_blocks_total",
			Help: "Block keys of prompts the picker hashed, by where they came from: memo (known from an earlier prompt), hashed.",
		}, []string{"how"}),
	}
	for _, f := range picker.Fallbacks {
		m.fallbacks.WithLabelValues(string(f)) // every reason listed, at 0 until it happens
	}
	bodies := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvindex_picker_body_bytes_in_flight",
		Help: "Bytes of request bodies buffered now, across ext_proc streams and /v1/pick requests (bounded; beyond, requests are refused as busy).",
	}, func() float64 { return float64(bodyBytes()) })
	if reg != nil {
		for _, c := range []prometheus.Collector{m.picks, m.fallbacks, m.bad, m.warmups, m.indexSeconds, m.queueSeconds, m.queries, m.hashConfig, m.hashMemo, m.hashBlocks, bodies} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// fallbackReasons lists the reasons, for the metric's help.
func fallbackReasons() string {
	names := make([]string, len(picker.Fallbacks))
	for i, f := range picker.Fallbacks {
		names[i] = string(f)
	}
	return strings.Join(names, ", ")
}
