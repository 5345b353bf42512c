package demo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/picker"
)

// Options configures a demo run: the settings (Config; start from
// Defaults()) and what only a program sets.
type Options struct {
	Config
	// Routers selects the routers to run (nil: all of Routers).
	Routers []string
	// Timeout bounds each wait, in real time, for the event path (0: 10s).
	Timeout time.Duration
	// Parallel is the number of router runs at once (0: GOMAXPROCS).
	Parallel int
	// Progress, if set, is called as requests complete, from any goroutine.
	Progress func(done, total int)
	// Workload, if set, adjusts the scenario's traffic (token counts,
	// skew, forks) after Config's size fields are applied.
	Workload func(*WorkloadConfig)

	keepText bool // keep a trace's text prompts (LoadTrace)
}

// defaults fills the zero fields that only a program sets; the Config
// fields are taken as given.
func (o *Options) defaults() {
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Parallel <= 0 {
		o.Parallel = runtime.GOMAXPROCS(0)
	}
	if o.Routers == nil {
		o.Routers = Routers
	}
}

// Report is the outcome of a run. Its JSON form is a contract:
// scenario, pods and routers (the standard routers, in Routers order)
// always appear; extra_routers holds the row a scenario adds (hot-prefix:
// precise with load weight 0; sessions: session-affinity).
type Report struct {
	Scenario       string         `json:"scenario"`
	Pods           int            `json:"pods"`
	Seed           uint64         `json:"seed"`
	Sessions       int            `json:"sessions"`
	Requests       int            `json:"requests"`
	CapacityBlocks int            `json:"capacity_blocks"`
	Routers        []RouterResult `json:"routers"`
	Extra          []RouterResult `json:"extra_routers,omitempty"`
	// Trace describes the replayed trace and its ceiling (scenario
	// "trace"); each router's of_ceiling is its cached fraction over it.
	Trace *TraceInfo `json:"trace,omitempty"`

	// Setup explains the run's sizing, one line each (capacity arithmetic,
	// traffic, fleet events).
	Setup []string `json:"-"`
	marks []mark   // fleet changes on the timeline
}

// mark is a fleet change placed on the request axis: the first request
// planned at or after it.
type mark struct {
	request int
	label   string
}

// Router returns the named result (standard or extra), or nil.
func (r *Report) Router(name string) *RouterResult {
	for i := range r.Routers {
		if r.Routers[i].Name == name {
			return &r.Routers[i]
		}
	}
	for i := range r.Extra {
		if r.Extra[i].Name == name {
			return &r.Extra[i]
		}
	}
	return nil
}

// PreciseNoLoad names the hot-prefix scenario's extra row.
const PreciseNoLoad = "precise(load=0)"

// scenarioExtra is the extra row each scenario adds to the standard
// routers, and extraAfter the standard row a table lists it after (none:
// last).
var (
	scenarioExtra = map[string]string{ScenarioHotPrefix: PreciseNoLoad, ScenarioSessions: RouterSessionAffinity}
	extraAfter    = map[string]string{RouterSessionAffinity: RouterConsistentHash}
)

// rows lists the report's results in table order: the standard routers,
// each followed by the extra rows placed after it, then the other extra
// rows.
func (r *Report) rows() []RouterResult {
	var out []RouterResult
	placed := map[string]bool{}
	for _, std := range r.Routers {
		out = append(out, std)
		for _, x := range r.Extra {
			if extraAfter[x.Name] == std.Name {
				out = append(out, x)
				placed[x.Name] = true
			}
		}
	}
	for _, x := range r.Extra {
		if !placed[x.Name] {
			out = append(out, x)
		}
	}
	return out
}

// GatewayReplicas is the number of gateway replicas of the gateways
// scenario.
const GatewayReplicas = 3

// tokensPerGPU is what one 80 GB GPU holds of a 32B model's KV cache:
// bf16 weights take ~64 GB, and at 64 layers x 8 KV heads x 128 dims x 2
// (K and V) x 2 bytes = 256 KiB per token, the ~10 GB left hold ~40k tokens.
const tokensPerGPU = 40_000

