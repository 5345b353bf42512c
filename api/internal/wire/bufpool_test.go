package wire

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/api/internal/wiretest"
	"github.com/kvindex/kvindex/api/kvindexv1"
)

func TestBufferPool(t *testing.T) {
	var p BufferPool
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
// hands them over. (Each side's codec has the same test for its own
// decoders.)
func TestCodecSplit(t *testing.T) {
	in := &kvindexv1.LongestPrefixRequest{Model: "m", Prompt: &kvindexv1.Prompt{
		Input: &kvindexv1.Prompt_Tokens{Tokens: &kvindexv1.TokenIds{Ids: wiretest.SeqTokens(0, 20000)}},
	}}
	data, err := Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out kvindexv1.LongestPrefixRequest
	if err := Unmarshal(wiretest.Split(data), &out); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&out, in) {
		t.Error("decoded message differs")
	}
}

// Messages below gRPC's pooling threshold are encoded into a plain slice,
// larger ones into a buffer of the pool; both decode to the input.
func TestCodecSizes(t *testing.T) {
	for _, n := range []int{1, 20000} {
		in := &kvindexv1.BlockHashes{Hashes: wiretest.SeqTokens(1, n)}
		data, err := Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := data.Len(), proto.Size(in); got != want {
			t.Errorf("%d hashes: encoded %d bytes, want %d", n, got, want)
		}
		var out kvindexv1.BlockHashes
		if err := Unmarshal(data, &out); err != nil || !proto.Equal(&out, in) {
			t.Errorf("%d hashes: decoded %d hashes, err %v", n, len(out.GetHashes()), err)
		}
		data.Free()
	}
}
