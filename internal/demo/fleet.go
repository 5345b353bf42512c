package demo

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/enginesim/simzmq"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
	"github.com/kvindex/kvindex/picker"
)

// model is the model name the simulated fleet serves.
const model = "demo-32b"

// podName names pod i.
func podName(i int) string { return "pod-" + strconv.Itoa(i) }

// fleet is one router run's engines, plus, for the precise router, the
// event path: engines' PUB sockets -> zmqtransport.Subscriber -> delay
// line -> indexer.Index.
type fleet struct {
	sims    []*simzmq.Engine
	engines []engine
	names   []string

	sub  *zmqtransport.Subscriber
	line *delayLine
	ix   *indexer.Index
}

// simEngine adapts an enginesim engine to the simulation and, when the
// event path is on, tells the delay line when each batch was published.
type simEngine struct {
	e    *simzmq.Engine
	id   kvevents.EngineID
	bs   int
	line *delayLine
}

func (s *simEngine) Process(now time.Duration, tokens []uint64) (int, error) {
	before := s.e.Seq()
	n, err := s.e.Process(tokens, nil)
	if s.line != nil {
		if after := s.e.Seq(); after > before {
			s.line.publish(s.id, now, int(after-before))
		}
	}
	return n, err
}

func (s *simEngine) Lookup(keys []uint64) int { return s.e.LookupKeys(keys) * s.bs }

func (s *simEngine) Restart(time.Duration) error {
	// New sockets, and nothing published: the reconnect and the new
	// process's first batch reveal it.
	return s.e.Restart()
}

// newFleet starts n engines of capacity blocks each. With events, it also
// starts the subscriber and the index and waits until every engine's
// stream is live.
func newFleet(h *blockhash.Hasher, n, capacity int, events bool, timeout time.Duration) (_ *fleet, err error) {
	f := &fleet{}
	defer func() {
		if err != nil {
			f.close()
		}
	}()
	if events {
		f.ix, err = indexer.New(indexer.Options{Hasher: h})
		if err != nil {
			return nil, fmt.Errorf("index: %w", err)
		}
		f.line = newDelayLine(f.ix, timeout)
	}
	var cfgs []zmqtransport.EngineConfig
	for i := range n {
		// Without the event path nobody listens: keep one batch for
		// replay rather than the default 10,000 payloads. With it, the
		// run never lets the subscriber fall behind by more than the
		// batches of one decision, so a short buffer covers any replay.
		cfg := enginesim.Config{Pod: podName(i), Model: model, Hasher: h, CapacityBlocks: capacity, BufferSteps: 1}
		var pcfg zmqtransport.PublisherConfig
		if events {
			pcfg.ReplayEndpoint = "tcp://127.0.0.1:*"
			cfg.BufferSteps = 1024
		}
		e, err := simzmq.New(cfg, pcfg)
		if err != nil {
			return nil, fmt.Errorf("engine %s: %w", podName(i), err)
		}
		f.sims = append(f.sims, e)
		f.names = append(f.names, podName(i))
		se := &simEngine{e: e, id: e.EngineID(), bs: h.BlockSize()}
		if events {
			se.line = f.line
			f.line.register(se.id)
			cfgs = append(cfgs, zmqtransport.EngineConfig{
				Name: podName(i), Model: model, Endpoint: e.PubEndpoint(), ReplayEndpoint: e.ReplayEndpoint(),
			})
		}
		f.engines = append(f.engines, se)
	}
	if !events {
		return f, nil
	}
	f.sub, err = zmqtransport.NewSubscriber(zmqtransport.SubscriberConfig{Engines: cfgs, Pollers: 1}, f.line, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, fmt.Errorf("subscriber: %w", err)
	}
	if err := f.sub.Start(); err != nil {
		return nil, fmt.Errorf("subscriber: %w", err)
	}
	if err := f.waitLive(timeout); err != nil {
		return nil, err
	}
	return f, nil
}

