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

// Once Max is held, a small request takes from the reserve while it stays
// small; a large one is refused.
func TestGateReserve(t *testing.T) {
	g := &Gate{Max: 100, Reserve: 10 * SmallShare} // small: announced at most 10
	large, a, b, unknown := Hold{Size: 1000}, Hold{Size: 10}, Hold{Size: 10}, Hold{}
	for _, step := range []struct {
		name string
		h    *Hold
		n    int64
		ok   bool
		want int64 // in flight after
	}{
		{"large fills Max", &large, 100, true, 100},
		{"large past Max, announced too big for the reserve", &large, 1, false, 100},
		{"unknown size: not from the reserve", &unknown, 1, false, 100},
		{"small from the reserve", &a, 6, true, 106},
		{"small grows within its size", &a, 4, true, 110},
		{"small grows past its size", &a, 1, false, 110},
		{"another small", &b, 10, true, 120},
	} {
		if got := g.Take(step.h, step.n); got != step.ok {
			t.Fatalf("%s: Take(%d) = %v, want %v", step.name, step.n, got, step.ok)
		}
		if g.InFlight() != step.want {
			t.Fatalf("%s: in flight %d, want %d", step.name, g.InFlight(), step.want)
		}
	}
	for _, h := range []*Hold{&large, &a, &b, &unknown} {
		g.Give(h)
	}
	if g.InFlight() != 0 || g.Refused() != 3 {
		t.Errorf("after Give: in flight %d, refused %d; want 0, 3", g.InFlight(), g.Refused())
	}
	// Without a reserve nothing passes Max.
	g = &Gate{Max: 5}
	h := Hold{Size: 6}
	if g.Take(&h, 6) {
		t.Error("Take past Max without a reserve succeeded")
	}
}

func TestBodyReserve(t *testing.T) {
	for _, tt := range []struct{ max, want int64 }{{4096, 1024}, {8 << 20, 1 << 20}, {1 << 30, 1 << 20}, {0, 0}} {
		if got := BodyReserve(tt.max); got != tt.want {
			t.Errorf("BodyReserve(%d) = %d, want %d", tt.max, got, tt.want)
		}
	}
}
