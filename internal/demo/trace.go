package demo

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"time"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/internal/trace"
	"github.com/kvindex/kvindex/tokenizer"
)

// ScenarioTrace is the scenario a report of a replayed trace names.
const ScenarioTrace = "trace"

// generatedOnly lists the flags that shape the generated workload, which
// a trace replaces.
var generatedOnly = []string{"sessions", "turns", "requests", "load", "capacity-factor"}

// ValidateGiven is Validate for a command line, where given reports
// whether a flag was set: with a trace it also refuses, rather than
// ignores, the flags that shape the generated workload.
func (c *Config) ValidateGiven(given func(flag string) bool) error {
	if err := c.Validate(); err != nil || c.Trace == "" {
		return err
	}
	for _, name := range generatedOnly {
		if given(name) {
			f := configerr.Field(name)
			return configerr.New(f, "%v shapes the generated workload, which %v replaces (its timestamps and %v set the arrivals, %v the engines)",
				f, configerr.Field("trace"), configerr.Field("time-scale"), configerr.Field("capacity"))
		}
	}
	return nil
}

// TraceInfo describes a replayed trace and its ceiling. Its JSON form is
// part of the report's contract.
type TraceInfo struct {
	File        string `json:"file"`
	Format      string `json:"format"` // trace.FormatMooncake or trace.FormatKVIndex
	BlockTokens int    `json:"block_tokens"`
	Requests    int    `json:"requests"`
	Sessions    int    `json:"sessions"` // distinct session ids; 0: none given
	// SpanSeconds is the simulated time from the first arrival to the
	// last, after TimeScale.
	SpanSeconds float64 `json:"span_s"`
	TimeScale   float64 `json:"time_scale"`
	// PromptTokens is the sum of the prompts' lengths.
	PromptTokens int64 `json:"prompt_tokens"`
	// Load is the work the trace brings, with every request hitting the
	// unlimited cache, over what the fleet can do in its span (0: a
	// trace whose requests all arrive at once).
	Load float64 `json:"load"`
	// Ceiling is the cached fraction of one unlimited cache: the share of
	// the prompt tokens, in full engine blocks, whose whole prefix an
	// earlier request of the trace sent. No router can serve more from
	// cache than this on a fleet of any size, unless a session's turns,
	// each held back until the previous answer, arrive out of the
	// trace's order.
	Ceiling float64 `json:"ceiling_cached_fraction"`
}

// traceTokens makes a trace request's tokens on demand: the prompt, then
// output tokens of the request's own.
type traceTokens struct {
	blocks      []uint64 // the prompt's block ids, or
	tokens      []uint64 // the prompt's tokens
	text        string   // the prompt as text, kept for a live run (Options.keepText)
	blockTokens int
	input       int
	output      int
	line        uint64 // the trace line: seeds the output tokens
	vocab       uint64
}

// The keys of the PCG streams trace tokens are drawn from.
const (
	traceBlockKey  = 0x74726163652d626c // a block id's tokens
	traceOutputKey = 0x74726163652d6f75 // a request's output tokens
)

// appendBlock appends the first n of the tokens block id stands for: drawn
// from a PCG stream seeded by the id alone, so equal ids are equal tokens
// in every request, and a request's prompt shares exactly the blocks the
// trace says it shares.
func appendBlock(dst []uint64, id uint64, n int, vocab uint64) []uint64 {
	p := rand.NewPCG(id, traceBlockKey)
	for range n {
		dst = append(dst, p.Uint64()%vocab)
	}
	return dst
}

// append appends the first n tokens of the request's prompt and output.
func (t *traceTokens) append(dst []uint64, n int) []uint64 {
	prompt := min(n, t.input)
	if t.blocks == nil {
		dst = append(dst, t.tokens[:prompt]...)
	} else {
		for i := 0; i*t.blockTokens < prompt; i++ {
			dst = appendBlock(dst, t.blocks[i], min(t.blockTokens, prompt-i*t.blockTokens), t.vocab)
		}
	}
	if n > t.input {
		p := rand.NewPCG(t.line, traceOutputKey)
		for range n - t.input {
			dst = append(dst, p.Uint64()%t.vocab)
		}
	}
	return dst
}

// tracePlan is what reading a trace gives a run.
type tracePlan struct {
	w      *Workload
	info   TraceInfo
	hits   []int // per request: the tokens the unlimited cache serves
	blocks bool  // some prompt is given as block ids
}

