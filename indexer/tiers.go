package indexer

import "sync/atomic"

// tierCounts counts one engine's holdings per medium id (the namespace's
// mediaTable ids; EngineInfo.Tiers). Engines can number thousands and
// most hold one or two media, so the counters are a slice grown to the
// largest id the engine stored in, not one per possible medium. Apply
// changes them under the engine's mu, eviction without it (as it does
// holderBlocks); each counter is allocated on its own, so that growing
// the slice (a copy published by compare-and-swap) never loses an update
// made through the old one.
type tierCounts struct {
	p atomic.Pointer[[]*atomic.Int64]
}

// tierBytes is the accounted size of n counters: the slice header, and
// per medium a pointer and its counter.
func tierBytes(n int) int64 {
	if n == 0 {
		return 0
	}
	return 24 + 16*int64(n)
}

func (t *tierCounts) load() []*atomic.Int64 {
	if p := t.p.Load(); p != nil {
		return *p
	}
	return nil
}

// counter returns medium m's counter, growing the slice to hold it; grew
// is the change of the accounted bytes (tierBytes).
func (t *tierCounts) counter(m int) (c *atomic.Int64, grew int64) {
	for {
		old := t.p.Load()
		var cs []*atomic.Int64
		if old != nil {
			cs = *old
		}
		if m < len(cs) {
			return cs[m], 0
		}
		grown := make([]*atomic.Int64, m+1)
		copy(grown, cs)
		for i := len(cs); i <= m; i++ {
			grown[i] = new(atomic.Int64)
		}
		if t.p.CompareAndSwap(old, &grown) {
			return grown[m], tierBytes(len(grown)) - tierBytes(len(cs))
		}
	}
}

// add applies the changes of d and returns the change of the accounted
// bytes.
func (t *tierCounts) add(d *tierDelta) int64 {
	var grew int64
	d.each(func(m int, n int64) {
		c, g := t.counter(m)
		c.Add(n)
		grew += g
	})
	return grew
}

func (t *tierCounts) bytes() int64 { return tierBytes(len(t.load())) }

// tierDelta accumulates changes of holdings per medium id: the first few
// ids (the GPU and the usual offload tiers) in an array, so that a batch
// costs no allocation, rarer ones in a map.
type tierDelta struct {
	near [4]int64
	far  map[int]int64
}

func (d *tierDelta) add(m int, n int64) {
	if m < len(d.near) {
		d.near[m] += n
		return
	}
	if d.far == nil {
		d.far = make(map[int]int64)
	}
	d.far[m] += n
}

// each calls f for every medium whose count changed.
func (d *tierDelta) each(f func(m int, n int64)) {
	for m, n := range d.near {
		if n != 0 {
			f(m, n)
		}
	}
	for m, n := range d.far {
		if n != 0 {
			f(m, n)
		}
	}
}
