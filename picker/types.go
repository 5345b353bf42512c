package picker

import (
	"encoding/json"
	"fmt"
	"math"
	"time"
)

// Priority says whether someone waits on a turn.
type Priority uint8

const (
	// Interactive is a turn a person waits on (the zero value).
	Interactive Priority = iota
	// Background is a turn nobody waits on right away: an agent's tool
	// loop, a batch, a sub-agent fan-out.
	Background
)

func (p Priority) String() string {
	if p == Background {
		return "background"
	}
	return "interactive"
}

// Request is what the picker knows of one request.
type Request struct {
	// Model is the model the request names; carried for the caller's
	// bookkeeping (the caller queries the index with it).
	Model string
	// Keys are the index's block keys of the prompt's full blocks, block
	// 0 first. They feed speculative entries; without them only the
	// candidates' Prefix inputs count.
	Keys []uint64
	// Tokens is the prompt's length in tokens; 0 means len(Keys) x
	// Config.BlockSize. The matched fraction is over Tokens, so a partial
	// last block counts as not cached, as in the engine.
	Tokens int
	// Session identifies the conversation (a session header, or the
	// Responses API's previous_response_id resolved by the caller); ""
	// for none.
	Session  string
	Priority Priority
	// Subset, when not empty, is the gateway's subset hint: only
	// candidates whose Endpoint or Pod is listed may be picked.
	Subset []string
	// TieBreak is a hash of whatever else tells this request from others
	// (the gateway hashes the request body): exact ties go by a hash of
	// it, Keys, Tokens, Session and Model (Scorer.Pick), so requests that
	// differ only in text the picker does not see (a prompt sent as
	// text, without Keys) still spread over the tied pods. 0 is a value
	// like any other.
	TieBreak uint64
}

// Candidate is one pod the request may go to, with its load signals and
// what the index says it holds of the prompt.
type Candidate struct {
	// Pod is the pod's name as the index knows it; it keys speculative
	// entries and sessions, so it must not be empty.
	Pod string
	// Endpoint is the host:port requests go to.
	Endpoint string
	// InFlight counts requests the picker sent to the pod and has not
	// seen complete; InFlightInteractive counts the interactive ones among
	// them.
	InFlight            int
	InFlightInteractive int
	// Metrics are the engine's own load metrics, as last scraped.
	Metrics Metrics
	// Prefix is the index's answer for this pod.
	Prefix Prefix
}

// Metrics are an engine's load metrics from its Prometheus endpoint.
type Metrics struct {
	// Waiting is vllm:num_requests_waiting: requests queued in the engine,
	// from every picker.
	Waiting int
	// KVUsage is vllm:kv_cache_usage_perc, a fraction in [0, 1].
	KVUsage float64
	// ScrapedAt is when they were read; the zero time means never, and
	// metrics older than Config.MetricsMaxAge are ignored.
	ScrapedAt time.Time
}

// Prefix is the index's answer for one pod: how many of the prompt's
// leading blocks it holds, contiguous from block 0, by tier, and how far
// the index vouches for them.
type Prefix struct {
	GPU, CPU, Disk int
	Health         Health
}

// Blocks returns the matched blocks, all tiers together.
func (p Prefix) Blocks() int { return max(p.GPU, 0) + max(p.CPU, 0) + max(p.Disk, 0) }

// Health is how far the index vouches for an engine's entries: the
// engine health states of kvindex's API. Only HealthOK is exact; the
// others discount the pod's matched blocks by Config.Health.
type Health uint8

// Health states. HealthOK is the zero value.
const (
	HealthOK Health = iota
	HealthPartial
	HealthRestored
	HealthUnconfirmed
	HealthDegraded
	HealthDisconnected
	HealthUnknown
)

var healthNames = [...]string{"ok", "partial", "restored", "unconfirmed", "degraded", "disconnected", "unknown"}

func (h Health) String() string {
	if int(h) < len(healthNames) {
		return healthNames[h]
	}
	return "unknown"
}

// ParseHealth reads a health state as kvindex's JSON API writes it ("ok",
// "degraded", ...).
func ParseHealth(s string) (Health, error) {
	for i, n := range healthNames {
		if s == n {
			return Health(i), nil
		}
	}
	return HealthUnknown, fmt.Errorf("picker: unknown health %q", s)
}

// weight is the health's discount.
func (c *Config) healthWeight(h Health) float64 {
	switch h {
	case HealthOK:
		return 1
	case HealthPartial:
		return c.Health.Partial
	case HealthRestored:
		return c.Health.Restored
	case HealthUnconfirmed:
		return c.Health.Unconfirmed
	case HealthDegraded:
		return c.Health.Degraded
	case HealthDisconnected:
		return c.Health.Disconnected
	}
	return c.Health.Unknown
}