// readTrace reads the trace o names and turns it into requests: arrivals
// from the timestamps (times TimeScale, the first at 0), the requests of a
// session chained as a conversation's are (a turn waits for the previous
// answer), and each prompt's block keys as the engines hash them.
func (o *Options) readTrace(h *blockhash.Hasher) (*tracePlan, error) {
	f, err := os.Open(o.Trace)
	if err != nil {
		return nil, configerr.New("trace", "%v: %w", configerr.Field("trace"), err)
	}
	defer f.Close()
	opt := trace.Options{BlockTokens: o.TraceBlock}
	if o.Tokenizer != "" {
		tok, err := tokenizer.LoadFile(o.Tokenizer)
		if err != nil {
			return nil, configerr.New("tokenizer", "%v %s: %w", configerr.Field("tokenizer"), o.Tokenizer, err)
		}
		// With the special tokens, as an OpenAI completions endpoint
		// tokenizes a prompt by default.
		opt.Tokenize = func(text string) ([]uint64, error) { return tok.Encode(text, true), nil }
	}
	vocab := uint64(DefaultWorkload(ScenarioAgents).Vocab)
	rd := trace.NewReader(f, opt)
	w := &Workload{Config: WorkloadConfig{Scenario: ScenarioTrace}}
	tp := &tracePlan{w: w}
	sessions := map[string]int{} // session id -> its conversation
	lastOf := map[int]int{}      // conversation -> its last request
	keys := newKeyMemo(h, o.TraceBlock, vocab)
	var first time.Duration
	for o.TraceRequests == 0 || len(w.Requests) < o.TraceRequests {
		rec, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if errors.Is(err, trace.ErrNoTokenizer) {
				return nil, configerr.New("tokenizer", "%v %s: %w (%v)", configerr.Field("trace"), o.Trace, err, configerr.Field("tokenizer"))
			}
			return nil, configerr.New("trace", "%v %s: %w", configerr.Field("trace"), o.Trace, err)
		}
		if len(w.Requests) == 0 {
			first = rec.Time
		}
		if o.TraceWindow > 0 && rec.Time-first >= o.TraceWindow {
			break
		}
		if len(w.Requests) == maxRequests {
			return nil, configerr.New("trace-requests", "%v %s holds more than %d requests: take a prefix with %v or %v",
				configerr.Field("trace"), o.Trace, maxRequests, configerr.Field("trace-requests"), configerr.Field("trace-window"))
		}
		id := len(w.Requests)
		conv, ok := sessions[rec.Session]
		if rec.Session == "" || !ok {
			conv = w.Conversations
			w.Conversations++
			if rec.Session != "" {
				sessions[rec.Session] = conv
			}
		}
		if !o.keepText {
			rec.Text = ""
		}
		r := Request{
			ID: id, Conv: conv, Prev: -1, Next: -1,
			Planned: time.Duration(math.Round(float64(rec.Time-first) * o.TimeScale)),
			trace: &traceTokens{blocks: rec.Blocks, tokens: rec.Tokens, text: rec.Text, blockTokens: o.TraceBlock,
				input: rec.Input, output: rec.Output, line: uint64(rec.Line), vocab: vocab},
		}
		if prev, ok := lastOf[conv]; ok {
			r.Prev = prev
			r.Turn = w.Requests[prev].Turn + 1
			w.Requests[prev].Next = id
		}
		lastOf[conv] = id
		if r.Keys, err = keys.of(&r); err != nil {
			return nil, err
		}
		w.Span = r.Planned
		w.MaxBlocks = max(w.MaxBlocks, (rec.Input+rec.Output+engineBlockSize-1)/engineBlockSize)
		tp.info.PromptTokens += int64(rec.Input)
		tp.blocks = tp.blocks || rec.Blocks != nil
		w.Requests = append(w.Requests, r)
	}
	tp.info.File, tp.info.Format, tp.info.BlockTokens = o.Trace, rd.Format(), o.TraceBlock
	tp.info.Requests, tp.info.Sessions, tp.info.TimeScale = len(w.Requests), len(sessions), o.TimeScale
	tp.info.SpanSeconds = round(w.Span.Seconds(), 3)
	var hit int64
	tp.hits, hit = ceiling(w.Requests)
	tp.info.Ceiling = ratio(hit, tp.info.PromptTokens)
	return tp, nil
}

