package api

import (
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/api/kvindexv1"
)

func TestBufferPool(t *testing.T) {
	var p bufferPool
	for _, n := range []int{0, 1, 256, 257, 4096, 48 << 10, 1 << 20} {
		b := p.Get(n)
		want := max(256, 1)
		for want < n {
			want *= 2
		}
		if len(*b) != n || cap(*b) != want {
			t.Errorf("Get(%d): len %d cap %d, want cap %d", n, len(*b), cap(*b), want)
		}
		p.Put(b)
	}
	odd := make([]byte, 300)
	p.Put(&odd) // not a pool size: ignored, no panic
	if b := p.Get(300); cap(*b) != 512 {
		t.Errorf("a foreign buffer came back: cap %d", cap(*b))
	}
	if b := p.Get(1 << 27); len(*b) != 1<<27 {
		t.Errorf("oversized Get: len %d", len(*b))
	}
}

// The codec round-trips messages split over several buffers, as gRPC
// hands them over.
func TestFastCodecSplit(t *testing.T) {
	in := &kvindexv1.LongestPrefixRequest{Model: "m", Prompt: TokensPrompt(seqTokens(0, 20000))}
	data, err := fastCodec{}.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	b := data.Materialize()
	data.Free()
	split := mem.BufferSlice{mem.SliceBuffer(b[:100]), mem.SliceBuffer(b[100:5000]), mem.SliceBuffer(b[5000:])}
	for _, c := range []interface {
		Unmarshal(mem.BufferSlice, any) error
	}{fastCodec{}, poolingCodec{}} {
		var out kvindexv1.LongestPrefixRequest
		if err := c.Unmarshal(split, &out); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(&out, in) {
			t.Errorf("%T: decoded message differs", c)
		}
	}
}
