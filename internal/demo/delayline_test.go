package demo

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/kvevents"
)

// recorder is the sink behind the delay line in these tests.
type recorder struct {
	mu    sync.Mutex
	calls []string
}

func (r *recorder) Apply(e kvevents.EngineID, seq uint64, events []kvevents.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := fmt.Sprintf("%s apply %d", e.Pod, seq)
	for _, ev := range events {
		s += fmt.Sprintf(" %v%v", ev.Kind, ev.Hashes)
	}
	r.calls = append(r.calls, s)
}

func (r *recorder) Reset(e kvevents.EngineID, reason kvevents.ResetReason) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, fmt.Sprintf("%s reset %s", e.Pod, reason))
}

func (r *recorder) take() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := strings.Join(r.calls, "; ")
	r.calls = nil
	return s
}

var (
	engA = kvevents.EngineID{Model: "m", Pod: "a"}
	engB = kvevents.EngineID{Model: "m", Pod: "b"}
)

func stored(h uint64) []kvevents.Event {
	return []kvevents.Event{{Kind: kvevents.BlockStored, Hashes: []uint64{h}}}
}

const ms = time.Millisecond

// TestDelayLineReleasesByPublishTime checks the core rule: a batch
// published at t reaches the index at the first flush with cutoff >= t,
// in order per engine, resets included, whatever order the subscriber
// delivered the engines in.
func TestDelayLineReleasesByPublishTime(t *testing.T) {
	rec := &recorder{}
	d := newDelayLine(rec, time.Second)
	d.register(engA)
	d.register(engB)
	d.publish(engA, 0, 1)
	d.publish(engB, 5*ms, 1)
	d.publish(engA, 10*ms, 2) // one Process call can publish more than one batch
	d.publish(engA, 30*ms, 1) // the first batch of a restarted engine

	d.Apply(engB, 0, stored(20))
	d.Apply(engA, 0, stored(1))
	d.Apply(engA, 1, stored(2))
	d.Apply(engA, 2, stored(3))
	d.Reset(engA, kvevents.ResetRestart)
	d.Apply(engA, 0, stored(4))

	for _, step := range []struct {
		cutoff time.Duration
		want   string
	}{
		{-1 * ms, ""},
		{0, "a apply 0 BlockStored[1]"},
		{9 * ms, "b apply 0 BlockStored[20]"},
		{29 * ms, "a apply 1 BlockStored[2]; a apply 2 BlockStored[3]"},
		{30 * ms, "a reset restart; a apply 0 BlockStored[4]"},
		{time.Hour, ""},
	} {
		if err := d.flush(step.cutoff); err != nil {
			t.Fatalf("flush(%v): %v", step.cutoff, err)
		}
		if got := rec.take(); got != step.want {
			t.Fatalf("flush(%v) released %q, want %q", step.cutoff, got, step.want)
		}
	}
}

// TestDelayLineWaitsForDelivery checks that a flush waits for batches the
// subscriber has not delivered yet, and fails clearly when they never come.
func TestDelayLineWaitsForDelivery(t *testing.T) {
	rec := &recorder{}
	d := newDelayLine(rec, 5*time.Second)
	d.register(engA)
	d.publish(engA, 0, 3)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range uint64(3) {
			d.Apply(engA, i, stored(i))
		}
	}()
	if err := d.flush(0); err != nil {
		t.Fatal(err)
	}
	<-done
	if got := rec.take(); got != "a apply 0 BlockStored[0]; a apply 1 BlockStored[1]; a apply 2 BlockStored[2]" {
		t.Fatalf("released %q", got)
	}

	d2 := newDelayLine(rec, 30*time.Millisecond)
	d2.register(engB)
	d2.publish(engB, 7*ms, 2)
	d2.Apply(engB, 0, stored(1))
	err := d2.flush(10 * ms)
	if err == nil || !strings.Contains(err.Error(), "b published 2 batches") || !strings.Contains(err.Error(), "delivered 1") {
		t.Fatalf("got %v, want an error naming the engine and the missing batch", err)
	}
	if got := rec.take(); got != "" {
		t.Fatalf("a failed flush released %q", got)
	}
}

// TestDelayLineCopiesEvents checks that held batches survive the
// subscriber reusing its buffers after Apply returns.
func TestDelayLineCopiesEvents(t *testing.T) {
	rec := &recorder{}
	d := newDelayLine(rec, time.Second)
	d.register(engA)
	d.publish(engA, 0, 1)
	evs := []kvevents.Event{{Kind: kvevents.BlockStored, Hashes: []uint64{7, 8}, TokenIDs: []uint64{1, 2}, ParentDigest: []byte{9}}}
	d.Apply(engA, 0, evs)
	evs[0].Hashes[0], evs[0].TokenIDs[0], evs[0].ParentDigest[0] = 0, 0, 0
	if err := d.flush(0); err != nil {
		t.Fatal(err)
	}
	if got := rec.take(); got != "a apply 0 BlockStored[7 8]" {
		t.Fatalf("released %q: the held batch was not a copy", got)
	}
}

func TestDelayLineIgnoresUnknownEngines(t *testing.T) {
	rec := &recorder{}
	d := newDelayLine(rec, time.Second)
	d.Apply(engA, 0, stored(1))
	d.Reset(engA, kvevents.ResetRestart)
	if err := d.flush(time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := rec.take(); got != "" {
		t.Fatalf("released %q for an engine the demo never started", got)
	}
}
