package client

import (
	"strconv"
	"time"

	"github.com/kvindex/kvindex/api/kvindexv1"
)

// The JSON forms of the API's answers, shared by the server's HTTP API
// and the CLI's --json output. They live with the client so that a
// program printing answers needs neither the server nor its
// dependencies; the server imports them from here.

// Token sources: where the token ids of an answer came from (the
// token_source field of LongestPrefix and Lookup answers).
const (
	SourceCaller = "caller" // token ids sent by the caller
	SourceHashes = "hashes" // block hashes sent by the caller
	SourceEngine = "engine" // the engine's /tokenize
	SourceLocal  = "local"  // a local tokenizer.json
)

// LongestPrefixJSON is a LongestPrefix answer.
type LongestPrefixJSON struct {
	BlocksTotal  uint32 `json:"blocks_total"`
	BlockSize    uint32 `json:"block_size"`
	PromptTokens uint32 `json:"prompt_tokens"`
	TokenSource  string `json:"token_source"`
	// IndexSeq is the index sequence the answer reflects; 0 unless the
	// index is fed from a NATS stream (see api/server's Config.IndexSeq).
	IndexSeq uint64         `json:"index_seq"`
	Pods     []PodMatchJSON `json:"pods"`
}

// PodMatchJSON is one engine's cached prefix.
type PodMatchJSON struct {
	Pod           string            `json:"pod"`
	DPRank        uint32            `json:"dp_rank"`
	MatchedBlocks uint32            `json:"matched_blocks"`
	MatchedTokens uint32            `json:"matched_tokens"`
	Tiers         map[string]uint32 `json:"tiers"`
	HashCheck     string            `json:"hash_check"`
	Health        string            `json:"health"`
}

// LongestPrefixJSONOf converts a response; pods keep its order (matched
// blocks descending).
func LongestPrefixJSONOf(r *kvindexv1.LongestPrefixResponse) LongestPrefixJSON {
	out := LongestPrefixJSON{
		BlocksTotal:  r.GetBlocksTotal(),
		BlockSize:    r.GetBlockSize(),
		PromptTokens: r.GetPromptTokens(),
		TokenSource:  r.GetTokenSource(),
		IndexSeq:     r.GetIndexSeq(),
		Pods:         make([]PodMatchJSON, len(r.GetPods())),
	}
	for i, p := range r.GetPods() {
		tiers := make(map[string]uint32, len(p.GetTiers()))
		for k, v := range p.GetTiers() {
			tiers[k] = v
		}
		out.Pods[i] = PodMatchJSON{
			Pod: p.GetPod(), DPRank: p.GetDpRank(),
			MatchedBlocks: p.GetMatchedBlocks(), MatchedTokens: p.GetMatchedTokens(),
			Tiers: tiers, HashCheck: HashCheckName(p.GetHashCheck()), Health: HealthName(p.GetHealth()),
		}
	}
	return out
}

// LookupJSON is a Lookup answer.
type LookupJSON struct {
	BlockSize    uint32      `json:"block_size"`
	PromptTokens uint32      `json:"prompt_tokens"`
	TokenSource  string      `json:"token_source"`
	Blocks       []BlockJSON `json:"blocks"`
}

// BlockJSON is one block of a Lookup. Hash is the 64-bit block key as
// engines report it in their events (exact in the JSON text; parse it as
// an unsigned 64-bit integer, not a double).
type BlockJSON struct {
	Index   uint32       `json:"index"`
	Hash    uint64       `json:"hash"`
	Holders []HolderJSON `json:"holders"`
}

// HolderJSON is one engine's copy of a block.
type HolderJSON struct {
	Pod      string `json:"pod"`
	DPRank   uint32 `json:"dp_rank"`
	Medium   string `json:"medium"`
	GroupIdx uint32 `json:"group_idx"`
	Refs     uint32 `json:"refs"`
}

// LookupJSONOf converts a response.
func LookupJSONOf(r *kvindexv1.LookupResponse) LookupJSON {
	out := LookupJSON{
		BlockSize: r.GetBlockSize(), PromptTokens: r.GetPromptTokens(), TokenSource: r.GetTokenSource(),
		Blocks: make([]BlockJSON, len(r.GetBlocks())),
	}
	for i, b := range r.GetBlocks() {
		bj := BlockJSON{Index: b.GetIndex(), Hash: b.GetHash(), Holders: make([]HolderJSON, len(b.GetHolders()))}
		for j, h := range b.GetHolders() {
			bj.Holders[j] = HolderJSON{Pod: h.GetPod(), DPRank: h.GetDpRank(), Medium: h.GetMedium(), GroupIdx: h.GetGroupIdx(), Refs: h.GetRefs()}
		}
		out.Blocks[i] = bj
	}
	return out
}

