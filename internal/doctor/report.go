package doctor

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/blockhash"
)

// Finding kinds.
const (
	KindNoEngines    = "no_engines"
	KindHashMismatch = "hash_mismatch"
	KindDisconnected = "disconnected"
	KindDegraded     = "degraded"
	KindRestored     = "restored"
	KindUnconfirmed  = "unconfirmed"
	KindPartial      = "partial"
	KindReplayFailed = "replay_failed"
	KindUndecodable  = "undecodable"
	KindTokenizer    = "tokenizer_disagrees"
	KindClock        = "clock_skew"
	KindLagging      = "ingest_lag"
	KindEngineClock  = "engine_clock_ahead"
)

// clockTolerance is how far two clocks may disagree before doctor calls
// them skewed (kvindex stamping an applied batch in this machine's
// future, an engine stamping a batch after kvindex applied it): more
// than the time a call or a batch's trip takes, less than the ages an
// operator reads.
const clockTolerance = 2 * time.Second

// lagTolerance is how long after an engine stamps a batch kvindex may
// apply it before doctor reports the engine lagging: well past a healthy
// trip (milliseconds), short of what makes routing stale.
const lagTolerance = 5 * time.Second

// Finding is one problem and its fix.
type Finding struct {
	Kind    string `json:"kind"`
	Engine  string `json:"engine,omitempty"` // pod, or pod/rank above rank 0
	Pod     string `json:"pod,omitempty"`
	DPRank  uint32 `json:"dp_rank"`
	Model   string `json:"model,omitempty"`
	Problem string `json:"problem"`
	Fix     string `json:"fix"`
	// Hash is the configuration search's result, for a hash mismatch.
	Hash *HashFinding `json:"hash,omitempty"`
}

// HashFinding is what the search of an engine's hashing found.
type HashFinding struct {
	Outcome   Outcome `json:"outcome"`
	Algo      string  `json:"algo,omitempty"`
	Seed      *string `json:"seed,omitempty"` // absent unless found
	BlockSize int     `json:"block_size,omitempty"`
	Extras    Extras  `json:"extras,omitempty"`
	Blocks    int     `json:"blocks_reproduced"`
	Samples   int     `json:"samples"`
	Tried     int     `json:"candidates_tried"`
	// KvindexFlags are kvindex serve's flags that mirror the engine.
	KvindexFlags string `json:"kvindex_flags,omitempty"`
	// EngineSettings are the engine's settings that give kvindex's
	// current configuration instead.
	EngineSettings string `json:"engine_settings,omitempty"`
}

// Report is kvindex doctor's answer.
type Report struct {
	Server string `json:"server"`
	// HashConfig is the server's hashing (GetHashConfig); absent when it
	// does not say.
	HashConfig *HashConfig `json:"hash_config,omitempty"`
	Engines    int         `json:"engines"`
	Healthy    bool        `json:"healthy"`
	Findings   []Finding   `json:"findings"`
}

// HashConfig is a hashing configuration as the report prints it.
type HashConfig struct {
	Algo      string `json:"algo"`
	Seed      string `json:"seed"`
	BlockSize int    `json:"block_size"`
}

// Input is what the server answered, for Build.
type Input struct {
	Server string
	Pods   *kvindexv1.ListPodsResponse
	// Hash is the server's hashing (GetHashConfig); nil if unknown.
	Hash *kvindexv1.HashConfig
	// Samples are the engines' kept events (HashSamples); nil when the
	// server did not give them, SamplesErr then saying why.
	Samples    *kvindexv1.HashSamplesResponse
	SamplesErr string
	// Seeds are seeds to try beyond the configured one and DefaultSeeds.
	Seeds []string
	// Pods restricts the report to these pods; empty: every pod.
	Only []string
	// Now is this machine's clock when the answers arrived, to check
	// kvindex's against; zero: not checked.
	Now time.Time
}

