package wire

import (
	"math/bits"
	"sync"

	"google.golang.org/grpc/mem"
)

// BufferPool is a mem.BufferPool of power-of-two size classes that hands
// out buffers without zeroing them. gRPC's default pool zeroes the whole
// capacity of every buffer it hands out, and its classes jump from 32 KiB
// to 1 MiB: a 48 KiB query (16,384 token ids) cleared 1 MiB per message
// on each side, a large share of BenchmarkLongestPrefixGRPC's CPU time. Every
// user of this pool (gRPC's framing, the codecs of both sides) overwrites
// the bytes it asks for before reading them.
type BufferPool struct {
	classes [maxBufClass + 1]sync.Pool // class c holds *[]byte of capacity 1<<c
}

const (
	minBufClass = 8  // 256 B
	maxBufClass = 26 // 64 MiB; larger buffers are not pooled
)

// Buffers is the pool both sides hand to gRPC
// (experimental.WithBufferPool, experimental.BufferPool) and encode into.
var Buffers = new(BufferPool)

var _ mem.BufferPool = Buffers

func bufClass(n int) int {
	if n <= 1<<minBufClass {
		return minBufClass
	}
	return bits.Len(uint(n - 1))
}

// Get implements mem.BufferPool.
func (p *BufferPool) Get(n int) *[]byte {
	c := bufClass(n)
	if c > maxBufClass {
		b := make([]byte, n)
		return &b
	}
	if v, ok := p.classes[c].Get().(*[]byte); ok {
		*v = (*v)[:n]
		return v
	}
	b := make([]byte, n, 1<<c)
	return &b
}

// Put implements mem.BufferPool.
func (p *BufferPool) Put(b *[]byte) {
	c := bits.Len(uint(cap(*b))) - 1
	if c < minBufClass || c > maxBufClass || cap(*b) != 1<<c {
		return // not one of ours
	}
	p.classes[c].Put(b)
}
