package inflight

import (
	"errors"
	"io"
	"math"
	"strings"
	"sync"
	"testing"
)

func TestGate(t *testing.T) {
	g := &Gate{Max: 10}
	for _, step := range []struct {
		n    int64
		take bool // acquire, else release
		ok   bool
		want int64
	}{
		{6, true, true, 6},
		{5, true, false, 6}, // would pass the bound
		{4, true, true, 10},
		{1, true, false, 10},
		{6, false, true, 4},
		{math.MaxInt64, true, false, 4}, // no overflow past the bound
		{6, true, true, 10},
	} {
		if step.take {
			if got := g.TryAcquire(step.n); got != step.ok {
				t.Fatalf("TryAcquire(%d) = %v, want %v", step.n, got, step.ok)
			}
		} else {
			g.Release(step.n)
		}
		if g.InFlight() != step.want {
			t.Fatalf("after %+v: in flight %d, want %d", step, g.InFlight(), step.want)
		}
	}
	if g.Refused() != 3 {
		t.Errorf("refused %d, want 3", g.Refused())
	}
}

// Concurrent takers never hold more than Max together.
func TestGateConcurrent(t *testing.T) {
	g := &Gate{Max: 100}
	var wg sync.WaitGroup
	var mu sync.Mutex
	peak := int64(0)
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				if g.TryAcquire(7) {
					mu.Lock()
					peak = max(peak, g.InFlight())
					mu.Unlock()
					g.Release(7)
				}
			}
		})
	}
	wg.Wait()
	if peak > 100 || g.InFlight() != 0 {
		t.Errorf("peak %d (max 100), left %d", peak, g.InFlight())
	}
}

// A Reader holds what it read until Release; a read past the bound fails
// with ErrBusy and takes nothing.
func TestReader(t *testing.T) {
	g := &Gate{Max: 10}
	a := &Reader{R: strings.NewReader("123456"), G: g}
	if b, err := io.ReadAll(a); err != nil || string(b) != "123456" || g.InFlight() != 6 {
		t.Fatalf("first reader: %q %v, in flight %d", b, err, g.InFlight())
	}
	b := &Reader{R: strings.NewReader("abcdef"), G: g}
	if _, err := io.ReadAll(b); !errors.Is(err, ErrBusy) || g.InFlight() != 6 {
		t.Fatalf("second reader: %v, in flight %d; want ErrBusy, 6", err, g.InFlight())
	}
	a.Release()
	b.Release()
	if g.InFlight() != 0 {
		t.Fatalf("in flight %d after Release", g.InFlight())
	}
}