// Build diagnoses every engine of in.Pods.
func Build(in Input) Report {
	r := Report{Server: in.Server, Findings: []Finding{}}
	var configured blockhash.Config
	if h := in.Hash; h != nil {
		configured = blockhash.Config{Algo: blockhash.Algo(h.GetAlgo()), Seed: h.GetSeed(), BlockSize: int(h.GetBlockSize())}
		r.HashConfig = &HashConfig{Algo: h.GetAlgo(), Seed: h.GetSeed(), BlockSize: int(h.GetBlockSize())}
	} else {
		configured = blockhash.DefaultConfig()
	}
	for _, p := range in.Pods.GetPods() {
		if len(in.Only) > 0 && !slices.Contains(in.Only, p.GetPod()) {
			continue
		}
		r.Engines++
		base := Finding{Engine: client.EngineName(p.GetPod(), p.GetDpRank()), Pod: p.GetPod(), DPRank: p.GetDpRank(), Model: p.GetModel()}
		for _, f := range engineFindings(p) {
			r.Findings = append(r.Findings, with(base, f))
		}
		if p.GetHashCheck() == kvindexv1.HashCheck_HASH_CHECK_MISMATCH {
			f := with(base, hashFinding(p, samplesOf(in.Samples, p), in.SamplesErr, configured, in.Seeds))
			r.Findings = append(r.Findings, f)
		}
	}
	if f, ok := clockFinding(in); ok {
		r.Findings = append(r.Findings, f)
	}
	for _, c := range in.Pods.GetTokenizerChecks() {
		if c.GetDisagrees() {
			r.Findings = append(r.Findings, Finding{Kind: KindTokenizer,
				Problem: fmt.Sprintf("the local tokenizer (serve --tokenizer), the fallback while the engine's /tokenize fails, does not give the engine's ids for %s prompts (%s: %s): those queries would then match no engine's blocks", c.GetForm(), c.GetVerdict(), c.GetDetail()),
				Fix:     "give kvindex serve the model's own tokenizer.json and --chat-template (the engine's --model and --chat-template), or drop --tokenizer to rely on --tokenize-url alone"})
		}
	}
	if r.Engines == 0 {
		r.Findings = append(r.Findings, Finding{Kind: KindNoEngines,
			Problem: "kvindex follows no engines" + onlyNote(in.Only),
			Fix:     "give kvindex serve the engines' event endpoints (--engine POD=tcp://HOST:PORT, or --listen with the engines connecting), and check that the engines run with --kv-events-config publishing events"})
	}
	r.Healthy = len(r.Findings) == 0
	return r
}

// clockFinding reports kvindex's clock ahead of this machine's: it stamps
// applied batches (last_event_unix_ms) in this machine's future, so the
// ages kvindex pods and routers derive are off.
func clockFinding(in Input) (Finding, bool) {
	if in.Now.IsZero() {
		return Finding{}, false
	}
	var ahead time.Duration
	for _, p := range in.Pods.GetPods() {
		if ms := p.GetLastEventUnixMs(); ms > 0 {
			ahead = max(ahead, time.UnixMilli(ms).Sub(in.Now))
		}
	}
	if ahead <= clockTolerance {
		return Finding{}, false
	}
	return Finding{Kind: KindClock,
		Problem: fmt.Sprintf("kvindex's clock is at least %v ahead of this machine's (it stamps applied events in this machine's future): the event ages kvindex pods prints are off by as much", ahead.Round(time.Second)),
		Fix:     "synchronise the clocks of kvindex's host and this one (NTP, chrony)"}, true
}

func onlyNote(only []string) string {
	if len(only) == 0 {
		return ""
	}
	return " of pod " + strings.Join(only, ", ")
}

func with(base, f Finding) Finding {
	f.Engine, f.Pod, f.DPRank, f.Model = base.Engine, base.Pod, base.DPRank, base.Model
	return f
}

