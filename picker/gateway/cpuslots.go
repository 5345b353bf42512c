package gateway

import (
	"context"
	"io"
	"runtime"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// cpuSlots is how many requests the picker lets do their CPU work at
// once (reading the body, rendering and tokenizing the prompt, hashing
// its blocks): one fewer than the cores Go runs on, at least one. That
// work's total a burst cannot shrink; run on every core at once, it
// would hold the cores for up to the scheduler's 10 ms slices while the
// index queries of requests already prepared, a few microseconds of CPU
// each under a deadline of milliseconds, wait for one and time out.
// Queued instead, each request is prepared at full speed and its query
// finds a core free (BenchmarkPickerChatTurn/remote-c64).
func cpuSlots() int { return max(runtime.GOMAXPROCS(0)-1, 1) }

// bodySlots is how many requests the picker reads the body of at once,
// from its first byte until the body has gone back to Envoy (ext_proc)
// or the answer is written (/v1/pick): as many as the cores Go runs on.
// The others wait with their bytes unread (held at the client by gRPC's
// or TCP's flow control) instead of each keeping a goroutine busy with
// frames on the cores, where the goroutines of the index queries' round
// trips would queue behind them and time out
// (BenchmarkPickerChatTurn/remote-c64, /remote-http-c64; README has the
// figures).
func bodySlots() int { return runtime.GOMAXPROCS(0) }

// bodySlotPatience is how long a request holding a body slot may wait
// for its next frame before it gives the slot back (and queues for one
// again when the frame comes): a client that uploads slowly never holds
// up the requests behind it.
const bodySlotPatience = 2 * time.Millisecond

// bodySlot is one request's hold on a body slot.
type bodySlot struct {
	slots chan struct{}
	wait  prometheus.Observer // kvindex_picker_queue_seconds{turn="body"}
	mu    sync.Mutex
	held  bool
}

// newBodySlot returns a request's hold on a body slot, not yet taken.
func (s *Service) newBodySlot() *bodySlot {
	return &bodySlot{slots: s.body, wait: s.m.queueSeconds.WithLabelValues(turnBody)}
}

// take waits for a slot unless one is held; false when ctx ended first.
func (b *bodySlot) take(ctx context.Context) bool {
	b.mu.Lock()
	held := b.held
	b.mu.Unlock()
	if held {
		return true
	}
	if !acquire(ctx, b.slots, b.wait) {
		return false
	}
	b.mu.Lock()
	b.held = true
	b.mu.Unlock()
	return true
}

// give gives the slot back, if held; from any goroutine.
func (b *bodySlot) give() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held {
		b.held = false
		<-b.slots
	}
}

// waiting gives the slot back if the stream's next frame takes longer
// than bodySlotPatience; the returned stop ends the wait.
func (b *bodySlot) waiting() (stop func()) {
	b.mu.Lock()
	held := b.held
	b.mu.Unlock()
	if !held {
		return func() {}
	}
	t := time.AfterFunc(bodySlotPatience, b.give)
	return func() { t.Stop() }
}

// slotReader reads an HTTP request's body in body turns: each Read first
// takes the request's slot (queueing while the slots are busy), and a
// Read that waits on the client longer than bodySlotPatience gives the
// slot back, as a stalled ext_proc stream does.
type slotReader struct {
	ctx  context.Context
	slot *bodySlot
	r    io.Reader
}

func (sr *slotReader) Read(p []byte) (int, error) {
	if !sr.slot.take(sr.ctx) {
		return 0, sr.ctx.Err()
	}
	stop := sr.slot.waiting()
	defer stop()
	return sr.r.Read(p)
}

// cpuTurn is a request's hold on a CPU slot; leave gives it back, once,
// from the request's goroutine.
type cpuTurn struct {
	s    *Service
	held bool
}

// enterCPU waits for a CPU slot; nil when ctx ended first.
func (s *Service) enterCPU(ctx context.Context) *cpuTurn {
	if !acquire(ctx, s.cpu, s.m.queueSeconds.WithLabelValues(turnCPU)) {
		return nil
	}
	return &cpuTurn{s: s, held: true}
}

// acquire takes one of slots, observing how long it waited (0 when one
// was free, without reading the clock); false when ctx ended first.
func acquire(ctx context.Context, slots chan struct{}, wait prometheus.Observer) bool {
	select {
	case slots <- struct{}{}:
		wait.Observe(0)
		return true
	default:
	}
	start := time.Now()
	select {
	case slots <- struct{}{}:
		wait.Observe(time.Since(start).Seconds())
		return true
	case <-ctx.Done():
		return false
	}
}

// The turns of kvindex_picker_queue_seconds.
const (
	turnBody = "body"
	turnCPU  = "cpu"
)

// leave gives the slot back; a nil turn or one left already does nothing.
func (t *cpuTurn) leave() {
	if t != nil && t.held {
		t.held = false
		<-t.s.cpu
	}
}
