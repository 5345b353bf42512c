package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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
// context ends.
func withEngineMetrics(interval time.Duration, cfg *gateway.Config, reg prometheus.Registerer, log *slog.Logger) (run func(context.Context), err error) {
	if interval == 0 {
		return func(context.Context) {}, nil
	}
	urls := make(map[string]string, len(cfg.Endpoints))
	for _, e := range cfg.Endpoints {
		urls[e.Pod] = enginemetrics.MetricsURL(e.Addr)
	}
	sc, err := enginemetrics.New(enginemetrics.Config{Interval: interval}, urls, log.With("component", "engine-metrics"))
	if err != nil {
		return nil, fmt.Errorf("--scrape-interval: %w", err)
	}
	if err := reg.Register(sc.Collector()); err != nil {
		return nil, err
	}
	em := engineMetrics{sc}
	cfg.Metrics, cfg.Outcomes = em, em
	return sc.Run, nil
}
