package picker

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Weights weigh the scorers in a candidate's total:
//
//	total = Prefix*prefix + Load*load + Session*session + Hot*hot + Priority*priority
//
// Each term is described on Score. Only the ratios matter: scaling every
// weight by the same factor picks the same pods.
type Weights struct {
	// Prefix weighs the matched fraction of the prompt.
	Prefix float64 `yaml:"prefix"`
	// Load weighs the load score. With the defaults (0.7 and 0.3, and
	// LoadScale 1) one request ahead weighs as much as 3/7 of the prompt
	// being cached: a conversation whose pod holds 85% more of its prompt
	// than any other pod stays there unless that pod has two more requests
	// ahead.
	Load float64 `yaml:"load"`
	// Session weighs stickiness to the session's last pod. It matters
	// where the prompt says little about the cache: the Responses API's
	// previous_response_id resends no history, and a picker without
	// token ids sees no prefix at all. Small by default (a sixth of a
	// request ahead, 1/14 of the prompt), so that it settles near-ties
	// and never holds a conversation on a busy pod: where the index sees
	// the prefix, the prefix term already says what staying is worth.
	Session float64 `yaml:"session"`
	// Hot weighs the hot-prefix guard: by default above Prefix, so that
	// a spill beats any prefix advantage.
	Hot float64 `yaml:"hot"`
	// Priority weighs steering background turns away from pods busy with
	// interactive ones. Priority/Prefix is the largest share of the prompt
	// a background turn gives up to avoid such a pod: 1/7 by default.
	Priority float64 `yaml:"priority"`
}

// TierWeights value a matched block by where the engine keeps it: a block
// in host memory or on disk still has to be copied back to the GPU, which
// costs less than computing it but more than nothing.
type TierWeights struct {
	GPU  float64 `yaml:"gpu"`
	CPU  float64 `yaml:"cpu"`
	Disk float64 `yaml:"disk"`
}

// HealthWeights discount an engine's matched blocks by how far the index
// vouches for them (see Health). OK is always exact (weight 1).
type HealthWeights struct {
	// Partial: the memory budget evicted some of the engine's entries;
	// those left are exact, so a match is a lower bound of the engine's
	// true prefix.
	Partial float64 `yaml:"partial"`
	// Restored: entries from an earlier kvindex's snapshot, not yet
	// confirmed; usually still right.
	Restored float64 `yaml:"restored"`
	// Unconfirmed: the start of the engine's history is unknown, so
	// entries it stored before kvindex joined are missing and the ones
	// seen may since have been evicted unnoticed.
	Unconfirmed float64 `yaml:"unconfirmed"`
	// Degraded: batches were lost mid-stream: any entry may be stale.
	Degraded float64 `yaml:"degraded"`
	// Disconnected: kvindex cannot hear the engine, which may have
	// restarted with an empty cache.
	Disconnected float64 `yaml:"disconnected"`
	// Unknown: the engine is not followed; any match is hearsay.
	Unknown float64 `yaml:"unknown"`
}

// Config is every knob of a Scorer. Start from DefaultConfig; New
// validates it. Field names carry yaml tags so that a configuration file
// can hold one.
type Config struct {
	Weights Weights `yaml:"weights"`
	// BlockSize is the index's block size in tokens: a matched block
	// covers BlockSize tokens of the prompt.
	BlockSize int         `yaml:"block_size"`
	Tiers     TierWeights `yaml:"tiers"`
	// Health discounts the matches of engines whose health is not OK.
	Health HealthWeights `yaml:"health"`

	// LoadScale is how many requests ahead take the load score from 1
	// (idle) to 0; past it the score goes negative, so that pods beyond
	// it still rank by how far beyond they are.
	LoadScale float64 `yaml:"load_scale"`
	// MetricsMaxAge is how old scraped engine metrics may be and still
	// count; older ones (a scrape that failed) are ignored and the load
	// falls back to the picker's own in-flight count.
	MetricsMaxAge time.Duration `yaml:"metrics_max_age"`
	// KVThreshold and KVPenalty: above KVThreshold of KV-cache usage a
	// new prompt evicts cached prefixes or waits for blocks; the pressure
	// grows linearly to KVPenalty requests ahead at a full cache.
	KVThreshold float64 `yaml:"kv_threshold"`
	KVPenalty   float64 `yaml:"kv_penalty"`

	// SessionOverload is the pressure (requests ahead) at which a
	// session's last pod stops attracting it.
	SessionOverload float64 `yaml:"session_overload"`
	// Sessions bounds the remembered sessions (least recently used
	// forgotten first).
	Sessions int `yaml:"sessions"`

	// HotHolder is the prefix score from which a pod counts as holding a
	// request's prefix for the hot-prefix guard.
	HotHolder float64 `yaml:"hot_holder"`
	// HotSaturation is the pressure (requests ahead) at which a holder is
	// saturated. When every holder is, the guard favours the candidates
	// below it.
	HotSaturation float64 `yaml:"hot_saturation"`

	// SpeculativeTTL is how long a pick's blocks count as held by the
	// chosen pod before the engine's own events confirm it; 0 turns
	// speculative entries off.
	SpeculativeTTL time.Duration `yaml:"speculative_ttl"`
	// SpeculativeBlocks bounds the blocks recorded across all live
	// speculative entries; the oldest go first.
	SpeculativeBlocks int `yaml:"speculative_blocks"`

	// Seed seeds the tie-break: the same seed and inputs give the same
	// picks, whatever the scorer picked before (see Scorer.Pick).
	Seed uint64 `yaml:"seed"`
}

