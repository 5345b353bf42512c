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
	r := &kvindexv1.LongestPrefixResponse{BlocksTotal: 1024, BlockSize: 16, PromptTokens: 16390, TokenSource: "caller", IndexSeq: 1 << 40}
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

// SetSample gives fd a non-default value in m: one element for a list,
// an empty message for a message field, a one (or "x") for a scalar. The
// codec tests use it to exercise each field a codec declares (wire.Codec).
func SetSample(m protoreflect.Message, fd protoreflect.FieldDescriptor) {
	switch {
	case fd.IsList():
		l := m.Mutable(fd).List()
		if fd.Message() != nil {
			l.Append(l.NewElement())
		} else {
			l.Append(sampleScalar(fd.Kind()))
		}
	case fd.IsMap():
		mv := m.Mutable(fd).Map()
		v := sampleScalar(fd.MapValue().Kind())
		if fd.MapValue().Message() != nil {
			v = mv.NewValue()
		}
		mv.Set(sampleScalar(fd.MapKey().Kind()).MapKey(), v)
	case fd.Message() != nil:
		m.Set(fd, m.NewField(fd))
	default:
		m.Set(fd, sampleScalar(fd.Kind()))
	}
}

// sampleScalar is a non-default value of kind k.
func sampleScalar(k protoreflect.Kind) protoreflect.Value {
	switch k {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString("x")
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte("x"))
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(1)
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(1)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(1)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(1)
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(1)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(1)
	}
	return protoreflect.ValueOfUint64(1)
}
