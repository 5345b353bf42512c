package server

import (
	"time"

	kvindexv1 "github.com/kvindex/kvindex/api/kvindexv1"
)

// FleetSource gives ListPods the fleet's cached-prefix fraction. The
// endpoint picker's engine-metrics scraper (package
// picker/enginemetrics) computes it; the server knows it only through
// this interface, so that it does not depend on the picker.
type FleetSource interface {
	// FleetCache returns the window's figures; zero when there are none
	// yet.
	FleetCache() FleetCache
}

// FleetCache is the engines' prefix-cache lookups over the last Window,
// in prompt tokens, as the engines count them.
type FleetCache struct {
	Window time.Duration
	// Models: the whole fleet first (Name ""), then each model.
	Models []CacheCount
	// Pods: each scraped pod's own, every model together.
	Pods []CacheCount
}

// CacheCount is one model's or pod's prompt tokens looked up in the
// prefix cache (Queries) and found there (Hits).
type CacheCount struct {
	Name          string
	Hits, Queries float64
}

// fraction is Hits/Queries, nil without queries: no traffic is not a
// fraction of 0. A scrape landing between the updates of an engine's two
// counters could make hits exceed queries; the fraction stops at 1.
func (c CacheCount) fraction() *float64 {
	if c.Queries <= 0 {
		return nil
	}
	v := min(1, max(c.Hits, 0)/c.Queries)
	return &v
}

// fleetCache fills ListPods' fleet figures from src. With a model asked
// for, only that model's figures and the pods of the answer are kept.
func fleetCache(out *kvindexv1.ListPodsResponse, src FleetSource, model string) {
	if src == nil {
		return
	}
	fc := src.FleetCache()
	window := fc.Window.Seconds()
	for _, c := range fc.Models {
		if model != "" && c.Name != model {
			continue
		}
		out.Fleet = append(out.Fleet, &kvindexv1.FleetCache{
			Model: c.Name, Fraction: c.fraction(), HitTokens: c.Hits, QueryTokens: c.Queries, WindowSeconds: window,
		})
	}
	listed := make(map[string]bool, len(out.Pods))
	for _, p := range out.Pods {
		listed[p.GetPod()] = true
	}
	for _, c := range fc.Pods {
		if model != "" && !listed[c.Name] {
			continue
		}
		out.PodCache = append(out.PodCache, &kvindexv1.PodCache{
			Pod: c.Name, Fraction: c.fraction(), HitTokens: c.Hits, QueryTokens: c.Queries, WindowSeconds: window,
		})
	}
}
