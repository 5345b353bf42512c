package server

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/api/internal/wiretest"
	"github.com/kvindex/kvindex/api/kvindexv1"
)

// protobuf-go reads what the hand encoder writes, and the size computed
// beforehand is the size written. (The client's TestPrefixResponseDecoding
// checks the other half.)
func TestPrefixResponseEncoding(t *testing.T) {
	for _, r := range []*kvindexv1.LongestPrefixResponse{wiretest.SampleResponse(), {}} {
		var e prefixEncoder
		n := e.size(r)
		b := e.append(nil, r)
		if len(b) != n {
			t.Errorf("size %d, wrote %d", n, len(b))
		}
		var viaProto kvindexv1.LongestPrefixResponse
		if err := proto.Unmarshal(b, &viaProto); err != nil || !proto.Equal(&viaProto, r) {
			t.Errorf("protobuf-go reads the hand encoding differently: %v", err)
		}
	}
}

// The pooling codec encodes an answer by hand and returns it to its pool;
// protobuf-go reads the bytes back.
func TestPoolingCodecMarshalsResponse(t *testing.T) {
	want := wiretest.SampleResponse()
	r := getPrefixResponse()
	proto.Merge(r, want)
	data, err := poolingCodec{}.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	defer data.Free()
	var got kvindexv1.LongestPrefixResponse
	if err := proto.Unmarshal(data.Materialize(), &got); err != nil || !proto.Equal(&got, want) {
		t.Errorf("protobuf-go reads the codec's encoding differently: %v", err)
	}
	if len(r.GetPods()) != 0 || r.GetBlocksTotal() != 0 {
		t.Error("the response was not reset for its pool")
	}
}

// BenchmarkEncodePrefixResponse encodes the answer of
// BenchmarkLongestPrefixGRPC's fleet: 32 pods, each with a GPU tier.
func BenchmarkEncodePrefixResponse(b *testing.B) {
	r := new(kvindexv1.LongestPrefixResponse)
	r.BlocksTotal, r.BlockSize, r.PromptTokens, r.TokenSource = benchBlocks, testBlockSize, benchBlocks*testBlockSize, "tokens"
	for i := range benchEngines {
		r.Pods = append(r.Pods, &kvindexv1.PodMatch{
			Pod: fmt.Sprintf("pod-%02d", i), MatchedBlocks: uint32(i * 30), MatchedTokens: uint32(i * 30 * testBlockSize),
			Tiers: map[string]uint32{"GPU": uint32(i * 30)}, HashCheck: kvindexv1.HashCheck_HASH_CHECK_VERIFIED, Health: kvindexv1.EngineHealth_ENGINE_HEALTH_OK,
		})
	}
	b.ReportAllocs()
	for b.Loop() {
		data, err := marshalPrefixResponse(r)
		if err != nil {
			b.Fatal(err)
		}
		data.Free()
	}
}
