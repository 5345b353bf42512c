package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/internal/lifecycle"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/enginesim/simhttp"
	"github.com/kvindex/kvindex/kvevents/enginesim/simzmq"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
	"github.com/kvindex/kvindex/tokenizer"
)

// Engine is one simulated engine rank and where it publishes. All of
// simzmq.Engine's methods are promoted.
type Engine struct {
	Pod   string
	Rank  int
	Topic string // bind mode: the topic of its events ("" in connect mode)
	*simzmq.Engine
}

// Name is the engine rank as kvindex names it: pod, or pod/rank.
func (e *Engine) Name() string { return client.EngineName(e.Pod, uint32(e.Rank)) }

// Front is an engine's HTTP front.
type Front struct {
	Pod  string
	Addr string // host:port, as it listens
}

// Event is what Options.Observe is told: Started, Request, HTTPRequest or
// Finished.
type Event interface{ event() }

// Started tells that the engines and their HTTP fronts are up; the
// workload starts next.
type Started struct {
	Engines []*Engine // by engine, then rank
	Fronts  []Front   // by engine, with HTTPPort
}

// Request is a request of the workload, made.
type Request struct {
	Time   time.Time
	N      int     // the requests made before it
	Conv   int     // its conversation
	Turn   int     // its turn in the conversation, from 0
	Engine *Engine // the engine rank it went to
	Tokens int     // its prompt's tokens
	Cached int     // of them, the ones the engine had cached
}

// HTTPRequest is a request to an engine's HTTP front, served or refused.
type HTTPRequest struct {
	Time   time.Time
	Pod    string  // the engine whose front it reached
	Engine *Engine // the rank that ran it; nil for a refusal or a tokenization
	simhttp.Request
}

// Finished tells that the workload has made its Options.Requests; the
// engines stay up.
type Finished struct{ Requests int }

func (Started) event()     {}
func (Request) event()     {}
func (HTTPRequest) event() {}
func (Finished) event()    {}

// Sim is a planned sim, ready to run.
type Sim struct {
	plan      *Plan
	tok       *tokenizer.Local // nil: token-id prompts
	work      *workload        // nil without a workload (Rate 0)
	observeMu sync.Mutex       // Observe hears one event at a time
	ended     bool             // Run has returned: Observe hears no more, under observeMu
	ran       atomic.Bool

	// Set as Run starts its parts, in order; read once Started is told.
	engines []*Engine
	fronts  []Front
	log     *os.File // the prompt log, with LogPrompts

	// step is held while a request is made, logged and told: holding it
	// pauses the workload between two requests.
	step sync.Mutex
	sent atomic.Int64
}