// Decision is a pick: the chosen pod and every eligible candidate's
// scores, best first (the chosen pod first; the rest can serve as the
// ordered fallback list the Endpoint Picker Protocol allows). Its JSON
// form is the answer of POST /v1/pick.
type Decision struct {
	Endpoint string `json:"endpoint"`
	Pod      string `json:"pod"`
	// IndexSeq is the index sequence of the index answer the candidates'
	// Prefix inputs came from (kvindex's index_seq, which says what it
	// means). The scorer does not set it: its caller, which asked the
	// index, does. 0 when the index is not fed from a stream, or when
	// the request was routed without the index.
	IndexSeq uint64 `json:"index_seq"`
	// Fallback says why the candidates were scored without the index's
	// answer (by load and session only); "" when the index answered or
	// was not asked (a request without a prompt). Set by the caller that
	// asked the index, as IndexSeq is.
	Fallback Fallback `json:"fallback,omitempty"`
	Scores   []Score  `json:"scores"`
}

// Fallback is why a pick was made without the index's answer. The set
// below is every reason there is: the gateway's answers, its metric's
// reason label and its log all use these values.
type Fallback string

// The fallback reasons.
const (
	// FallbackTimeout: the index did not answer within the query's
	// deadline.
	FallbackTimeout Fallback = "timeout"
	// FallbackIndexUnreachable: there is no working connection to the
	// index (not yet up, lost, or refusing connections).
	FallbackIndexUnreachable Fallback = "index_unreachable"
	// FallbackUnknownModel: the index follows no model of the request's
	// name.
	FallbackUnknownModel Fallback = "unknown_model"
	// FallbackTokenizer: the index could not tokenize the prompt (it has
	// no tokenizer for it, or its tokenizer failed or refused it).
	FallbackTokenizer Fallback = "tokenizer"
	// FallbackOverloaded: the index shed the query (the prompts it
	// holds at once are at their bound).
	FallbackOverloaded Fallback = "overloaded"
	// FallbackError: any other failure of the query.
	FallbackError Fallback = "error"
)

// Fallbacks lists every fallback reason.
var Fallbacks = []Fallback{FallbackTimeout, FallbackIndexUnreachable, FallbackUnknownModel, FallbackTokenizer, FallbackOverloaded, FallbackError}

// Score is one candidate's scores. Each scorer's term is in [0, 1],
// higher is better, except Load, which goes below 0 past LoadScale
// requests ahead; Total is their weighted sum (Config.Weights).
type Score struct {
	Pod string `json:"pod"`
	// Prefix is the cached fraction of the prompt the pod is expected to
	// serve: matched tokens over prompt tokens, each block weighted by its
	// tier and the engine's health, or the pod's speculative entries
	// (counted as GPU blocks), whichever is more.
	Prefix float64 `json:"prefix"`
	// Load is 1 - pressure/LoadScale, where pressure, in requests ahead,
	// is the larger of InFlight and the engine's waiting count (when
	// fresh), plus the KV-cache penalty.
	Load float64 `json:"load"`
	// Session is 1 on the session's last pod unless its pressure reached
	// SessionOverload.
	Session float64 `json:"session,omitempty"`
	// Hot is 1 on the unsaturated pods when every pod holding the prompt's
	// prefix is saturated (the hot-prefix guard).
	Hot float64 `json:"hot,omitempty"`
	// Priority is, for a background request, 1 on pods with no
	// interactive request in flight.
	Priority float64 `json:"priority,omitempty"`
	Total    float64 `json:"total"`
	// MatchedTokens is the prefix the pod is expected to serve from cache,
	// in tokens, before weighting: what the decision predicts.
	MatchedTokens int `json:"matched_tokens"`
}

// scoreDecimals is how many decimals a score keeps in JSON: enough to
// tell candidates apart, few enough to read (2/3 is 0.6667, not
// 0.6666666666666666). Ties are broken on the unrounded values.
const scoreDecimals = 4

// MarshalJSON writes the score with its components rounded to
// scoreDecimals.
func (s Score) MarshalJSON() ([]byte, error) {
	type plain Score // without this method
	r := plain(s)
	for _, f := range []*float64{&r.Prefix, &r.Load, &r.Session, &r.Hot, &r.Priority, &r.Total} {
		*f = roundScore(*f)
	}
	return json.Marshal(r)
}

func roundScore(x float64) float64 {
	scale := math.Pow10(scoreDecimals)
	return math.Round(x*scale)/scale + 0 // + 0: -0 reads 0
}