// DefaultConfig returns the defaults; every default is written here only.
func DefaultConfig() Config {
	return Config{
		Weights:   Weights{Prefix: 0.7, Load: 0.3, Session: 0.05, Hot: 1, Priority: 0.1},
		BlockSize: 16,
		Tiers:     TierWeights{GPU: 1, CPU: 0.5, Disk: 0.25},
		Health: HealthWeights{
			Partial: 1, Restored: 0.9, Unconfirmed: 0.5, Degraded: 0.5, Disconnected: 0.25, Unknown: 0,
		},
		LoadScale:         1,
		MetricsMaxAge:     5 * time.Second,
		KVThreshold:       0.8,
		KVPenalty:         2,
		SessionOverload:   4,
		Sessions:          65536,
		HotHolder:         0.5,
		HotSaturation:     4,
		SpeculativeTTL:    2 * time.Second,
		SpeculativeBlocks: 1 << 20,
		Seed:              1,
	}
}

// ErrConfig is matched (errors.Is) by every error Validate returns.
var ErrConfig = errors.New("picker: bad configuration")

// Validate checks every field; the error names the field and the value.
func (c *Config) Validate() error {
	type rule struct {
		name   string
		v      float64
		lo, hi float64
		loOpen bool // v must be > lo rather than >= lo
	}
	w, t, h := c.Weights, c.Tiers, c.Health
	rules := []rule{
		{"weights.prefix", w.Prefix, 0, 1000, false},
		{"weights.load", w.Load, 0, 1000, false},
		{"weights.session", w.Session, 0, 1000, false},
		{"weights.hot", w.Hot, 0, 1000, false},
		{"weights.priority", w.Priority, 0, 1000, false},
		{"block_size", float64(c.BlockSize), 1, 1 << 20, false},
		{"tiers.gpu", t.GPU, 0, 1, false},
		{"tiers.cpu", t.CPU, 0, 1, false},
		{"tiers.disk", t.Disk, 0, 1, false},
		{"health.partial", h.Partial, 0, 1, false},
		{"health.restored", h.Restored, 0, 1, false},
		{"health.unconfirmed", h.Unconfirmed, 0, 1, false},
		{"health.degraded", h.Degraded, 0, 1, false},
		{"health.disconnected", h.Disconnected, 0, 1, false},
		{"health.unknown", h.Unknown, 0, 1, false},
		{"load_scale", c.LoadScale, 0, 1e6, true},
		{"metrics_max_age", c.MetricsMaxAge.Seconds(), 0, math.MaxFloat64, false},
		{"kv_threshold", c.KVThreshold, 0, 1, false},
		{"kv_penalty", c.KVPenalty, 0, 1e6, false},
		{"session_overload", c.SessionOverload, 0, 1e6, true},
		{"sessions", float64(c.Sessions), 1, 1 << 30, false},
		{"hot_holder", c.HotHolder, 0, 1, true},
		{"hot_saturation", c.HotSaturation, 0, 1e6, true},
		{"speculative_ttl", c.SpeculativeTTL.Seconds(), 0, math.MaxFloat64, false},
		{"speculative_blocks", float64(c.SpeculativeBlocks), 1, 1 << 30, false},
	}
	for _, r := range rules {
		switch {
		case math.IsNaN(r.v), r.v > r.hi, r.loOpen && r.v <= r.lo, !r.loOpen && r.v < r.lo:
			op := ">="
			if r.loOpen {
				op = ">"
			}
			return fmt.Errorf("%w: %s must be %s %g and <= %g (got %g)", ErrConfig, r.name, op, r.lo, r.hi, r.v)
		}
	}
	if w == (Weights{}) {
		return fmt.Errorf("%w: every weight is 0", ErrConfig)
	}
	if c.KVThreshold >= 1 && c.KVPenalty > 0 {
		return fmt.Errorf("%w: kv_threshold must be < 1 when kv_penalty is set (got %g)", ErrConfig, c.KVThreshold)
	}
	return nil
}
