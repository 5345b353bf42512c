package demo

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kvindex/kvindex/blockhash"
)

// Scenario names.
const (
	ScenarioAgents    = "agents"
	ScenarioChurn     = "churn"
	ScenarioHotPrefix = "hot-prefix"
	// ScenarioGateways replays the agent workload through several gateway
	// replicas, each routing a share of the requests with its own state.
	ScenarioGateways = "gateways"
	// ScenarioSessions replays the agent workload with session-affinity
	// routing as an extra row.
	ScenarioSessions = "sessions"
)

// Scenarios lists the scenarios Run accepts.
var Scenarios = []string{ScenarioAgents, ScenarioChurn, ScenarioHotPrefix, ScenarioGateways, ScenarioSessions}

// WorkloadConfig shapes the generated traffic. Token counts are in tokens,
// rates in requests per simulated second.
type WorkloadConfig struct {
	Scenario string
	Seed     uint64
	// Conversations is the number of conversations active at any time
	// (the --sessions flag): a conversation that has used up its turns is
	// replaced by a new one, fresh or forked.
	Conversations int
	// Turns is the number of requests a fresh conversation makes before it
	// ends; a fork makes half as many.
	Turns int
	// Requests is the total number of requests of the run.
	Requests int
	// Rate is the mean planned arrival rate (Poisson).
	Rate float64

	SharedTokens           int     // system prompt + tool schemas, identical for every conversation
	HistoryMin, HistoryMax int     // a fresh conversation's context after the shared prefix
	MessageMin, MessageMax int     // the user or tool message added before each later turn
	OutputMin, OutputMax   int     // tokens generated per request
	ZipfS                  float64 // skew of conversation activity: weight of slot i is 1/(i+1)^ZipfS
	ForkProb               float64 // chance that a new conversation forks an active one
	ForkPromptMin          int     // the fork's own instructions, appended to the parent's context
	ForkPromptMax          int
	Vocab                  int // token ids are drawn from [0, Vocab)

	// Hot-prefix scenario: HotShare of the requests are single requests
	// made of one long shared prompt plus a short unique suffix.
	HotShare                   float64
	HotPrefixTokens            int
	HotSuffixMin, HotSuffixMax int
	HotOutputMin, HotOutputMax int
}

// DefaultWorkload returns the traffic of the named scenario before the
// size flags are applied.
func DefaultWorkload(scenario string) WorkloadConfig {
	c := WorkloadConfig{
		Scenario:      scenario,
		Seed:          1,
		Conversations: 16,
		Turns:         16,
		SharedTokens:  2048,
		HistoryMin:    10_000,
		HistoryMax:    15_000,
		MessageMin:    50,
		MessageMax:    350,
		OutputMin:     50,
		OutputMax:     250,
		ZipfS:         1.0,
		ForkProb:      0.3,
		ForkPromptMin: 200,
		ForkPromptMax: 600,
		Vocab:         151_643, // the regular-token vocabulary of a Qwen2-family tokenizer
	}
	if scenario == ScenarioHotPrefix {
		c.HotShare = 0.7
		c.HotPrefixTokens = 8192
		c.HotSuffixMin, c.HotSuffixMax = 32, 256
		// Answers about a long document run longer than a tool call, so
		// a hot request costs about what a conversation turn does.
		c.HotOutputMin, c.HotOutputMax = 100, 350
	}
	return c
}

