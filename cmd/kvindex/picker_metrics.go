package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/api/server"
	"github.com/kvindex/kvindex/picker"
	"github.com/kvindex/kvindex/picker/enginemetrics"
	"github.com/kvindex/kvindex/picker/gateway"
)

// engineMetrics feeds the picker from the engines' own /metrics (their
// queues and KV usage for the load scorer) and keeps the fleet's cached
// fraction, with what the picks predicted against what the responses
// that passed the picker said (gateway.Outcomes).
type engineMetrics struct{ sc *enginemetrics.Scraper }

func (e engineMetrics) EngineMetrics(pod string) (picker.Metrics, bool) {
	m := e.sc.Metrics(pod)
	return m, !m.ScrapedAt.IsZero()
}

func (e engineMetrics) Predicted(model string, matchedTokens int) {
	e.sc.Fleet().Predict(model, matchedTokens)
}

func (e engineMetrics) Responded(model string, body []byte) {
	u, err := enginemetrics.ParseUsage(body)
	if err != nil {
		return // no usage (not counted: says nothing of the cache) or not a completion
	}
	_ = e.sc.Fleet().Observe(model, u.PromptTokens, u.CachedTokens) // bad usage is counted there
}

// withEngineMetrics scrapes every --endpoint's http://HOST:PORT/metrics
// each interval (--scrape-interval; 0: never) for cfg's picker,
// registering the fleet metrics on reg; run keeps scraping until its
// context ends. sc is the scraper, nil when there is none.
func withEngineMetrics(interval time.Duration, cfg *gateway.Config, reg prometheus.Registerer, log *slog.Logger) (run func(context.Context), sc *enginemetrics.Scraper, err error) {
	if interval == 0 {
		return func(context.Context) {}, nil, nil
	}
	urls := make(map[string]string, len(cfg.Endpoints))
	for _, e := range cfg.Endpoints {
		urls[e.Pod] = enginemetrics.MetricsURL(e.Addr)
	}
	sc, err = enginemetrics.New(enginemetrics.Config{Interval: interval}, urls, log.With("component", "engine-metrics"))
	if err != nil {
		return nil, nil, fmt.Errorf("--scrape-interval: %w", err)
	}
	if err := reg.Register(sc.Collector()); err != nil {
		return nil, nil, err
	}
	em := engineMetrics{sc}
	cfg.Metrics, cfg.Outcomes = em, em
	return sc.Run, sc, nil
}

// fleetRelay is kvindex serve's server.FleetSource: the engines' windowed
// cached fraction for kvindex pods. The server is built before the picker
// (which asks it in-process), so the picker's scraper is handed over once
// it exists; until then, and without scraping, there are no figures.
type fleetRelay struct {
	sc atomic.Pointer[enginemetrics.Scraper]
}

func (r *fleetRelay) FleetCache() server.FleetCache {
	sc := r.sc.Load()
	if sc == nil {
		return server.FleetCache{}
	}
	sum := sc.Fleet().Summary()
	out := server.FleetCache{Window: time.Duration(sum.WindowSeconds * float64(time.Second))}
	for _, m := range sum.Models {
		out.Models = append(out.Models, server.CacheCount{Name: m.Model, Hits: m.Engines.Hits, Queries: m.Engines.Queries})
	}
	for _, p := range sc.Status() {
		out.Pods = append(out.Pods, server.CacheCount{Name: p.Pod, Hits: p.Cache.Hits, Queries: p.Cache.Queries})
	}
	return out
}