// PodsJSON is a ListPods answer. Fleet is absent when the server does
// not scrape the engines (no picker).
type PodsJSON struct {
	// IndexSeq is the index sequence the answer reflects, as in
	// LongestPrefixJSON.
	IndexSeq uint64           `json:"index_seq"`
	Pods     []PodInfoJSON    `json:"pods"`
	Fleet    []FleetCacheJSON `json:"fleet,omitempty"`
	PodCache []PodCacheJSON   `json:"pod_cache,omitempty"`
	// TokenizerChecks compare the server's local tokenizer with the
	// engines' /tokenize, per prompt form; none when it has no local
	// tokenizer.
	TokenizerChecks []TokenizerCheckJSON `json:"tokenizer_checks,omitempty"`
}

// TokenizerCheckJSON is one prompt form's comparison of the local
// tokenizer with an engine's /tokenize; see kvindex.v1.TokenizerCheck.
type TokenizerCheckJSON struct {
	Form      string `json:"form"`
	Verdict   string `json:"verdict"`
	Disagrees bool   `json:"disagrees"`
	Detail    string `json:"detail,omitempty"`
}

// PodCacheJSON is one engine's own cached-prefix fraction over the
// window; see kvindex.v1.PodCache. Fraction is null while the window saw
// no query.
type PodCacheJSON struct {
	Pod           string   `json:"pod"`
	Fraction      *float64 `json:"fraction"`
	HitTokens     float64  `json:"hit_tokens"`
	QueryTokens   float64  `json:"query_tokens"`
	WindowSeconds float64  `json:"window_seconds"`
}

// FleetCacheJSON is the engines' cached-prefix fraction over the last
// window for one model, or for the whole fleet (Model ""); see
// kvindex.v1.FleetCache. Fraction is null while the window saw no query.
type FleetCacheJSON struct {
	Model         string   `json:"model"`
	Fraction      *float64 `json:"fraction"`
	HitTokens     float64  `json:"hit_tokens"`
	QueryTokens   float64  `json:"query_tokens"`
	WindowSeconds float64  `json:"window_seconds"`
}

// PodInfoJSON is one engine and its ingest state. LastEventAgeSeconds is
// null if no batch was applied yet; LastBatchLagSeconds (see
// kvindex.v1.PodInfo) if no applied batch carried the engine's stamp.
// BlocksByMedium splits Blocks by storage medium; it is never null.
type PodInfoJSON struct {
	Pod                 string            `json:"pod"`
	DPRank              uint32            `json:"dp_rank"`
	Model               string            `json:"model"`
	Endpoint            string            `json:"endpoint"`
	Connected           bool              `json:"connected"`
	Health              string            `json:"health"`
	LastSeq             uint64            `json:"last_seq"`
	Batches             uint64            `json:"batches"`
	Events              uint64            `json:"events"`
	Gaps                uint64            `json:"gaps"`
	ReplaysOK           uint64            `json:"replays_ok"`
	ReplaysFailed       uint64            `json:"replays_failed"`
	Resets              uint64            `json:"resets"`
	DecodeErrors        uint64            `json:"decode_errors"`
	UnknownEvents       uint64            `json:"unknown_events"`
	Blocks              uint64            `json:"blocks"`
	BlocksByMedium      map[string]uint64 `json:"blocks_by_medium"`
	HashCheck           string            `json:"hash_check"`
	LastEventUnixMs     int64             `json:"last_event_unix_ms"`
	LastEventAgeSeconds *float64          `json:"last_event_age_seconds"`
	LastBatchLagSeconds *float64          `json:"last_batch_lag_seconds"`
	Message             string            `json:"message,omitempty"`
}

// Restored reports whether the engine has entries but sent nothing to
// this process: they came from a snapshot (its health is restored, or it
// holds blocks), its events before this process. Its last event shows as
// "restored", not "never".
func (p PodInfoJSON) Restored() bool {
	return p.LastEventAgeSeconds == nil && (p.Health == HealthName(kvindexv1.EngineHealth_ENGINE_HEALTH_RESTORED) || p.Blocks > 0)
}

