package demo

import (
	"container/heap"
	"context"
	"fmt"
	"time"
)

// Engine is what the simulation needs of one inference engine. The real
// implementation drives a kvevents/enginesim engine and records when each
// of its event batches was published.
type engine interface {
	// Process admits tokens at simulated time now: the longest cached
	// prefix is reused, the rest is computed and cached (evicting the
	// least recently used blocks). It returns the cached token count.
	Process(now time.Duration, tokens []uint64) (cached int, err error)
	// Lookup returns how many leading tokens of the prompt whose block
	// keys are given the engine holds, without changing anything: the
	// engine's true cache state.
	Lookup(keys []uint64) int
	// Restart simulates a new engine process: an empty cache and a
	// sequence that starts over.
	Restart(now time.Duration) error
}

// fleetEventKind is a change of the fleet during a run.
type fleetEventKind uint8

const (
	eventRestart fleetEventKind = iota + 1 // the pod's engine restarts: cache lost
	eventJoin                              // the pod becomes routable
)

// fleetEvent is a scheduled change of the fleet (churn scenario).
type fleetEvent struct {
	At   time.Duration
	Kind fleetEventKind
	Pod  int
}

func (e fleetEvent) String() string {
	switch e.Kind {
	case eventRestart:
		return fmt.Sprintf("pod-%d restarts at %.1fs", e.Pod, e.At.Seconds())
	case eventJoin:
		return fmt.Sprintf("pod-%d joins at %.1fs", e.Pod, e.At.Seconds())
	}
	return "?"
}

// decision is what a router sees when a request arrives.
type decision struct {
	Now   time.Duration
	Req   *Request
	Cands []int // routable pods, ascending
	Depth []int // per pod: queued plus in-service requests
}

// Router picks the pod a request goes to.
type router interface {
	Name() string
	// Route returns one of d.Cands.
	Route(d *decision) (int, error)
}

// simPod is one engine of the simulation.
type simPod struct {
	eng      engine
	queue    []int // FIFO of request ids; queue[head:] is waiting
	head     int
	current  int // request in service, -1 if idle
	routable bool
}

func (p *simPod) depth() int {
	n := len(p.queue) - p.head
	if p.current >= 0 {
		n++
	}
	return n
}

type simEventKind uint8

const (
	simArrive simEventKind = iota + 1
	simDone
	simFleet
)

type simEvent struct {
	at   time.Duration
	seq  uint64 // insertion order: ties in time resolve deterministically
	kind simEventKind
	arg  int // request id (arrive), pod (done), fleet event index
}

type eventHeap []simEvent

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(simEvent)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// outcome is what happened to one request.
type outcome struct {
	Pod     int
	Arrived time.Duration
	Cached  int
	TTFT    time.Duration
}

// simulation replays a workload against one router and fresh engines.
type simulation struct {
	w        *Workload
	cost     CostModel
	router   router
	pods     []*simPod
	fleet    []fleetEvent
	events   eventHeap
	seq      uint64
	now      time.Duration
	out      []outcome
	done     int
	progress func(done int)
	ctx      context.Context // nil: not cancellable

	cands []int
	depth []int
	dec   decision
	buf   []uint64 // a trace request's tokens
}

func newSimulation(w *Workload, cost CostModel, r router, engines []engine, initial int, fleet []fleetEvent) *simulation {
	s := &simulation{
		w: w, cost: cost, router: r, fleet: fleet,
		out:   make([]outcome, len(w.Requests)),
		depth: make([]int, len(engines)),
	}
	for i, e := range engines {
		s.pods = append(s.pods, &simPod{eng: e, current: -1, routable: i < initial})
	}
	return s
}

func (s *simulation) push(at time.Duration, kind simEventKind, arg int) {
	s.seq++
	heap.Push(&s.events, simEvent{at: at, seq: s.seq, kind: kind, arg: arg})
}