// validate checks the configuration; bounded: Requests counts too (a
// Generator has no end).
func (c *WorkloadConfig) validate(bounded bool) error {
	switch {
	case !slices.Contains(Scenarios, c.Scenario):
		return fmt.Errorf("unknown scenario %q (want one of %v)", c.Scenario, Scenarios)
	case c.Conversations < 1:
		return fmt.Errorf("conversations %d: want at least 1", c.Conversations)
	case c.Turns < 1:
		return fmt.Errorf("turns %d: want at least 1", c.Turns)
	case bounded && c.Requests < 1:
		return fmt.Errorf("requests %d: want at least 1", c.Requests)
	case !(c.Rate > 0) || math.IsInf(c.Rate, 0):
		return fmt.Errorf("arrival rate %v: want a positive number", c.Rate)
	case c.SharedTokens < 0 || c.HistoryMin < 1 || c.HistoryMax < c.HistoryMin ||
		c.MessageMin < 1 || c.MessageMax < c.MessageMin || c.OutputMin < 1 || c.OutputMax < c.OutputMin ||
		c.ForkPromptMin < 1 || c.ForkPromptMax < c.ForkPromptMin:
		return fmt.Errorf("token ranges must be positive and ordered")
	case c.ZipfS < 0 || c.ForkProb < 0 || c.ForkProb > 1 || c.HotShare < 0 || c.HotShare > 1:
		return fmt.Errorf("skew and probabilities out of range")
	case c.Vocab < 2:
		return fmt.Errorf("vocabulary %d: want at least 2", c.Vocab)
	case c.HotShare > 0 && (c.HotPrefixTokens < 1 || c.HotSuffixMin < 1 || c.HotSuffixMax < c.HotSuffixMin ||
		c.HotOutputMin < 1 || c.HotOutputMax < c.HotOutputMin):
		return fmt.Errorf("hot-prefix token ranges must be positive and ordered")
	}
	return nil
}

// Request is one generated request. Its prompt and full sequence are
// prefixes of its conversation's token list, which only ever grows, so
// requests share storage.
type Request struct {
	ID   int // index in Workload.Requests: the planned arrival order
	Conv int // conversation index
	Turn int // index of the request in its conversation
	// Prev and Next are the neighbouring requests of the conversation (-1:
	// none). A request cannot arrive before Prev has completed.
	Prev, Next int
	Planned    time.Duration // planned arrival time
	Prompt     []uint64      // the tokens sent
	Full       []uint64      // Prompt plus the generated output, cached at completion
	Keys       []uint64      // block keys of Prompt's full blocks (the engines' hashing)
	Hot        bool          // a hot-prefix request
	Fork       bool          // the first request of a forked conversation
	// trace, if set, makes the tokens on demand and Prompt and Full are
	// nil: a replayed trace's requests, which all at once need not fit in
	// memory.
	trace *traceTokens
}

// PromptLen returns the number of prompt tokens.
func (r *Request) PromptLen() int {
	if r.trace != nil {
		return r.trace.input
	}
	return len(r.Prompt)
}

// Output returns the number of generated tokens.
func (r *Request) Output() int {
	if r.trace != nil {
		return r.trace.output
	}
	return len(r.Full) - len(r.Prompt)
}

// PromptTokens returns the prompt's token ids: Prompt, or a trace
// request's, made on demand.
func (r *Request) PromptTokens() []uint64 {
	if r.trace != nil {
		return r.trace.append(nil, r.trace.input)
	}
	return r.Prompt
}

// Text returns a trace request's prompt as the trace gave it as text, if
// it was read for a live run (LoadTrace); "" otherwise.
func (r *Request) Text() string {
	if r.trace != nil {
		return r.trace.text
	}
	return ""
}

// appendTokens appends the first n tokens of Full to dst.
func (r *Request) appendTokens(dst []uint64, n int) []uint64 {
	if r.trace != nil {
		return r.trace.append(dst, n)
	}
	if n <= len(r.Prompt) {
		return append(dst, r.Prompt[:n]...)
	}
	return append(dst, r.Full[:n]...)
}

// Workload is the generated traffic: every router replays exactly these
// requests.
type Workload struct {
	Config        WorkloadConfig
	Requests      []Request
	Conversations int           // conversations created, forks included
	Forks         int           // forked conversations
	Hot           int           // hot-prefix requests (single requests, not conversations)
	Span          time.Duration // planned time of the last arrival
	// MeanContext is the mean prompt length after the shared prefix over
	// the conversation requests: the size of one active conversation.
	MeanContext float64
	// MaxBlocks is the largest request (prompt plus output) in blocks.
	MaxBlocks int
}