// waitLive makes sure every engine's live stream reaches the delay line
// before the simulation starts. A PUB socket drops what it sends before a
// subscription has reached it, and a stream whose only batch was dropped
// would stall the first flush, so each engine publishes an
// AllBlocksCleared (harmless on an empty cache) until one arrives live.
// Arriving is not enough: the subscriber replays from 0 when it connects,
// which can deliver a probe that the PUB socket dropped while the
// subscription was still on its way; the next batch, sent right after,
// would then be lost with nothing behind it to reveal the gap. So a probe
// counts only if every probe so far has arrived and no replay brought it.
// The probes count as published before simulated time 0.
func (f *fleet) waitLive(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for i, e := range f.sims {
		id := e.EngineID()
		for sent := 1; ; sent++ {
			replays := f.replays(id)
			if err := e.Clear(); err != nil {
				return fmt.Errorf("engine %s: %w", f.names[i], err)
			}
			f.line.publish(id, -1, 1)
			if f.line.waitReceived(id, sent, 20*time.Millisecond) && f.replays(id) == replays {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("event path: no batch of %s reached the subscriber live within %v", f.names[i], timeout)
			}
		}
	}
	return f.line.flush(-1)
}

// replays returns how many replays the subscriber has run or started for
// engine id.
func (f *fleet) replays(id kvevents.EngineID) uint64 {
	for _, st := range f.sub.Streams() {
		if st.Engine == id {
			n := st.ReplaysOK + st.ReplaysFailed
			if st.Replaying {
				n++
			}
			return n
		}
	}
	return 0
}

// waitReceived waits up to d for engine e to have delivered n batches.
func (d *delayLine) waitReceived(e kvevents.EngineID, n int, wait time.Duration) bool {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		d.mu.Lock()
		got := d.lines[e].received
		ch := d.changed
		d.mu.Unlock()
		if got >= n {
			return true
		}
		select {
		case <-ch:
		case <-timer.C:
			return false
		}
	}
}

func (f *fleet) close() error {
	var errs []error
	if f.sub != nil {
		errs = append(errs, f.sub.Close())
	}
	for _, e := range f.sims {
		errs = append(errs, e.Close())
	}
	return errors.Join(errs...)
}

// indexSource is the precise router's view: kvindex's LongestPrefix over
// the index the event path fills, as of D before the decision.
type indexSource struct {
	f      *fleet
	delay  time.Duration
	byName map[string]int
	q      indexer.Query
	res    indexer.Result
}

func newIndexSource(f *fleet, delay time.Duration) *indexSource {
	s := &indexSource{f: f, delay: delay, byName: map[string]int{}}
	for i, n := range f.names {
		s.byName[n] = i
	}
	s.q.Model = model
	return s
}

func (s *indexSource) matched(d *decision, pre []picker.Prefix) (int, error) {
	if err := s.f.line.flush(d.Now - s.delay); err != nil {
		return 0, err
	}
	s.q.BlockHashes = d.Req.Keys
	s.q.Candidates = s.q.Candidates[:0]
	for _, p := range d.Cands {
		s.q.Candidates = append(s.q.Candidates, s.f.names[p])
	}
	if err := s.f.ix.LongestPrefix(&s.q, &s.res); err != nil {
		return 0, fmt.Errorf("index query: %w", err)
	}
	for _, pm := range s.res.Pods {
		if p, ok := s.byName[pm.Engine.Pod]; ok {
			pre[p] = prefixOf(&pm)
		}
	}
	return 0, nil
}

// prefixOf is the picker's view of one engine's match: its blocks by
// tier. The demo's engines keep everything on the GPU; in a real fleet
// an offloading engine reports CPU, and anything else counts as disk.
func prefixOf(pm *indexer.PodMatch) picker.Prefix {
	var p picker.Prefix
	for _, t := range pm.Tiers {
		switch {
		case strings.EqualFold(t.Medium, kvevents.MediumGPU):
			p.GPU += t.Blocks
		case strings.EqualFold(t.Medium, "cpu"):
			p.CPU += t.Blocks
		}
	}
	p.GPU = min(p.GPU, pm.MatchedBlocks)
	p.CPU = min(p.CPU, pm.MatchedBlocks-p.GPU)
	p.Disk = pm.MatchedBlocks - p.GPU - p.CPU
	return p
}

func (*indexSource) routed(*decision, int) {}