// run processes every request; the returned outcomes are indexed by
// request id.
func (s *simulation) run() ([]outcome, error) {
	for i := range s.w.Requests {
		if s.w.Requests[i].Prev < 0 {
			s.push(s.w.Requests[i].Planned, simArrive, i)
		}
	}
	for i, fe := range s.fleet {
		s.push(fe.At, simFleet, i)
	}
	for n := 0; s.events.Len() > 0; n++ {
		if s.ctx != nil && n%1024 == 0 && s.ctx.Err() != nil {
			return nil, s.ctx.Err()
		}
		ev := heap.Pop(&s.events).(simEvent)
		s.now = ev.at
		var err error
		switch ev.kind {
		case simArrive:
			err = s.arrive(ev.arg)
		case simDone:
			err = s.complete(ev.arg)
		case simFleet:
			err = s.applyFleet(s.fleet[ev.arg])
		}
		if err != nil {
			return nil, err
		}
	}
	if s.done != len(s.w.Requests) {
		return nil, fmt.Errorf("simulation ended with %d of %d requests served", s.done, len(s.w.Requests))
	}
	return s.out, nil
}

func (s *simulation) arrive(id int) error {
	r := &s.w.Requests[id]
	s.cands = s.cands[:0]
	for i, p := range s.pods {
		s.depth[i] = p.depth()
		if p.routable {
			s.cands = append(s.cands, i)
		}
	}
	s.dec = decision{Now: s.now, Req: r, Cands: s.cands, Depth: s.depth}
	pi, err := s.router.Route(&s.dec)
	if err != nil {
		return fmt.Errorf("%s: request %d at %v: %w", s.router.Name(), id, s.now, err)
	}
	if pi < 0 || pi >= len(s.pods) || !s.pods[pi].routable {
		return fmt.Errorf("%s: request %d routed to pod %d, not a candidate", s.router.Name(), id, pi)
	}
	s.out[id] = outcome{Pod: pi, Arrived: s.now}
	p := s.pods[pi]
	p.queue = append(p.queue, id)
	if p.current < 0 {
		return s.admit(pi)
	}
	return nil
}

// admit starts the next queued request of pod pi.
func (s *simulation) admit(pi int) error {
	p := s.pods[pi]
	if p.head == len(p.queue) {
		p.queue, p.head = p.queue[:0], 0
		return nil
	}
	id := p.queue[p.head]
	p.head++
	r := &s.w.Requests[id]
	n := r.PromptLen()
	cached, err := p.eng.Process(s.now, s.tokens(r, n))
	if err != nil {
		return fmt.Errorf("pod-%d: request %d: %w", pi, id, err)
	}
	cached = min(cached, n)
	o := &s.out[id]
	o.Cached = cached
	o.TTFT = s.now - o.Arrived + s.cost.Prefill(n-cached)
	p.current = id
	s.push(s.now+s.cost.Service(n-cached, r.Output()), simDone, pi)
	return nil
}

// complete finishes pod pi's request: its output joins the cache, the
// conversation may send its next turn, and the pod takes the next request.
func (s *simulation) complete(pi int) error {
	p := s.pods[pi]
	id := p.current
	r := &s.w.Requests[id]
	if _, err := p.eng.Process(s.now, s.tokens(r, r.PromptLen()+r.Output())); err != nil {
		return fmt.Errorf("pod-%d: request %d completion: %w", pi, id, err)
	}
	p.current = -1
	s.done++
	if s.progress != nil {
		s.progress(s.done)
	}
	if r.Next >= 0 {
		s.push(max(s.w.Requests[r.Next].Planned, s.now), simArrive, r.Next)
	}
	return s.admit(pi)
}

// tokens returns the first n tokens of r's Full: a slice of it, or a
// trace request's tokens made in s.buf, valid until the next call.
func (s *simulation) tokens(r *Request, n int) []uint64 {
	if r.trace == nil {
		return r.Full[:n:n]
	}
	s.buf = r.appendTokens(s.buf[:0], n)
	return s.buf
}

func (s *simulation) applyFleet(fe fleetEvent) error {
	p := s.pods[fe.Pod]
	switch fe.Kind {
	case eventRestart:
		if err := p.eng.Restart(s.now); err != nil {
			return fmt.Errorf("pod-%d restart: %w", fe.Pod, err)
		}
	case eventJoin:
		p.routable = true
	}
	return nil
}