// conversation is one context that grows turn by turn.
type conversation struct {
	id        int
	rng       *rand.Rand
	tokens    []uint64
	turnsLeft int
	turns     int // requests made
	last      int // last request, -1 before the first
}

// planner generates requests one at a time. It keeps only the active
// conversations, so that a Generator runs without end in bounded memory.
type planner struct {
	cfg      WorkloadConfig
	est      func(newTokens, output int) time.Duration // ideal service time
	arrival  *rand.Rand
	shared   []uint64
	hot      []uint64
	slots    []slot
	weights  []float64
	now      time.Duration // planned time of the last arrival
	convs    int           // conversations created, hot requests' included
	requests int           // requests generated: the next one's ID
}

// slot holds one of the active conversations; slot 0 is the most active.
type slot struct {
	conv      *conversation
	busyUntil time.Duration // planned completion of its last request
}

// stream seeds: each consumer of randomness has its own PCG stream, so
// changing one knob does not reshuffle unrelated choices.
const (
	streamArrivals = iota + 1
	streamShared
	streamHot
	streamConv = 1 << 20 // + conversation id
)

func newRand(seed uint64, stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, stream*0x9e3779b97f4a7c15+1))
}

func newPlanner(cfg WorkloadConfig, est func(newTokens, output int) time.Duration) *planner {
	p := &planner{
		cfg:     cfg,
		est:     est,
		arrival: newRand(cfg.Seed, streamArrivals),
		slots:   make([]slot, cfg.Conversations),
		weights: make([]float64, cfg.Conversations),
	}
	p.shared = randomTokens(newRand(cfg.Seed, streamShared), nil, cfg.SharedTokens, cfg.Vocab)
	if cfg.HotShare > 0 {
		p.hot = randomTokens(newRand(cfg.Seed, streamHot), nil, cfg.HotPrefixTokens, cfg.Vocab)
	}
	for i := range p.weights {
		p.weights[i] = 1 / math.Pow(float64(i+1), cfg.ZipfS)
	}
	return p
}

// Plan generates the workload. est is the ideal service time of a request
// (a full cache hit on everything but its newTokens), used to keep a
// conversation from being planned twice in flight; the run itself then
// holds a request back until its predecessor completed.
func Plan(cfg WorkloadConfig, h *blockhash.Hasher, est func(newTokens, output int) time.Duration) (*Workload, error) {
	if err := cfg.validate(true); err != nil {
		return nil, err
	}
	p := newPlanner(cfg, est)
	w := &Workload{Config: cfg, Requests: make([]Request, 0, cfg.Requests)}
	for len(w.Requests) < cfg.Requests {
		r := p.next()
		if r.Prev >= 0 {
			w.Requests[r.Prev].Next = r.ID
		}
		if r.Hot {
			w.Hot++
		}
		if r.Fork {
			w.Forks++
		}
		w.Requests = append(w.Requests, r)
	}
	w.Span = p.now
	if err := hashAll(w, h, p.convs); err != nil {
		return nil, err
	}
	w.Conversations = p.convs - w.Hot
	var ctx, n float64
	for i := range w.Requests {
		r := &w.Requests[i]
		if !r.Hot {
			ctx += float64(len(r.Prompt) - cfg.SharedTokens)
			n++
		}
		w.MaxBlocks = max(w.MaxBlocks, (len(r.Full)+h.BlockSize()-1)/h.BlockSize())
	}
	if n > 0 {
		w.MeanContext = ctx / n
	}
	return w, nil
}