// ceiling replays the requests, in trace order, through one cache that
// never evicts: per request, the tokens of its full blocks whose whole
// prefix an earlier request sent, and their sum.
func ceiling(reqs []Request) (hits []int, total int64) {
	seen := map[uint64]struct{}{}
	hits = make([]int, len(reqs))
	for i := range reqs {
		n := 0
		for n < len(reqs[i].Keys) {
			if _, ok := seen[reqs[i].Keys[n]]; !ok {
				break
			}
			n++
		}
		for _, k := range reqs[i].Keys[n:] {
			seen[k] = struct{}{}
		}
		hits[i] = n * engineBlockSize
		total += int64(hits[i])
	}
	return hits, total
}

// keyMemo computes prompts' block keys, once per trace block: the keys of
// a trace block's engine blocks depend only on the key before it and its
// id, so the requests that share a prefix hash it once.
type keyMemo struct {
	h           *blockhash.Hasher
	blockTokens int
	vocab       uint64
	memo        map[memoKey]*memoBlock
	tokens      []uint64
	chain       []blockhash.Hash
}

type memoKey struct {
	parent    uint64 // the key of the engine block before (none: first)
	hasParent bool
	id        uint64
}

type memoBlock struct {
	keys []uint64       // one per engine block of the trace block
	last blockhash.Hash // the parent of the next trace block
}

func newKeyMemo(h *blockhash.Hasher, blockTokens int, vocab uint64) *keyMemo {
	return &keyMemo{h: h, blockTokens: blockTokens, vocab: vocab, memo: map[memoKey]*memoBlock{}}
}

// of returns the keys of r's prompt's full engine blocks.
func (m *keyMemo) of(r *Request) ([]uint64, error) {
	t := r.trace
	full := t.input / engineBlockSize
	out := make([]uint64, 0, full)
	var err error
	if t.blocks == nil {
		m.chain, err = m.h.Chain(m.chain[:0], nil, 0, t.tokens, nil)
		if err != nil {
			return nil, fmt.Errorf("hashing request %d: %w", r.ID, err)
		}
		for _, c := range m.chain {
			out = append(out, c.Key)
		}
		return out, nil
	}
	per := m.blockTokens / engineBlockSize
	var parent *blockhash.Hash
	for i := 0; len(out) < full; i++ {
		k := memoKey{id: t.blocks[i]}
		if parent != nil {
			k.parent, k.hasParent = parent.Key, true
		}
		b := m.memo[k]
		if b == nil {
			m.tokens = appendBlock(m.tokens[:0], k.id, m.blockTokens, m.vocab)
			m.chain, err = m.h.Chain(m.chain[:0], parent, i*per, m.tokens, nil)
			if err != nil {
				return nil, fmt.Errorf("hashing request %d: %w", r.ID, err)
			}
			b = &memoBlock{keys: make([]uint64, len(m.chain)), last: m.chain[len(m.chain)-1]}
			for j, c := range m.chain {
				b.keys[j] = c.Key
			}
			m.memo[k] = b
		}
		out = append(out, b.keys[:min(per, full-len(out))]...)
		parent = &b.last
	}
	return out, nil
}

