package inflight

import (
	"errors"
	"io"
	"sync/atomic"
)

// Gate bounds a quantity held by concurrent requests. Its zero value
// admits nothing; set Max before use. It is safe for concurrent use.
type Gate struct {
	// Max is the most the requests may hold together.
	Max      int64
	inFlight atomic.Int64
	refused  atomic.Uint64
}

// TryAcquire takes n if it fits and reports whether it did; a refusal is
// counted (Refused).
func (g *Gate) TryAcquire(n int64) bool {
	for {
		cur := g.inFlight.Load()
		if n > g.Max-cur { // not cur+n > Max: that could overflow
			g.refused.Add(1)
			return false
		}
		if g.inFlight.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// Release gives back n taken by TryAcquire.
func (g *Gate) Release(n int64) { g.inFlight.Add(-n) }

// InFlight is what the requests hold now.
func (g *Gate) InFlight() int64 { return g.inFlight.Load() }

// Refused counts the refusals so far.
func (g *Gate) Refused() uint64 { return g.refused.Load() }

// ErrBusy is Reader's error when the gate refuses the bytes just read.
var ErrBusy = errors.New("inflight: the bound on bytes in flight is reached")

// Reader reads R, taking each chunk's bytes from G as it comes, so that
// the bytes buffered from all readers together stay within G.Max: a read
// that would pass it fails with ErrBusy. Release gives the bytes back once
// the request is done with them.
type Reader struct {
	R    io.Reader
	G    *Gate
	held int64
}

func (r *Reader) Read(p []byte) (int, error) {
	n, err := r.R.Read(p)
	if n > 0 {
		if !r.G.TryAcquire(int64(n)) {
			return 0, ErrBusy
		}
		r.held += int64(n)
	}
	return n, err
}

// Release gives back every byte the reader took.
func (r *Reader) Release() {
	r.G.Release(r.held)
	r.held = 0
}