// Generator draws the requests of a workload one at a time, the same ones
// Plan lists for the same configuration, without end: a live run (kvindex
// sim) sends them as they come and keeps none. Requests is ignored.
type Generator struct{ p *planner }

// NewGenerator returns the generator of cfg's requests; est is as Plan's.
func NewGenerator(cfg WorkloadConfig, est func(newTokens, output int) time.Duration) (*Generator, error) {
	if err := cfg.validate(false); err != nil {
		return nil, err
	}
	return &Generator{p: newPlanner(cfg, est)}, nil
}

// Next returns the next request. Its Prev is the ID of its conversation's
// previous request; Next is -1 and Keys nil, as only the whole workload
// knows them.
func (g *Generator) Next() Request { return g.p.next() }

// next plans the next arrival: a hot request, or the next turn of the
// conversation in the slot it draws.
func (p *planner) next() Request {
	gap := p.arrival.ExpFloat64() / p.cfg.Rate
	p.now += time.Duration(gap * float64(time.Second))
	if p.cfg.HotShare > 0 && p.arrival.Float64() < p.cfg.HotShare {
		return p.hotRequest(p.now)
	}
	s := p.pickSlot(&p.now)
	return p.turn(s, p.now)
}

// pickSlot draws an idle slot by Zipf weight; if every conversation is
// waiting for an answer, the arrival waits for the first to be free.
func (p *planner) pickSlot(now *time.Duration) int {
	var total float64
	for {
		total = 0
		for i, s := range p.slots {
			if s.busyUntil <= *now {
				total += p.weights[i]
			}
		}
		if total > 0 {
			break
		}
		next := p.slots[0].busyUntil
		for _, s := range p.slots[1:] {
			next = min(next, s.busyUntil)
		}
		*now = next
	}
	x := p.arrival.Float64() * total
	last := 0
	for i, s := range p.slots {
		if s.busyUntil > *now {
			continue
		}
		last = i
		if x < p.weights[i] {
			return i
		}
		x -= p.weights[i]
	}
	return last // rounding
}

// turn plans the next request of slot s's conversation, starting a new
// conversation when the slot has none or its conversation has ended.
func (p *planner) turn(s int, now time.Duration) Request {
	sl := &p.slots[s]
	newTokens := 0
	fork := false
	if sl.conv == nil || sl.conv.turnsLeft == 0 {
		var parent *conversation
		if p.arrival.Float64() < p.cfg.ForkProb {
			parent = p.pickParent(s)
		}
		c := p.newConversation()
		if parent != nil {
			// A sub-agent: the parent's whole context, then its own instructions.
			c.tokens = make([]uint64, 0, len(parent.tokens)+p.cfg.ForkPromptMax+p.cfg.Turns*(p.cfg.MessageMax+p.cfg.OutputMax))
			c.tokens = append(c.tokens, parent.tokens...)
			n := between(c.rng, p.cfg.ForkPromptMin, p.cfg.ForkPromptMax)
			c.tokens = randomTokens(c.rng, c.tokens, n, p.cfg.Vocab)
			c.turnsLeft = max(1, p.cfg.Turns/2)
			newTokens = n
			fork = true
		} else {
			n := between(c.rng, p.cfg.HistoryMin, p.cfg.HistoryMax)
			c.tokens = make([]uint64, 0, len(p.shared)+n+p.cfg.Turns*(p.cfg.MessageMax+p.cfg.OutputMax))
			c.tokens = append(c.tokens, p.shared...)
			c.tokens = randomTokens(c.rng, c.tokens, n, p.cfg.Vocab)
			c.turnsLeft = p.cfg.Turns
			newTokens = n
		}
		sl.conv = c
	} else {
		// The previous answer is already in tokens; add the next message.
		n := between(sl.conv.rng, p.cfg.MessageMin, p.cfg.MessageMax)
		sl.conv.tokens = randomTokens(sl.conv.rng, sl.conv.tokens, n, p.cfg.Vocab)
		newTokens = n
	}
	c := sl.conv
	out := between(c.rng, p.cfg.OutputMin, p.cfg.OutputMax)
	r := p.add(c, now, out, false)
	r.Fork = fork
	c.turnsLeft--
	sl.busyUntil = now + p.est(newTokens, out)
	return r
}