// New plans a sim from o and loads its tokenizer.
func New(o Options) (*Sim, error) {
	p, err := NewPlan(o)
	if err != nil {
		return nil, err
	}
	s := &Sim{plan: p}
	if o.Tokenizer != "" {
		if s.tok, err = loadTokenizer(o.Tokenizer); err != nil {
			return nil, err
		}
	}
	if o.Rate > 0 {
		if s.work, err = newWorkload(&p.opts, o.Engines*o.Ranks, s.tok != nil); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func loadTokenizer(path string) (*tokenizer.Local, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, configerr.New(fieldTokenizer, "%v %s: %w", fieldTokenizer, path, err)
	}
	defer f.Close()
	tok, err := tokenizer.Load(f)
	if err != nil {
		return nil, configerr.New(fieldTokenizer, "%v %s: %w", fieldTokenizer, path, err)
	}
	// The engines tokenize every turn of every conversation: with a
	// segment cache a turn costs what it adds, so that simulated engines
	// sharing cores with kvindex take little of them.
	return tok.WithSegmentCache(simTokenCacheBytes), nil
}

// simTokenCacheBytes bounds the simulated engines' shared segment cache.
const simTokenCacheBytes = 64 << 20

// Plan returns the sim's plan.
func (s *Sim) Plan() *Plan { return s.plan }

// Engines returns the engine ranks, by engine then rank, once Started
// has been told.
func (s *Sim) Engines() []*Engine { return s.engines }

// Fronts returns the engines' HTTP fronts, once Started has been told.
func (s *Sim) Fronts() []Front { return s.fronts }

// Sent returns the number of workload requests made so far.
func (s *Sim) Sent() int { return int(s.sent.Load()) }

// Pause holds the workload between two requests until Resume, so that
// the engines' caches change only through their HTTP fronts meanwhile.
// A paused sim stops only once resumed.
func (s *Sim) Pause() { s.step.Lock() }

// Resume lets a paused workload go on.
func (s *Sim) Resume() { s.step.Unlock() }

// Run starts the engines, their HTTP fronts and the workload, in that
// order, and runs them until ctx ends or one fails; it then stops them in
// reverse order and returns once every goroutine it started has ended.
// A sim runs once.
func (s *Sim) Run(ctx context.Context) error {
	if s.ran.Swap(true) {
		return errors.New("sim: Run called twice")
	}
	p := s.plan
	var g lifecycle.Group
	if p.opts.LogPrompts != "" {
		g.Add(s.promptLog())
	}
	for i := range p.pods {
		for rank := range p.opts.Ranks {
			g.Add(s.engine(i, rank))
		}
	}
	for i := range p.https {
		g.Add(s.front(i))
	}
	work := lifecycle.Part{Name: "workload", Start: func(context.Context) error {
		s.observe(Started{Engines: s.engines, Fronts: s.fronts})
		return nil
	}}
	if s.work != nil {
		work.Run = s.send
	}
	g.Add(work)
	err := g.Run(ctx)
	// An HTTP front that did not stop in time may still be answering.
	s.observeMu.Lock()
	s.ended = true
	s.observeMu.Unlock()
	return err
}

// promptLog is the part that creates the prompt log, and closes it once
// the workload has stopped.
func (s *Sim) promptLog() lifecycle.Part {
	path := s.plan.opts.LogPrompts
	return lifecycle.Part{
		Name: "prompt log",
		Start: func(context.Context) error {
			f, err := os.Create(path)
			if err != nil {
				return configerr.Failed(fieldLogPrompts, "%v %s: %w", fieldLogPrompts, path, pathCause(err))
			}
			s.log = f
			return nil
		},
		Stop: func(context.Context) error {
			if err := s.log.Close(); err != nil {
				return configerr.Failed(fieldLogPrompts, "%v %s: %w", fieldLogPrompts, path, err)
			}
			return nil
		},
	}
}

// pathCause drops the operation and path of a *fs.PathError, which the
// message names already.
func pathCause(err error) error {
	if pe, ok := errors.AsType[*fs.PathError](err); ok {
		return pe.Err
	}
	return err
}

// engine is the part that runs rank of engine i.
func (s *Sim) engine(i, rank int) lifecycle.Part {
	p, o := s.plan, &s.plan.opts
	e := &Engine{Pod: p.pods[i], Rank: rank}
	pcfg := zmqtransport.PublisherConfig{Endpoint: p.pubs[i][rank], Connect: !p.connectMode}
	// The port a taken one is among: the event ports, where the engines
	// bind them, else the replay ports.
	ports := fieldPort
	if !p.connectMode {
		e.Topic = "kv@" + e.Pod + "@" + o.Model
		pcfg.Topic = e.Topic
		ports = fieldReplayPort
		if p.connect == listenEndpoint(p.connect) {
			// On loopback the engine connects from its own address,
			// the one it is named by, as a pod does from its IP, so
			// that kvindex's allow rules tie the name to the source
			// (ZMQ's "tcp://SOURCE;DESTINATION").
			pcfg.Endpoint = "tcp://" + e.Pod + ":0;" + strings.TrimPrefix(p.connect, "tcp://")
		}
	}
	if p.replay {
		pcfg.ReplayEndpoint = p.replays[i][rank]
	}
	return lifecycle.Part{
		Name: e.Name(),
		Start: func(context.Context) error {
			z, err := simzmq.New(enginesim.Config{
				Pod: e.Pod, Model: o.Model, DPRank: rank, Hasher: o.Hasher, CapacityBlocks: o.Capacity,
			}, pcfg)
			if err != nil {
				return configerr.Failed(ports, "%s: %w (another program holds the port? choose others with %v and %v)", e.Name(), err, fieldPort, fieldReplayPort)
			}
			e.Engine = z
			s.engines = append(s.engines, e)
			return nil
		},
		Stop: func(context.Context) error { return e.Close() },
	}
}

// send makes the workload's requests, spaced as the generator plans
// their arrivals, until ctx ends or Options.Requests are made.
func (s *Sim) send(ctx context.Context) error {
	limit := s.plan.opts.Requests
	timer := time.NewTimer(0) // the first request goes at once
	defer timer.Stop()
	var prev time.Duration // the previous request's planned arrival
	for n := 0; limit == 0 || n < limit; n++ {
		req := s.work.next()
		if n > 0 {
			timer.Reset(req.Planned - prev)
		}
		prev = req.Planned
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		if err := s.request(ctx, n, req); err != nil {
			return err
		}
	}
	s.observe(Finished{Requests: limit})
	return nil
}

// request makes request n on its engine, logs its prompt and tells of it.
func (s *Sim) request(ctx context.Context, n int, req request) error {
	s.step.Lock()
	defer s.step.Unlock()
	ids := req.Prompt
	if s.tok != nil {
		var err error
		if ids, err = s.tok.Tokenize(ctx, s.plan.opts.Model, tokenizer.Input{Prompt: req.text}); err != nil {
			return fmt.Errorf("tokenizing request %d: %w", n, err)
		}
	}
	e := s.engines[req.target]
	cached, err := e.Process(ids, nil)
	if err != nil {
		return fmt.Errorf("%s: %w", e.Name(), err)
	}
	if s.log != nil {
		line := req.text
		if s.tok == nil {
			line = formatIDs(ids)
		}
		if _, err := io.WriteString(s.log, line+"\n"); err != nil {
			return configerr.Failed(fieldLogPrompts, "%v: %w", fieldLogPrompts, err)
		}
	}
	s.observe(Request{Time: time.Now(), N: n, Conv: req.Conv, Turn: req.Turn, Engine: e, Tokens: len(ids), Cached: cached})
	s.sent.Add(1)
	return nil
}

// formatIDs writes token ids comma-separated, as kvindex's clients read
// them.
func formatIDs(ids []uint64) string {
	b := make([]byte, 0, len(ids)*7)
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, id, 10)
	}
	return string(b)
}

// observe tells Observe of ev, one event at a time.
func (s *Sim) observe(ev Event) {
	if s.plan.opts.Observe == nil {
		return
	}
	s.observeMu.Lock()
	defer s.observeMu.Unlock()
	if !s.ended {
		s.plan.opts.Observe(ev)
	}
}
