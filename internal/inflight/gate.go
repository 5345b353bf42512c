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
	Max int64
	// Reserve, if positive, is held back for small requests beyond Max:
	// once Max is reached, a request announced small (Hold.Size at most
	// Reserve/SmallShare) takes from the reserve (Take). Large or endless
	// request bodies filling Max then cannot turn away the small queries
	// that come beside them, not even with their first bytes, which are
	// few too (BodyReserve sizes the body gates').
	Reserve  int64
	inFlight atomic.Int64
	reserved atomic.Int64 // taken from Reserve
	refused  atomic.Uint64
}

// SmallShare: a request is small, for the reserve, when it is announced
// to take at most Reserve/SmallShare, so that SmallShare small requests
// fit in it at once.
const SmallShare = 16

// BodyReserve is the Reserve of a request-body gate with bound max: a
// quarter of it, at most 1 MiB (16 bodies of up to 64 KiB, which a query
// of thousands of token ids fits in), held beyond the bodies' bound
// (memlimit.BodyBytes) at little cost.
func BodyReserve(max int64) int64 { return min(max/4, 1<<20) }

// take adds n to v if the sum stays within max.
func take(v *atomic.Int64, n, max int64) bool {
	for {
		cur := v.Load()
		if n > max-cur { // not cur+n > max: that could overflow
			return false
		}
		if v.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// TryAcquire takes n if it fits within Max and reports whether it did; a
// refusal is counted (Refused). It does not use the reserve.
func (g *Gate) TryAcquire(n int64) bool {
	if take(&g.inFlight, n, g.Max) {
		return true
	}
	g.refused.Add(1)
	return false
}

// Release gives back n taken by TryAcquire.
func (g *Gate) Release(n int64) { g.inFlight.Add(-n) }

// Hold is what one request holds of a Gate (Take, Give). Its zero value
// holds nothing.
type Hold struct {
	// Size is what the request announced it will take in all (an HTTP
	// body's Content-Length, an ext_proc body sent in one frame); 0 or
	// less: unknown, and the request may not use the reserve.
	Size          int64
	main, reserve int64
}

// Take takes n more for the request holding h: within Max if it fits,
// else from the reserve if h is announced small (Size at most
// Reserve/SmallShare) and stays within its Size.
// It reports whether it took n; a refusal is counted (Refused).
func (g *Gate) Take(h *Hold, n int64) bool {
	if take(&g.inFlight, n, g.Max) {
		h.main += n
		return true
	}
	if h.Size > 0 && h.Size <= g.Reserve/SmallShare && h.main+h.reserve+n <= h.Size && take(&g.reserved, n, g.Reserve) {
		h.reserve += n
		return true
	}
	g.refused.Add(1)
	return false
}

// Give gives back everything h holds.
func (g *Gate) Give(h *Hold) {
	g.inFlight.Add(-h.main)
	g.reserved.Add(-h.reserve)
	h.main, h.reserve = 0, 0
}

// InFlight is what the requests hold now, the reserve included.
func (g *Gate) InFlight() int64 { return g.inFlight.Load() + g.reserved.Load() }

// Refused counts the refusals so far.
func (g *Gate) Refused() uint64 { return g.refused.Load() }

// ErrBusy is Reader's error when the gate refuses the bytes just read.
var ErrBusy = errors.New("inflight: the bound on bytes in flight is reached")

// Reader reads R, taking each chunk's bytes from G as it comes (Take), so
// that the bytes buffered from all readers together stay within G.Max and
// its reserve: a read that would pass them fails with ErrBusy. Release
// gives the bytes back once the request is done with them. Size is what R
// is announced to hold (Hold.Size; 0 or less: unknown).
type Reader struct {
	R    io.Reader
	G    *Gate
	Size int64
	hold Hold
}

func (r *Reader) Read(p []byte) (int, error) {
	r.hold.Size = r.Size
	n, err := r.R.Read(p)
	if n > 0 && !r.G.Take(&r.hold, int64(n)) {
		return 0, ErrBusy
	}
	return n, err
}

// Release gives back every byte the reader took.
func (r *Reader) Release() { r.G.Give(&r.hold) }
