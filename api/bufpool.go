package api

import (
	"math/bits"
	"sync"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/api/kvindexv1"
)

// bufferPool is a mem.BufferPool of power-of-two size classes that hands
// out buffers without zeroing them. gRPC's default pool zeroes the whole
// capacity of every buffer it hands out, and its classes jump from 32 KiB
// to 1 MiB: a 48 KiB query (16,384 token ids) cleared 1 MiB per message
// on each side, a fifth of BenchmarkLongestPrefixGRPC's CPU time. Every
// user here overwrites the bytes it asks for before reading them.
type bufferPool struct {
	classes [maxBufClass + 1]sync.Pool // class c holds *[]byte of capacity 1<<c
}

const (
	minBufClass = 8  // 256 B
	maxBufClass = 26 // 64 MiB; larger buffers are not pooled
)

var buffers = &bufferPool{}

func bufClass(n int) int {
	if n <= 1<<minBufClass {
		return minBufClass
	}
	return bits.Len(uint(n - 1))
}

// Get implements mem.BufferPool.
func (p *bufferPool) Get(n int) *[]byte {
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
func (p *bufferPool) Put(b *[]byte) {
	c := bits.Len(uint(cap(*b))) - 1
	if c < minBufClass || c > maxBufClass || cap(*b) != 1<<c {
		return // not one of ours
	}
	p.classes[c].Put(b)
}

// fastCodec is the protobuf codec of gRPC with buffers from the
// non-zeroing pool, and without a copy when a message arrived in one
// piece. Server and client use it.
type fastCodec struct{}

func (fastCodec) Name() string { return "proto" }

func (fastCodec) Marshal(v any) (mem.BufferSlice, error) {
	var tbuf *[]byte
	if b, ok := marshalTokenRequest(v, func(n int) []byte {
		tbuf = buffers.Get(n)
		return *tbuf
	}); ok {
		*tbuf = b
		return mem.BufferSlice{mem.NewBuffer(tbuf, buffers)}, nil
	}
	if r, ok := v.(*kvindexv1.LongestPrefixResponse); ok && len(r.ProtoReflect().GetUnknown()) == 0 {
		size := prefixResponseSize(r)
		buf := buffers.Get(size)
		*buf = appendPrefixResponse((*buf)[:0], r)
		return mem.BufferSlice{mem.NewBuffer(buf, buffers)}, nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return protoCodec.Marshal(v)
	}
	size := proto.Size(m)
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := proto.MarshalOptions{UseCachedSize: true}.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	buf := buffers.Get(size)
	b, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend((*buf)[:0], m)
	if err != nil {
		buffers.Put(buf)
		return nil, err
	}
	*buf = b
	return mem.BufferSlice{mem.NewBuffer(buf, buffers)}, nil
}

func (fastCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(*kvindexv1.LongestPrefixResponse); ok {
		return withBytes(data, func(b []byte) error { return decodePrefixResponse(b, r) })
	}
	m, ok := v.(proto.Message)
	if !ok {
		return protoCodec.Unmarshal(data, v)
	}
	return withBytes(data, func(b []byte) error { return proto.Unmarshal(b, m) })
}

// withBytes calls f with data's bytes in one slice, copying only when
// data is in several pieces.
func withBytes(data mem.BufferSlice, f func([]byte) error) error {
	if len(data) == 1 {
		return f(data[0].ReadOnlyData())
	}
	buf := data.MaterializeToBuffer(buffers)
	defer buf.Free()
	return f(buf.ReadOnlyData())
}