// engineFindings are an engine's stream problems, from ListPods.
func engineFindings(p *kvindexv1.PodInfo) []Finding {
	var out []Finding
	switch p.GetHealth() {
	case kvindexv1.EngineHealth_ENGINE_HEALTH_DISCONNECTED:
		out = append(out, Finding{Kind: KindDisconnected,
			Problem: fmt.Sprintf("the engine's event socket %s is not connected: its entries age and queries cannot count on them", orDash(p.GetEndpoint())),
			Fix:     "check that the engine runs and publishes on that endpoint (vLLM --kv-events-config endpoint), and that nothing between blocks the port"})
	case kvindexv1.EngineHealth_ENGINE_HEALTH_DEGRADED:
		out = append(out, Finding{Kind: KindDegraded,
			Problem: fmt.Sprintf("batches were lost and not replayed (%d gaps, %d replays failed): the engine's entries may be stale until it clears its cache or restarts", p.GetGaps(), p.GetReplaysFailed()),
			Fix:     "give the engine's replay endpoint (--engine POD=ENDPOINT,replay=tcp://HOST:PORT; vLLM --kv-events-config replay_endpoint) so that gaps are filled, and keep kvindex's host less loaded"})
	case kvindexv1.EngineHealth_ENGINE_HEALTH_RESTORED:
		out = append(out, Finding{Kind: KindRestored,
			Problem: "the entries come from a snapshot and the engine has not confirmed them",
			Fix:     "give the engine's replay endpoint so that kvindex can confirm them (--engine POD=ENDPOINT,replay=tcp://HOST:PORT); they are confirmed or dropped once it answers"})
	case kvindexv1.EngineHealth_ENGINE_HEALTH_UNCONFIRMED:
		out = append(out, Finding{Kind: KindUnconfirmed,
			Problem: "the start of the engine's history is unknown (kvindex joined mid-stream, or a reconnect could not be checked)",
			Fix:     "give the engine's replay endpoint with a buffer reaching back to its start (vLLM --kv-events-config buffer_steps), or reset the engine's prefix cache (it then announces AllBlocksCleared)"})
	case kvindexv1.EngineHealth_ENGINE_HEALTH_PARTIAL:
		out = append(out, Finding{Kind: KindPartial,
			Problem: "the memory budget evicted some of the engine's entries: its matches are lower bounds",
			Fix:     "raise kvindex serve --memory-budget (kvindex_index_bytes and kvindex_index_evictions_total on /metrics show the pressure), or follow fewer engines per kvindex"})
	}
	if p.GetReplaysFailed() > 0 && p.GetHealth() != kvindexv1.EngineHealth_ENGINE_HEALTH_DEGRADED {
		out = append(out, Finding{Kind: KindReplayFailed,
			Problem: fmt.Sprintf("%d replays of missed batches failed (%d succeeded): the replay endpoint does not answer or no longer holds them", p.GetReplaysFailed(), p.GetReplaysOk()),
			Fix:     "check the engine's replay endpoint (--engine POD=ENDPOINT,replay=tcp://HOST:PORT against vLLM --kv-events-config replay_endpoint) is reachable from kvindex, and its buffer_steps"})
	}
	if f, ok := lagFinding(p); ok {
		out = append(out, f)
	}
	if n := p.GetDecodeErrors() + p.GetUnknownEvents(); n > 0 {
		out = append(out, Finding{Kind: KindUndecodable,
			Problem: fmt.Sprintf("%d batches could not be decoded and %d events had an unknown type", p.GetDecodeErrors(), p.GetUnknownEvents()),
			Fix:     "check that the endpoint is a vLLM or SGLang KV-event publisher, and that kvindex is recent enough for the engine's version"})
	}
	return out
}

