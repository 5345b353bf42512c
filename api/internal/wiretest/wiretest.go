package wiretest

import (
	"fmt"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/kvindex/kvindex/api/kvindexv1"
)

// SeqTokens returns n token ids starting at from.
func SeqTokens(from, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(from + i)
	}
	return out
}

// SampleResponse is a LongestPrefix answer of 41 engines covering every
// field: zero and non-zero values, several tiers, an empty tier name, and
// one engine with every field zero.
func SampleResponse() *kvindexv1.LongestPrefixResponse {
	r := &kvindexv1.LongestPrefixResponse{BlocksTotal: 1024, BlockSize: 16, PromptTokens: 16390, TokenSource: "caller"}
	for i := range 40 {
		p := &kvindexv1.PodMatch{Pod: fmt.Sprintf("pod-%02d", i), DpRank: uint32(i % 3), MatchedBlocks: uint32(1024 - i*20),
			MatchedTokens: uint32((1024 - i*20) * 16), HashCheck: kvindexv1.HashCheck(i % 3), Health: kvindexv1.EngineHealth(i % 4)}
		switch i % 3 {
		case 0:
			p.Tiers = map[string]uint32{"GPU": p.MatchedBlocks}
		case 1:
			p.Tiers = map[string]uint32{"GPU": 3, "CPU": p.MatchedBlocks - 3, "": 0}
		}
		r.Pods = append(r.Pods, p)
	}
	r.Pods = append(r.Pods, &kvindexv1.PodMatch{}) // all zero
	return r
}

// DiscardUnknown drops the unknown fields of m and its submessages: the
// hand-written decoders do not keep them.
func DiscardUnknown(m protoreflect.Message) {
	m.SetUnknown(nil)
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.Message() == nil || fd.IsMap():
		case fd.IsList():
			for i := range v.List().Len() {
				DiscardUnknown(v.List().Get(i).Message())
			}
		default:
			DiscardUnknown(v.Message())
		}
		return true
	})
}

// Split returns data's bytes in three pieces, as gRPC hands over a
// message that arrived in several frames; data is freed. Messages of 5,000
// bytes or more are cut at 100 and 5,000 bytes (inside a packed field),
// shorter ones in thirds.
func Split(data mem.BufferSlice) mem.BufferSlice {
	b := data.Materialize()
	data.Free()
	i, j := 100, 5000
	if len(b) < j {
		i, j = len(b)/3, 2*len(b)/3
	}
	return mem.BufferSlice{mem.SliceBuffer(b[:i]), mem.SliceBuffer(b[i:j]), mem.SliceBuffer(b[j:])}
}