// runPlan is everything a run needs before the routers start.
type runPlan struct {
	w        *Workload
	h        *blockhash.Hasher
	capacity int          // blocks per engine
	engines  int          // engines to start (churn adds one)
	fleet    []fleetEvent // scheduled fleet changes
	setup    []string     // the sizing, explained
	trace    *TraceInfo   // the replayed trace; nil: a generated workload
}

// Hasher returns the simulated engines' block hashing, which requests'
// Keys and the ceiling are computed with: vLLM's default block size (the
// ceiling depends on nothing else).
func Hasher() (*blockhash.Hasher, error) {
	return blockhash.New(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: blockhash.DefaultSeed, BlockSize: engineBlockSize})
}

// plan builds the run's workload, capacity and fleet events from o
// without running anything.
func (o *Options) plan() (*runPlan, error) {
	h, err := Hasher()
	if err != nil {
		return nil, err
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	if o.Trace != "" {
		return o.planTrace(h)
	}
	wc := DefaultWorkload(o.Scenario)
	wc.Seed, wc.Conversations, wc.Turns, wc.Requests = o.Seed, o.Sessions, o.Turns, o.requests()
	if o.Workload != nil {
		o.Workload(&wc)
	}
	ideal := o.idealService(&wc)
	wc.Rate = o.Load * float64(o.Pods) / ideal.Seconds()
	est := func(newTokens, output int) time.Duration { return o.Cost.Service(newTokens, output) }
	w, err := Plan(wc, h, est)
	if err != nil {
		return nil, err
	}
	bs := h.BlockSize()
	working := float64(wc.SharedTokens) + float64(wc.Conversations)*w.MeanContext + float64(wc.HotPrefixTokens)
	workingBlocks := int(math.Ceil(working / float64(bs)))
	capacity := o.Capacity
	var setup []string
	hot := ""
	if wc.HotPrefixTokens > 0 {
		hot = fmt.Sprintf(" + %s hot prefix", kTokens(float64(wc.HotPrefixTokens)))
	}
	setup = append(setup, fmt.Sprintf("working set: %d conversations x ~%s tokens + %s shared%s = %s tokens = %s blocks of %d",
		wc.Conversations, kTokens(w.MeanContext), kTokens(float64(wc.SharedTokens)), hot, kTokens(working), kTokens(float64(workingBlocks)), bs))
	if capacity == 0 {
		fleetBlocks := int(math.Ceil(o.CapacityFactor * float64(workingBlocks)))
		capacity = (fleetBlocks + o.Pods - 1) / o.Pods
		setup = append(setup, fmt.Sprintf("fleet capacity %.3gx = %s blocks = %s blocks per engine (~%s tokens; a 32B model on one 80 GB GPU holds ~%s)",
			o.CapacityFactor, kTokens(float64(fleetBlocks)), commas(capacity), kTokens(float64(capacity*bs)), kTokens(tokensPerGPU)))
	} else {
		setup = append(setup, fmt.Sprintf("capacity %s blocks per engine (~%s tokens) = %.2fx the working set over the fleet",
			commas(capacity), kTokens(float64(capacity*bs)), float64(capacity*o.Pods)/float64(workingBlocks)))
	}
	// Name the setting the capacity came from.
	field, source := configerr.Field("capacity"), fmt.Sprintf("%d", o.Capacity)
	if o.Capacity == 0 {
		field, source = "capacity-factor", fmt.Sprintf("%v gives %d blocks per engine, which", o.CapacityFactor, capacity)
	}
	switch {
	case capacity < w.MaxBlocks:
		return nil, configerr.New(field, "%v %s cannot hold the largest request (%d blocks)", field, source, w.MaxBlocks)
	case capacity > maxCapacity:
		return nil, configerr.New(field, "%v %s exceeds the limit of %d blocks per engine", field, source, maxCapacity)
	}
	hotReqs := ""
	if w.Hot > 0 {
		hotReqs = fmt.Sprintf("%d for the hot prompt, ", w.Hot)
	}
	setup = append(setup, fmt.Sprintf("traffic: %d requests (%s%d conversations, %d of them forked), Poisson arrivals at %.1f/s (load %.2g of the fleet's throughput with ideal caching, %s per request), seed %d",
		len(w.Requests), hotReqs, w.Conversations, w.Forks, wc.Rate, o.Load, ideal.Round(time.Millisecond), o.Seed))
	var fleet []fleetEvent
	if o.Scenario == ScenarioChurn {
		fleet = []fleetEvent{
			{At: w.Span * 2 / 5, Kind: eventRestart, Pod: o.Pods / 2},
			{At: w.Span * 3 / 5, Kind: eventJoin, Pod: o.Pods},
		}
		for _, fe := range fleet {
			setup = append(setup, "churn: "+fe.String())
		}
	}
	if o.Scenario == ScenarioGateways {
		setup = append(setup, fmt.Sprintf("gateways: %d replicas, request i goes to replica i mod %d; each keeps its own router state, all see the pods' load, precise's replicas share one kvindex",
			GatewayReplicas, GatewayReplicas))
	}
	engines := o.Pods
	for _, fe := range fleet {
		engines = max(engines, fe.Pod+1)
	}
	return &runPlan{w: w, h: h, capacity: capacity, engines: engines, fleet: fleet, setup: setup}, nil
}

// idealService is the mean service time of a request when everything but
// its new tokens hits the cache.
func (o *Options) idealService(wc *WorkloadConfig) time.Duration {
	t := float64(wc.Turns)
	conv := (float64(wc.HistoryMin+wc.HistoryMax)/2 + (t-1)*float64(wc.MessageMin+wc.MessageMax)/2) / t
	hot := float64(wc.HotSuffixMin+wc.HotSuffixMax) / 2
	newTokens := (1-wc.HotShare)*conv + wc.HotShare*hot
	out := (1-wc.HotShare)*float64(wc.OutputMin+wc.OutputMax)/2 + wc.HotShare*float64(wc.HotOutputMin+wc.HotOutputMax)/2
	return o.Cost.Service(int(newTokens), int(out))
}

func (o *Options) validate() error {
	if err := o.Config.Validate(); err != nil {
		return err
	}
	for _, r := range o.Routers {
		if !slices.Contains(Routers, r) && r != PreciseNoLoad && r != RouterSessionAffinity {
			return fmt.Errorf("unknown router %q (want one of %v)", r, Routers)
		}
	}
	return nil
}

// Run plans the workload and replays it against every router, each with
// fresh engines. It refuses settings that fail Config.Validate rather
// than replacing them. The routers run concurrently (Options.Parallel);
// each run is deterministic, so the report depends only on the options.
func Run(ctx context.Context, o Options) (*Report, error) {
	o.defaults()
	p, err := o.plan()
	if err != nil {
		return nil, err
	}
	rep := &Report{
		Scenario: o.Scenario, Pods: o.Pods, Seed: o.Seed, Sessions: o.Sessions,
		Requests: len(p.w.Requests), CapacityBlocks: p.capacity, Setup: p.setup, Trace: p.trace,
	}
	if p.trace != nil {
		rep.Scenario, rep.Sessions = ScenarioTrace, p.trace.Sessions
	}
	for _, fe := range p.fleet {
		i, _ := slices.BinarySearchFunc(p.w.Requests, fe.At, func(r Request, at time.Duration) int { return cmp.Compare(r.Planned, at) })
		label := podName(fe.Pod) + " restarts"
		if fe.Kind == eventJoin {
			label = podName(fe.Pod) + " joins"
		}
		rep.marks = append(rep.marks, mark{request: i, label: label})
	}
	names := slices.Clone(o.Routers)
	for _, extra := range o.extras(p) {
		if !slices.Contains(names, extra) {
			names = append(names, extra)
		}
	}
	results := make([]RouterResult, len(names))
	errs := make([]error, len(names))
	var (
		mu   sync.Mutex
		done int
	)
	total := len(names) * len(p.w.Requests)
	progress := func() {
		if o.Progress == nil {
			return
		}
		mu.Lock()
		done++
		d := done
		mu.Unlock()
		o.Progress(d, total)
	}
	sem := make(chan struct{}, o.Parallel)
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				errs[i] = ctx.Err()
				return
			}
			defer func() { <-sem }()
			results[i], errs[i] = o.runRouter(ctx, name, p, progress)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for _, r := range results {
		if p.trace != nil && p.trace.Ceiling > 0 {
			share := round(r.CachedFraction/p.trace.Ceiling, 4)
			r.OfCeiling = &share
		}
		if slices.Contains(Routers, r.Name) {
			rep.Routers = append(rep.Routers, r)
		} else {
			rep.Extra = append(rep.Extra, r)
		}
	}
	return rep, nil
}