// lagFinding reports an engine whose last applied batch kvindex applied
// long after the engine stamped it, or before: lag is kvindex's clock
// minus the engine's, so a skew between the two shows in it too.
func lagFinding(p *kvindexv1.PodInfo) (Finding, bool) {
	if p.LastBatchLagSeconds == nil {
		return Finding{}, false
	}
	lag := time.Duration(p.GetLastBatchLagSeconds() * float64(time.Second))
	switch {
	case lag > lagTolerance:
		return Finding{Kind: KindLagging,
			Problem: fmt.Sprintf("kvindex applies the engine's events %v after it publishes them (by each side's clock): routers see its cache that late", lag.Round(100*time.Millisecond)),
			Fix:     "a slow consumer (kvindex's CPU, a throttled pod: kvindex_ingest_lag_seconds on /metrics follows it), a NATS stream behind (in NATS mode, the replica catching up), or the engine's clock behind kvindex's (a lag that stays the same whatever the load): give kvindex more CPU, and run NTP (chrony) on the engine's and kvindex's hosts"}, true
	case lag < -clockTolerance:
		return Finding{Kind: KindEngineClock,
			Problem: fmt.Sprintf("the engine stamps its batches %v after kvindex applies them: its clock is ahead of kvindex's, so the clocks disagree by at least that and kvindex cannot tell how far behind it is", (-lag).Round(100*time.Millisecond)),
			Fix:     "clocks disagree: run NTP (chrony) on the engine's and kvindex's hosts"}, true
	}
	return Finding{}, false
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// samplesOf returns the engine's kept events, decoded; undecodable ones
// are left out.
func samplesOf(r *kvindexv1.HashSamplesResponse, p *kvindexv1.PodInfo) []Sample {
	var out []Sample
	for _, e := range r.GetEngines() {
		if e.GetPod() != p.GetPod() || e.GetDpRank() != p.GetDpRank() || e.GetModel() != p.GetModel() {
			continue
		}
		for _, sp := range e.GetSamples() {
			if s, err := Decode(sp); err == nil {
				out = append(out, s)
			}
		}
	}
	return out
}

// hashFinding searches for the engine's hashing and says what to change.
func hashFinding(p *kvindexv1.PodInfo, samples []Sample, samplesErr string, configured blockhash.Config, seeds []string) Finding {
	f := Finding{Kind: KindHashMismatch, Problem: "kvindex cannot recompute the engine's block hashes, so queries by tokens miss its blocks"}
	if p.GetMessage() != "" {
		f.Problem += " (" + p.GetMessage() + ")"
	}
	if samplesErr != "" {
		f.Hash = &HashFinding{Outcome: NoSamples}
		f.Fix = "no search of the engine's configuration: " + samplesErr + "; " + checkBoth(configured)
		return f
	}
	d := Search(samples, NewGrid(configured, seeds))
	h := &HashFinding{Outcome: d.Outcome, Blocks: d.Blocks, Samples: len(samples), Tried: d.Tried}
	f.Hash = h
	switch d.Outcome {
	case Found:
		h.Algo, h.Seed, h.BlockSize, h.Extras = string(d.Config.Algo), &d.Config.Seed, d.Config.BlockSize, d.Extras
		h.KvindexFlags = KvindexFlags(d.Config)
		h.EngineSettings = EngineSettings(configured)
		f.Problem += fmt.Sprintf("; the engine hashes with %s (%d sampled blocks reproduced)", Describe(d.Config), d.Blocks)
		f.Fix = "run kvindex serve with " + h.KvindexFlags + "; or run the engine with " + h.EngineSettings + ", kvindex's configuration"
		if d.Extras == ExtrasNone {
			f.Fix += ". The engine hashes its blocks without the extra keys (LoRA, salt, multimodal) its events report: check the engine's version"
		}
	case RandomSeed:
		h.Algo, h.BlockSize, h.Extras = string(d.Config.Algo), d.Config.BlockSize, d.Extras
		f.Problem += fmt.Sprintf("; not reproducible: the engine seeds its hashes randomly (no seed reproduces the first block of a sequence, while %d blocks chained from the digests it reports reproduce with %s, block size %d)", d.Blocks, d.Config.Algo, d.Config.BlockSize)
		f.Fix = fmt.Sprintf("set PYTHONHASHSEED on the engine (e.g. PYTHONHASHSEED=0) and run kvindex serve with --hash-algo %s --hash-seed 0 --block-size %d (if the engine sets a seed already, give it to kvindex doctor with --seed)", d.Config.Algo, d.Config.BlockSize)
	case NotFound:
		f.Problem += fmt.Sprintf("; no configuration tried reproduces the engine's hashes (%d candidates, %d sampled events)", d.Tried, len(samples))
		f.Fix = "if the engine sets PYTHONHASHSEED, give its value with --seed; if it leaves it unset on a vLLM that draws a random seed, the hashes are not reproducible: set PYTHONHASHSEED on the engine"
		if !d.Digests {
			f.Fix += " (the events carry 64-bit keys only, so a random seed cannot be told apart; VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 sends the full digests)"
		}
	case NoSamples:
		f.Fix = "no event of the engine could be checked yet (kvindex keeps the engine's next stored blocks): run kvindex doctor again after the engine served requests; " + checkBoth(configured)
	}
	return f
}

func checkBoth(configured blockhash.Config) string {
	return "check the engine's " + EngineSettings(configured) + " against kvindex's " + KvindexFlags(configured)
}

// Describe names a configuration in words.
func Describe(c blockhash.Config) string {
	if c.Algo == blockhash.SGLang {
		return fmt.Sprintf("SGLang's scheme, page size %d", c.BlockSize)
	}
	return fmt.Sprintf("%s, seed %q, block size %d", c.Algo, c.Seed, c.BlockSize)
}

// KvindexFlags are kvindex serve's flags for configuration c.
func KvindexFlags(c blockhash.Config) string {
	s := "--hash-algo " + string(c.Algo)
	if c.Algo != blockhash.SGLang {
		s += " --hash-seed " + shellWord(c.Seed)
	}
	return s + " --block-size " + strconv.Itoa(c.BlockSize)
}

// EngineSettings are the engine-side settings that give configuration c:
// vLLM's flags and PYTHONHASHSEED, or SGLang's page size.
func EngineSettings(c blockhash.Config) string {
	if c.Algo == blockhash.SGLang {
		return "SGLang with --page-size " + strconv.Itoa(c.BlockSize)
	}
	return "vLLM --prefix-caching-hash-algo " + string(c.Algo) + " --block-size " + strconv.Itoa(c.BlockSize) + " and " + seedSetting(c)
}

// seedSetting is the PYTHONHASHSEED that gives c's seed. Python accepts
// only "random" or an integer in [0, 4294967295] there.
func seedSetting(c blockhash.Config) string {
	if c.Seed == blockhash.DefaultSeed {
		if c.Algo == blockhash.SHA256CBOR || c.Algo == blockhash.SHA256Pickle {
			return "PYTHONHASHSEED unset (vLLM releases after August 2026)"
		}
		return fmt.Sprintf("no PYTHONHASHSEED (seed %q is vLLM's default for sha256 and sha256_cbor only; pick an integer seed for both sides)", c.Seed)
	}
	if n, err := strconv.ParseUint(c.Seed, 10, 32); (err == nil && strconv.FormatUint(n, 10) == c.Seed) || c.Seed == "random" {
		return "PYTHONHASHSEED=" + c.Seed
	}
	return fmt.Sprintf("no PYTHONHASHSEED (Python takes only integers there, not %q; pick an integer seed for both sides)", c.Seed)
}

// shellWord quotes s for a shell when it needs it.
func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// WriteJSON prints r as one JSON object.
func (r *Report) WriteJSON(w io.Writer) error {
	return json.NewEncoder(w).Encode(r)
}

// WriteText prints r for a reader: a summary line, then each finding
// with its fix.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s followed by kvindex at %s", count(r.Engines, "engine"), r.Server)
	if c := r.HashConfig; c != nil {
		fmt.Fprintf(&b, ", hashing %s", Describe(blockhash.Config{Algo: blockhash.Algo(c.Algo), Seed: c.Seed, BlockSize: c.BlockSize}))
	}
	if r.Healthy {
		b.WriteString(": healthy\n")
	} else {
		fmt.Fprintf(&b, ": %s\n", count(len(r.Findings), "finding"))
	}
	for _, f := range r.Findings {
		b.WriteString("\n")
		if f.Engine != "" {
			fmt.Fprintf(&b, "%s (%s): ", f.Engine, f.Model)
		}
		fmt.Fprintf(&b, "%s\n  problem: %s\n  fix: %s\n", strings.ReplaceAll(f.Kind, "_", " "), f.Problem, f.Fix)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// count is "1 engine", "2 engines".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}