// PodsJSONOf converts a response; ages are computed against now.
func PodsJSONOf(r *kvindexv1.ListPodsResponse, now time.Time) PodsJSON {
	out := PodsJSON{IndexSeq: r.GetIndexSeq(), Pods: make([]PodInfoJSON, len(r.GetPods()))}
	for i, p := range r.GetPods() {
		pj := PodInfoJSON{
			Pod: p.GetPod(), DPRank: p.GetDpRank(), Model: p.GetModel(), Endpoint: p.GetEndpoint(),
			Connected: p.GetConnected(), Health: HealthName(p.GetHealth()), LastSeq: p.GetLastSeq(),
			Batches: p.GetBatches(), Events: p.GetEvents(), Gaps: p.GetGaps(),
			ReplaysOK: p.GetReplaysOk(), ReplaysFailed: p.GetReplaysFailed(), Resets: p.GetResets(),
			DecodeErrors: p.GetDecodeErrors(), UnknownEvents: p.GetUnknownEvents(),
			Blocks: p.GetBlocks(), HashCheck: HashCheckName(p.GetHashCheck()), LastEventUnixMs: p.GetLastEventUnixMs(),
			Message: p.GetMessage(),
		}
		pj.BlocksByMedium = make(map[string]uint64, len(p.GetBlocksByMedium()))
		for k, v := range p.GetBlocksByMedium() {
			pj.BlocksByMedium[k] = v
		}
		if ms := p.GetLastEventUnixMs(); ms > 0 {
			age := max(now.Sub(time.UnixMilli(ms)).Seconds(), 0)
			pj.LastEventAgeSeconds = &age
		}
		if p.LastBatchLagSeconds != nil {
			lag := p.GetLastBatchLagSeconds()
			pj.LastBatchLagSeconds = &lag
		}
		out.Pods[i] = pj
	}
	for _, f := range r.GetFleet() {
		fj := FleetCacheJSON{Model: f.GetModel(), HitTokens: f.GetHitTokens(), QueryTokens: f.GetQueryTokens(), WindowSeconds: f.GetWindowSeconds()}
		if f.Fraction != nil {
			v := f.GetFraction()
			fj.Fraction = &v
		}
		out.Fleet = append(out.Fleet, fj)
	}
	for _, c := range r.GetTokenizerChecks() {
		out.TokenizerChecks = append(out.TokenizerChecks, TokenizerCheckJSON{Form: c.GetForm(), Verdict: c.GetVerdict(), Disagrees: c.GetDisagrees(), Detail: c.GetDetail()})
	}
	for _, p := range r.GetPodCache() {
		pj := PodCacheJSON{Pod: p.GetPod(), HitTokens: p.GetHitTokens(), QueryTokens: p.GetQueryTokens(), WindowSeconds: p.GetWindowSeconds()}
		if p.Fraction != nil {
			v := p.GetFraction()
			pj.Fraction = &v
		}
		out.PodCache = append(out.PodCache, pj)
	}
	return out
}

// HashCheckName is the lower-case name of a verification state:
// "verified", "mismatch" or "unknown".
func HashCheckName(c kvindexv1.HashCheck) string {
	switch c {
	case kvindexv1.HashCheck_HASH_CHECK_VERIFIED:
		return "verified"
	case kvindexv1.HashCheck_HASH_CHECK_MISMATCH:
		return "mismatch"
	}
	return "unknown"
}

// HealthName is the lower-case name of an engine's stream health: "ok",
// "partial", "restored", "unconfirmed", "degraded", "disconnected", or "unknown" for
// engines kvindex does not follow. What each means is documented on
// kvindex.v1.EngineHealth.
func HealthName(h kvindexv1.EngineHealth) string {
	switch h {
	case kvindexv1.EngineHealth_ENGINE_HEALTH_OK:
		return "ok"
	case kvindexv1.EngineHealth_ENGINE_HEALTH_PARTIAL:
		return "partial"
	case kvindexv1.EngineHealth_ENGINE_HEALTH_RESTORED:
		return "restored"
	case kvindexv1.EngineHealth_ENGINE_HEALTH_UNCONFIRMED:
		return "unconfirmed"
	case kvindexv1.EngineHealth_ENGINE_HEALTH_DEGRADED:
		return "degraded"
	case kvindexv1.EngineHealth_ENGINE_HEALTH_DISCONNECTED:
		return "disconnected"
	}
	return "unknown"
}

// EngineName prints an engine the one way kvindex prints engines
// everywhere: "pod" for data-parallel rank 0 (the only rank of an engine
// without data parallelism), "pod/N" for rank N. kvevents.EngineID.String
// follows the same rule.
func EngineName(pod string, rank uint32) string {
	if rank == 0 {
		return pod
	}
	return pod + "/" + strconv.FormatUint(uint64(rank), 10)
}