// extras returns the rows a run adds to the standard routers: its
// scenario's, or for a trace every other router: precise with load weight
// 0, and session-affinity if the trace has sessions.
func (o *Options) extras(p *runPlan) []string {
	if p.trace == nil {
		if x := scenarioExtra[o.Scenario]; x != "" {
			return []string{x}
		}
		return nil
	}
	x := []string{PreciseNoLoad}
	if p.trace.Sessions > 0 {
		x = append(x, RouterSessionAffinity)
	}
	return x
}

// runRouter replays the plan's workload against one router and a fresh
// fleet.
func (o *Options) runRouter(ctx context.Context, name string, p *runPlan, progress func()) (RouterResult, error) {
	w, h, capacity, engines := p.w, p.h, p.capacity, p.engines
	events := name == RouterPrecise || name == PreciseNoLoad
	f, err := newFleet(h, engines, capacity, events, o.Timeout)
	if err != nil {
		return RouterResult{}, fmt.Errorf("%s: %w", name, err)
	}
	defer f.close()
	// One router per gateway replica (one, outside the gateways
	// scenario). Each replica has its own state: its round-robin counter,
	// its picker (session memory, speculative entries)
	// and, for approximate, its own guess of the caches. What they share
	// is built once, outside build: the fleet and its load (every
	// decision sees the pods' true depth), and precise's kvindex.
	var shared prefixSource
	switch name {
	case RouterPrecise, PreciseNoLoad:
		shared = newIndexSource(f, o.Delay)
	case RouterOracle:
		shared = &oracleSource{engines: f.engines, blockSize: h.BlockSize()}
	}
	build := func(replica int) (router, error) {
		cfg := pickerConfig(o.Weights, h.BlockSize(), o.Seed+uint64(replica))
		switch name {
		case RouterRoundRobin:
			return &roundRobin{next: replica}, nil
		case RouterLeastLoaded:
			return leastLoaded{}, nil
		case RouterConsistentHash:
			k := o.HashPrefix
			switch {
			case k == 0 && p.trace != nil:
				k = p.trace.BlockTokens
			case k == 0:
				k = w.Config.SharedTokens + 256
			}
			return newConsistentHash(f.names, k, o.VNodes), nil
		case RouterSessionAffinity:
			return newSessionAffinity(f.names, o.VNodes), nil
		case RouterApproximate:
			src, err := newApproxSource(engines, capacity, o.ApproxBlocks, h.BlockSize())
			if err != nil {
				return nil, err
			}
			return newScoring(name, cfg, src, f.names)
		case RouterPrecise, RouterOracle:
			return newScoring(name, cfg, shared, f.names)
		case PreciseNoLoad:
			// the cache alone: no load term, and none of the picker's
			// other scorers either, the hot-prefix guard included
			cfg.Weights = picker.Weights{Prefix: o.Weights.Prefix}
			return newScoring(name, cfg, shared, f.names)
		}
		return nil, fmt.Errorf("unknown router %q", name)
	}
	replicas := 1
	if o.Scenario == ScenarioGateways {
		replicas = GatewayReplicas
	}
	g := &gateways{}
	for i := range replicas {
		r, err := build(i)
		if err != nil {
			return RouterResult{}, err
		}
		g.replicas = append(g.replicas, r)
	}
	var r router = g
	if replicas == 1 {
		r = g.replicas[0]
	}
	s := newSimulation(w, o.Cost, r, f.engines, o.Pods, p.fleet)
	s.progress = func(int) { progress() }
	s.ctx = ctx
	out, err := s.run()
	if err != nil {
		return RouterResult{}, err
	}
	return score(name, w, out, engines, o.Cost), nil
}
