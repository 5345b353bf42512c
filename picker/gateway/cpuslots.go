package gateway

import (
	"context"
	"runtime"
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

// cpuTurn is a request's hold on a CPU slot; leave gives it back, once,
// from the request's goroutine.
type cpuTurn struct {
	s    *Service
	held bool
}

// enterCPU waits for a CPU slot; nil when ctx ended first.
func (s *Service) enterCPU(ctx context.Context) *cpuTurn {
	select {
	case s.cpu <- struct{}{}:
		return &cpuTurn{s: s, held: true}
	case <-ctx.Done():
		return nil
	}
}

// leave gives the slot back; a nil turn or one left already does nothing.
func (t *cpuTurn) leave() {
	if t != nil && t.held {
		t.held = false
		<-t.s.cpu
	}
}