// pickParent draws the conversation a sub-agent forks from, by the same
// activity weights (busy ones included: a parent waiting for its tool call
// is the typical case); nil if no other slot holds one.
func (p *planner) pickParent(self int) *conversation {
	var total float64
	for i, s := range p.slots {
		if i != self && s.conv != nil {
			total += p.weights[i]
		}
	}
	if total == 0 {
		return nil
	}
	x := p.arrival.Float64() * total
	var last *conversation
	for i, s := range p.slots {
		if i == self || s.conv == nil {
			continue
		}
		last = s.conv
		if x < p.weights[i] {
			return s.conv
		}
		x -= p.weights[i]
	}
	return last
}

// hotRequest plans a single request: the hot prompt plus a unique suffix.
func (p *planner) hotRequest(now time.Duration) Request {
	c := p.newConversation()
	n := between(c.rng, p.cfg.HotSuffixMin, p.cfg.HotSuffixMax)
	out := between(c.rng, p.cfg.HotOutputMin, p.cfg.HotOutputMax)
	c.tokens = make([]uint64, 0, len(p.hot)+n+out)
	c.tokens = append(c.tokens, p.hot...)
	c.tokens = randomTokens(c.rng, c.tokens, n, p.cfg.Vocab)
	return p.add(c, now, out, true)
}

func (p *planner) newConversation() *conversation {
	id := p.convs
	p.convs++
	return &conversation{id: id, rng: newRand(p.cfg.Seed, streamConv+uint64(id)), last: -1}
}

// add returns the request made of c's current tokens and out generated
// tokens, which become part of c's context.
func (p *planner) add(c *conversation, now time.Duration, out int, hot bool) Request {
	id := p.requests
	p.requests++
	n := len(c.tokens)
	c.tokens = randomTokens(c.rng, c.tokens, out, p.cfg.Vocab)
	r := Request{
		ID: id, Conv: c.id, Turn: c.turns, Prev: c.last, Next: -1, Planned: now,
		Prompt: c.tokens[:n:n], Full: c.tokens[: n+out : n+out], Hot: hot,
	}
	c.turns++
	c.last = id
	return r
}

// hashAll computes every prompt's block keys: one chain per conversation
// over its final token list, its last request's Full, of which each of
// its prompts is a prefix. convs is the number of conversations.
func hashAll(w *Workload, h *blockhash.Hasher, convs int) error {
	last := make([]int, convs)
	for i := range w.Requests {
		last[w.Requests[i].Conv] = i
	}
	keys := make([][]uint64, convs)
	var chain []blockhash.Hash
	var err error
	for i := range w.Requests {
		r := &w.Requests[i]
		if keys[r.Conv] == nil {
			chain, err = h.Chain(chain[:0], nil, 0, w.Requests[last[r.Conv]].Full, nil)
			if err != nil {
				return fmt.Errorf("hashing conversation %d: %w", r.Conv, err)
			}
			ks := make([]uint64, len(chain))
			for j := range chain {
				ks[j] = chain[j].Key
			}
			keys[r.Conv] = ks
		}
		r.Keys = keys[r.Conv][:len(r.Prompt)/h.BlockSize()]
	}
	return nil
}

// between draws uniformly from [lo, hi].
func between(r *rand.Rand, lo, hi int) int { return lo + r.IntN(hi-lo+1) }

// randomTokens appends n token ids drawn from [0, vocab).
func randomTokens(r *rand.Rand, dst []uint64, n, vocab int) []uint64 {
	for range n {
		dst = append(dst, r.Uint64N(uint64(vocab)))
	}
	return dst
}
