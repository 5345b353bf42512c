// Package simtest holds the helpers that tests running kvindex's modes in
// their own process share: kvindex sim's engines (Start), a mode started
// and stopped with the test (Run), and its log shown when the test fails
// (Log). It needs libzmq, as kvindex sim does.
package simtest

import (
	"context"
	"testing"

	"github.com/kvindex/kvindex/internal/sim"
	"github.com/kvindex/kvindex/internal/testutil"
)

// Start runs kvindex sim's engines with o until the test ends and returns
// what a kvindex follows them with, once they are up.
func Start(t testing.TB, o sim.Options) sim.Follow {
	t.Helper()
	started := make(chan struct{})
	o.Observe = func(ev sim.Event) {
		if _, ok := ev.(sim.Started); ok {
			close(started)
		}
	}
	s, err := sim.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("sim: %v", err)
		}
	})
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("sim stopped before its engines were up: %v", err)
	}
	return s.Plan().Follow()
}

// Run starts a kvindex mode (start) and stops it when the test ends,
// checking how it stopped (wait).
func Run(t testing.TB, start func(context.Context) error, wait func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if err := start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := wait(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
}

// Log is where a mode started in this process logs: shown, under name,
// if the test failed (its last 6,000 bytes).
func Log(t testing.TB, name string) *testutil.SyncBuffer {
	logs := &testutil.SyncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			out := logs.String()
			if len(out) > 6000 {
				out = "...\n" + out[len(out)-6000:]
			}
			t.Logf("kvindex %s:\n%s", name, out)
		}
	})
	return logs
}
