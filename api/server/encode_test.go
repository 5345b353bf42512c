package server

import (
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
		b := appendPrefixResponse(nil, r)
		if len(b) != prefixResponseSize(r) {
			t.Errorf("size %d, wrote %d", prefixResponseSize(r), len(b))
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