// planTrace builds a run from the trace: its requests, the engines'
// capacity (--capacity, or one GPU's worth, raised if the largest request
// needs more) and the setup lines that state the trace, its load on the
// fleet and its ceiling.
func (o *Options) planTrace(h *blockhash.Hasher) (*runPlan, error) {
	tp, err := o.readTrace(h)
	if err != nil {
		return nil, err
	}
	w, info := tp.w, &tp.info
	bs := h.BlockSize()
	var setup []string
	format := "Mooncake"
	if info.Format == trace.FormatKVIndex {
		format = "kvindex"
	}
	sess := "no session ids"
	if info.Sessions > 0 {
		sess = fmt.Sprintf("%d sessions", info.Sessions)
	}
	limit := ""
	if o.TraceRequests > 0 || o.TraceWindow > 0 {
		limit = " (the first"
		if o.TraceRequests > 0 {
			limit += fmt.Sprintf(" %d", o.TraceRequests)
		}
		if o.TraceWindow > 0 {
			limit += fmt.Sprintf(" within %v", o.TraceWindow)
		}
		limit += ")"
	}
	blocks := ""
	if tp.blocks {
		blocks = fmt.Sprintf(", block ids of %d tokens", info.BlockTokens)
	}
	setup = append(setup, fmt.Sprintf("trace: %s, %s format (detected): %s requests%s, %s%s; %s prompt tokens",
		info.File, format, commas(info.Requests), limit, sess, blocks, kTokens(float64(info.PromptTokens))))
	capacity := o.Capacity
	if capacity == 0 {
		capacity = tokensPerGPU / bs
		why := fmt.Sprintf("one GPU's worth: a 32B model on one 80 GB GPU holds ~%s", kTokens(tokensPerGPU))
		if w.MaxBlocks > capacity {
			capacity = w.MaxBlocks
			why = fmt.Sprintf("more than one GPU's ~%s: the largest request needs it", kTokens(tokensPerGPU))
		}
		setup = append(setup, fmt.Sprintf("capacity %s blocks per engine (~%s tokens, %s; --capacity sets it)",
			commas(capacity), kTokens(float64(capacity*bs)), why))
	} else {
		setup = append(setup, fmt.Sprintf("capacity %s blocks per engine (~%s tokens)", commas(capacity), kTokens(float64(capacity*bs))))
	}
	field := configerr.Field("capacity")
	switch {
	case capacity < w.MaxBlocks:
		return nil, configerr.New(field, "%v %d cannot hold the trace's largest request (%d blocks)", field, o.Capacity, w.MaxBlocks)
	case capacity > maxCapacity:
		return nil, configerr.New(field, "%v %d exceeds the limit of %d blocks per engine", field, capacity, maxCapacity)
	}
	// The work with ideal caching: every request misses only what the
	// unlimited cache misses.
	var work time.Duration
	for i := range w.Requests {
		r := &w.Requests[i]
		work += o.Cost.Service(r.PromptLen()-tp.hits[i], r.Output())
	}
	perReq := work / time.Duration(max(len(w.Requests), 1))
	if w.Span > 0 {
		info.Load = round(work.Seconds()/(w.Span.Seconds()*float64(o.Pods)), 3)
		setup = append(setup, fmt.Sprintf("traffic: %s requests over %.1fs (timestamps x %g), %.1f/s: load %.2g of the fleet's throughput with ideal caching (%s per request)",
			commas(len(w.Requests)), w.Span.Seconds(), o.TimeScale, float64(len(w.Requests)-1)/w.Span.Seconds(), info.Load, perReq.Round(time.Millisecond)))
	} else {
		setup = append(setup, fmt.Sprintf("traffic: %s requests, all at once (%s per request with ideal caching)", commas(len(w.Requests)), perReq.Round(time.Millisecond)))
	}
	setup = append(setup, fmt.Sprintf("ceiling: one unlimited cache would serve %s of the prompt tokens (full blocks of %d whose whole prefix an earlier request sent)",
		pct(info.Ceiling), bs))
	return &runPlan{w: w, h: h, capacity: capacity, engines: o.Pods, setup: setup, trace: info}, nil
}

// LoadTrace reads the trace c names (Trace, TraceBlock, TraceRequests,
// TraceWindow, TimeScale, Tokenizer) into the requests a demo run
// replays, with its description and ceiling, for a run against a live
// fleet: a prompt given as block ids becomes the same token ids here as
// in the demo. keepText keeps text prompts' text (Request.Text).
func LoadTrace(c Config, keepText bool) (*Workload, *TraceInfo, error) {
	if err := c.Validate(); err != nil {
		return nil, nil, err
	}
	h, err := Hasher()
	if err != nil {
		return nil, nil, err
	}
	o := &Options{Config: c, keepText: keepText}
	tp, err := o.readTrace(h)
	if err != nil {
		return nil, nil, err
	}
	return tp.w, &tp.info, nil
}

// Ceiling is the cached fraction of one unlimited cache over w's
// requests, as TraceInfo.Ceiling is for a trace: the share of the prompt
// tokens, in full blocks, whose whole prefix an earlier request sent.
func Ceiling(w *Workload) float64 {
	var prompt int64
	for i := range w.Requests {
		prompt += int64(w.Requests[i].PromptLen())
	}
	_, hit := ceiling(w.Requests)
	return ratio(hit, prompt)
}
