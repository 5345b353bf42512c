package demo

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/kvevents"
)

// delayLine sits between the subscriber and the index and makes the
// precise router's view a function of simulated time: a batch published at
// simulated time t is released into the index only once the router asks
// for the state at t+D or later. The simulation records when each batch
// was published (publish); the subscriber delivers batches whenever the
// sockets get them there (Apply, Reset); before a routing decision at
// simulated time T, flush(T-D) waits, in real time, until every batch
// published at or before T-D has been delivered, then releases exactly
// those. Wall-clock ZMQ latency is absorbed by the waiting, so a run is
// deterministic for a given seed while every batch takes the real path.
type delayLine struct {
	next    kvevents.Sink
	timeout time.Duration

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every delivery
	lines   map[kvevents.EngineID]*line
	order   []kvevents.EngineID // release order: registration order
}

// line is one engine's stream through the delay line.
type line struct {
	published []time.Duration // simulated publish time of each batch, in order
	received  int             // batches delivered by the subscriber
	released  int             // batches released into the index
	held      []heldItem      // delivered, not yet released, in order
}

// heldItem is a delivered batch, or a reset that precedes the next batch.
type heldItem struct {
	reset  bool
	reason kvevents.ResetReason
	seq    uint64
	events []kvevents.Event
}

func newDelayLine(next kvevents.Sink, timeout time.Duration) *delayLine {
	return &delayLine{next: next, timeout: timeout, changed: make(chan struct{}), lines: map[kvevents.EngineID]*line{}}
}

// register declares an engine, fixing the order flush releases in.
func (d *delayLine) register(e kvevents.EngineID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.lines[e]; !ok {
		d.lines[e] = &line{}
		d.order = append(d.order, e)
	}
}

// publish records that engine e published n batches at simulated time at.
func (d *delayLine) publish(e kvevents.EngineID, at time.Duration, n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	l := d.lines[e]
	for range n {
		l.published = append(l.published, at)
	}
}

func (d *delayLine) signal() {
	close(d.changed)
	d.changed = make(chan struct{})
}

// Apply implements kvevents.Sink: it holds a copy of the batch (the
// subscriber reuses the events' storage after the call).
func (d *delayLine) Apply(e kvevents.EngineID, seq uint64, events []kvevents.Event) {
	cp := make([]kvevents.Event, len(events))
	for i := range events {
		cp[i] = cloneEvent(&events[i])
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	l := d.lines[e]
	if l == nil { // an engine the demo did not start: nothing to order it by
		return
	}
	l.held = append(l.held, heldItem{seq: seq, events: cp})
	l.received++
	d.signal()
}

// Reset implements kvevents.Sink. The subscriber reports a restart just
// before the new process's first batch, so the reset is released with it.
func (d *delayLine) Reset(e kvevents.EngineID, reason kvevents.ResetReason) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if l := d.lines[e]; l != nil {
		l.held = append(l.held, heldItem{reset: true, reason: reason})
		d.signal()
	}
}

// due returns how many of l's batches were published at or before cutoff.
func (l *line) due(cutoff time.Duration) int {
	n, _ := slices.BinarySearchFunc(l.published, cutoff, func(t, c time.Duration) int {
		if t <= c {
			return -1
		}
		return 1
	})
	return n
}

// flush releases into the index every batch published at or before
// cutoff, after waiting (up to the timeout, in real time) for the
// subscriber to deliver them.
func (d *delayLine) flush(cutoff time.Duration) error {
	deadline := time.Now().Add(d.timeout)
	var timer *time.Timer
	for {
		d.mu.Lock()
		missing := kvevents.EngineID{}
		want, got := 0, 0
		for _, e := range d.order {
			l := d.lines[e]
			if n := l.due(cutoff); l.received < n {
				missing, want, got = e, n, l.received
				break
			}
		}
		if want == 0 {
			break // every due batch delivered; d.mu still held
		}
		ch := d.changed
		d.mu.Unlock()
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("event path: %s published %d batches by simulated time %v, the subscriber delivered %d within %v",
				missing, want, cutoff, got, d.timeout)
		}
		if timer == nil {
			timer = time.NewTimer(left)
			defer timer.Stop()
		}
		select {
		case <-ch:
		case <-timer.C:
		}
	}
	// Collect under the lock, apply outside it: the subscriber keeps
	// delivering while the index ingests.
	type release struct {
		e     kvevents.EngineID
		items []heldItem
	}
	var out []release
	for _, e := range d.order {
		l := d.lines[e]
		n := l.due(cutoff)
		take := 0
		for i, it := range l.held {
			if it.reset {
				continue
			}
			if l.released >= n {
				break
			}
			l.released++
			take = i + 1
		}
		if take > 0 {
			out = append(out, release{e: e, items: slices.Clone(l.held[:take])})
			l.held = slices.Delete(l.held, 0, take)
		}
	}
	d.mu.Unlock()
	for _, r := range out {
		for _, it := range r.items {
			if it.reset {
				d.next.Reset(r.e, it.reason)
			} else {
				d.next.Apply(r.e, it.seq, it.events)
			}
		}
	}
	return nil
}

// cloneEvent deep-copies an event whose slices the subscriber will reuse.
func cloneEvent(ev *kvevents.Event) kvevents.Event {
	c := *ev
	c.Hashes = slices.Clone(ev.Hashes)
	c.TokenIDs = slices.Clone(ev.TokenIDs)
	c.ParentDigest = slices.Clone(ev.ParentDigest)
	if ev.Digests != nil {
		c.Digests = make([][]byte, len(ev.Digests))
		for i, d := range ev.Digests {
			c.Digests[i] = slices.Clone(d)
		}
	}
	if ev.ExtraKeys != nil {
		c.ExtraKeys = make([]blockhash.BlockExtra, len(ev.ExtraKeys))
		for i, k := range ev.ExtraKeys {
			c.ExtraKeys[i] = cloneValues(k)
		}
	}
	return c
}

func cloneValues(vs []blockhash.Value) []blockhash.Value {
	if vs == nil {
		return nil
	}
	out := make([]blockhash.Value, len(vs))
	for i, v := range vs {
		out[i] = v
		out[i].Bytes = slices.Clone(v.Bytes)
		out[i].Tuple = cloneValues(v.Tuple)
	}
	return out
}
