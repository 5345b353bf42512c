package server

import (
	"sync"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/kvindex/kvindex/api/internal/wire"
	"github.com/kvindex/kvindex/api/kvindexv1"
)

// LongestPrefixResponse is encoded by hand (and decoded by hand by the
// client): its tier maps go through protobuf-go's reflection, which
// allocates several objects per map entry on each side (entries boxed as
// interface values), most of a round trip's allocations in
// BenchmarkLongestPrefixGRPC.
// Fields are written in field-number order, as protobuf-go writes them;
// TestPrefixResponseEncoding checks that protobuf-go reads them back, and
// wire.ServerEncodes declares them (TestCodecsKnowEveryField).

// marshalPrefixResponse encodes r into a pooled buffer; a response with
// unknown fields (never one of the server's own) goes through protobuf-go.
func marshalPrefixResponse(r *kvindexv1.LongestPrefixResponse) (mem.BufferSlice, error) {
	if len(r.ProtoReflect().GetUnknown()) > 0 {
		return wire.Marshal(r)
	}
	e := prefixEncoders.Get().(*prefixEncoder)
	buf := wire.Buffers.Get(e.size(r))
	*buf = e.append((*buf)[:0], r)
	e.release()
	return mem.BufferSlice{mem.NewBuffer(buf, wire.Buffers)}, nil
}

// prefixEncoder encodes a LongestPrefixResponse in two passes, sizes then
// bytes, reading each pod's tier map once: size keeps each pod's size
// and tier entries for append (map iteration was most of the encoding,
// BenchmarkEncodePrefixResponse).
type prefixEncoder struct {
	podSizes []int
	tiers    []tierEntry // every pod's tier entries, in pod order
	tierEnds []int       // tierEnds[i]: end of pod i's entries in tiers
}

type tierEntry struct {
	medium string
	blocks uint32
}

var prefixEncoders = sync.Pool{New: func() any { return new(prefixEncoder) }}

func (e *prefixEncoder) release() {
	if cap(e.podSizes) > maxPooledPods {
		return
	}
	clear(e.tiers) // drop the strings
	e.podSizes, e.tiers, e.tierEnds = e.podSizes[:0], e.tiers[:0], e.tierEnds[:0]
	prefixEncoders.Put(e)
}

func sizeUint(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

func sizeStr(num protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(len(s))
}

func appendUint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

func appendStr(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
}

// entrySize is the size of one tiers map entry message.
func entrySize(k string, v uint32) int {
	// Map entries always carry their key and value fields, zero or not.
	return protowire.SizeTag(wire.EntryKey) + protowire.SizeBytes(len(k)) + protowire.SizeTag(wire.EntryValue) + protowire.SizeVarint(uint64(v))
}

// size returns the encoded size of r, keeping what append needs.
func (e *prefixEncoder) size(r *kvindexv1.LongestPrefixResponse) int {
	n := sizeUint(wire.ResponseBlocksTotal, uint64(r.BlocksTotal)) + sizeUint(wire.ResponseBlockSize, uint64(r.BlockSize)) +
		sizeUint(wire.ResponsePromptTokens, uint64(r.PromptTokens)) + sizeStr(wire.ResponseTokenSource, r.TokenSource) +
		sizeUint(wire.ResponseIndexSeq, r.IndexSeq)
	e.podSizes, e.tiers, e.tierEnds = e.podSizes[:0], e.tiers[:0], e.tierEnds[:0]
	for _, p := range r.Pods {
		ps := sizeStr(wire.PodPod, p.Pod) + sizeUint(wire.PodDPRank, uint64(p.DpRank)) +
			sizeUint(wire.PodMatchedBlocks, uint64(p.MatchedBlocks)) + sizeUint(wire.PodMatchedTokens, uint64(p.MatchedTokens)) +
			sizeUint(wire.PodHashCheck, uint64(p.HashCheck)) + sizeUint(wire.PodHealth, uint64(p.Health))
		for k, v := range p.Tiers {
			e.tiers = append(e.tiers, tierEntry{k, v})
			ps += protowire.SizeTag(wire.PodTiers) + protowire.SizeBytes(entrySize(k, v))
		}
		e.podSizes = append(e.podSizes, ps)
		e.tierEnds = append(e.tierEnds, len(e.tiers))
		n += protowire.SizeTag(wire.ResponsePods) + protowire.SizeBytes(ps)
	}
	return n
}

// append appends r's encoding to b; size(r) must come first.
func (e *prefixEncoder) append(b []byte, r *kvindexv1.LongestPrefixResponse) []byte {
	b = appendUint(b, wire.ResponseBlocksTotal, uint64(r.BlocksTotal))
	b = appendUint(b, wire.ResponseBlockSize, uint64(r.BlockSize))
	t := 0
	for i, p := range r.Pods {
		b = protowire.AppendTag(b, wire.ResponsePods, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(e.podSizes[i]))
		b = appendStr(b, wire.PodPod, p.Pod)
		b = appendUint(b, wire.PodDPRank, uint64(p.DpRank))
		b = appendUint(b, wire.PodMatchedBlocks, uint64(p.MatchedBlocks))
		b = appendUint(b, wire.PodMatchedTokens, uint64(p.MatchedTokens))
		for ; t < e.tierEnds[i]; t++ {
			k, v := e.tiers[t].medium, e.tiers[t].blocks
			b = protowire.AppendTag(b, wire.PodTiers, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(entrySize(k, v)))
			b = protowire.AppendString(protowire.AppendTag(b, wire.EntryKey, protowire.BytesType), k)
			b = protowire.AppendVarint(protowire.AppendTag(b, wire.EntryValue, protowire.VarintType), uint64(v))
		}
		b = appendUint(b, wire.PodHashCheck, uint64(p.HashCheck))
		b = appendUint(b, wire.PodHealth, uint64(p.Health))
	}
	b = appendUint(b, wire.ResponsePromptTokens, uint64(r.PromptTokens))
	b = appendStr(b, wire.ResponseTokenSource, r.TokenSource)
	b = appendUint(b, wire.ResponseIndexSeq, r.IndexSeq)
	return b
}
