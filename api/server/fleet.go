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
	// FleetCache returns the window's figures: the whole fleet first
	// (Model ""), then each model. Nil when there are none yet.
	FleetCache() []FleetCache
}

// FleetCache is one model's (Model "": every model's) prefix-cache
// lookups over the last Window, in prompt tokens, as the engines count
// them.
type FleetCache struct {
	Model         string
	Hits, Queries float64
	Window        time.Duration
}

// fleetCache converts the source's figures for ListPods, keeping only
// model's when one is asked for.
func fleetCache(src FleetSource, model string) []*kvindexv1.FleetCache {
	if src == nil {
		return nil
	}
	var out []*kvindexv1.FleetCache
	for _, f := range src.FleetCache() {
		if model != "" && f.Model != model {
			continue
		}
		fc := &kvindexv1.FleetCache{
			Model: f.Model, HitTokens: f.Hits, QueryTokens: f.Queries, WindowSeconds: f.Window.Seconds(),
		}
		if f.Queries > 0 {
			// No traffic is not a fraction of 0; a scrape landing between
			// the two counters' updates could make hits exceed queries.
			v := min(1, max(f.Hits, 0)/f.Queries)
			fc.Fraction = &v
		}
		out = append(out, fc)
	}
	return out
}
