package client

import (
	"math/bits"
	"unicode/utf8"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/kvindex/kvindex/api/internal/wire"
	"github.com/kvindex/kvindex/api/kvindexv1"
)

// codec is the client's gRPC codec: protobuf with buffers from the
// non-zeroing pool (wire.Marshal, wire.Unmarshal), except that requests
// of token ids are encoded and LongestPrefix responses decoded by hand.
// The hand encoder writes exactly protobuf-go's bytes and the decoder
// follows protobuf's rules; TestTokenRequestEncoding,
// FuzzTokenRequestEncoding and FuzzPrefixResponseDecode hold them to
// protobuf-go. wire.ClientEncodes and wire.ClientDecodes declare the
// fields each knows (TestCodecsKnowEveryField, TestTokenRequestFollowsTable).
type codec struct{}

func (codec) Name() string { return wire.CodecName }

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	var tbuf *[]byte
	if b, ok := marshalTokenRequest(v, func(n int) []byte {
		tbuf = wire.Buffers.Get(n)
		return *tbuf
	}); ok {
		*tbuf = b
		return mem.BufferSlice{mem.NewBuffer(tbuf, wire.Buffers)}, nil
	}
	return wire.Marshal(v)
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(*kvindexv1.LongestPrefixResponse); ok {
		return wire.WithBytes(data, func(b []byte) error { return decodePrefixResponse(b, r) })
	}
	return wire.Unmarshal(data, v)
}

// The client encodes LongestPrefix and Lookup requests carrying token ids
// by hand: protobuf-go appends a packed varint field one value at a time
// through a generic helper, this sizes the buffer and then writes it
// (BenchmarkEncodeTokenRequest compares the two). In
// BenchmarkLongestPrefixGRPC the protobuf-go encoding of the ids was a
// large share of a whole round trip's CPU time, client and server
// included. Other messages go through protobuf-go.

// tokenRequest returns the parts of a request the hand encoder handles,
// or ok false for anything else (it then goes through protobuf-go): a
// prompt with any field wire.ClientEncodes leaves to protobuf-go set.
func tokenRequest(v any) (model string, p *kvindexv1.Prompt, ids []uint64, cands []string, ok bool) {
	switch m := v.(type) {
	case *kvindexv1.LongestPrefixRequest:
		model, p, cands = m.GetModel(), m.GetPrompt(), m.GetCandidatePods()
	case *kvindexv1.LookupRequest:
		model, p = m.GetModel(), m.GetPrompt()
	default:
		return
	}
	t, isTokens := p.GetInput().(*kvindexv1.Prompt_Tokens)
	if !isTokens || t.Tokens == nil || len(p.GetMmItems()) > 0 || len(p.ProtoReflect().GetUnknown()) > 0 {
		return
	}
	return model, p, t.Tokens.GetIds(), cands, true
}

// packedSize is the size of ids as packed varints.
func packedSize(ids []uint64) int {
	n := 0
	for _, x := range ids {
		n += 1 + (bits.Len64(x|1)-1)/7
	}
	return n
}

// tokenRequestSize is the encoded size of a request tokenRequest accepted.
func tokenRequestSize(model string, p *kvindexv1.Prompt, packed int, cands []string) (prompt, tokens, total int) {
	tokens = 0
	if packed > 0 {
		tokens = 1 + protowire.SizeVarint(uint64(packed)) + packed
	}
	prompt = 1 + protowire.SizeVarint(uint64(tokens)) + tokens
	if s := p.GetLoraName(); s != "" {
		prompt += 1 + protowire.SizeBytes(len(s))
	}
	if s := p.GetCacheSalt(); s != "" {
		prompt += 1 + protowire.SizeBytes(len(s))
	}
	if model != "" {
		total += 1 + protowire.SizeBytes(len(model))
	}
	total += 1 + protowire.SizeBytes(prompt)
	for _, c := range cands {
		total += 1 + protowire.SizeBytes(len(c))
	}
	return prompt, tokens, total
}

// appendTokenRequest encodes the request in protobuf-go's order (field
// numbers, a oneof after the plain fields), so that both write the same
// bytes.
func appendTokenRequest(b []byte, model string, p *kvindexv1.Prompt, ids []uint64, cands []string, packed, prompt, tokens int) []byte {
	if model != "" {
		b = protowire.AppendTag(b, wire.RequestModel, protowire.BytesType)
		b = protowire.AppendString(b, model)
	}
	b = protowire.AppendTag(b, wire.RequestPrompt, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(prompt))
	if s := p.GetLoraName(); s != "" {
		b = protowire.AppendTag(b, wire.PromptLoraName, protowire.BytesType)
		b = protowire.AppendString(b, s)
	}
	if s := p.GetCacheSalt(); s != "" {
		b = protowire.AppendTag(b, wire.PromptCacheSalt, protowire.BytesType)
		b = protowire.AppendString(b, s)
	}
	b = protowire.AppendTag(b, wire.PromptTokens, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(tokens))
	if packed > 0 {
		b = protowire.AppendTag(b, wire.IDs, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(packed))
		b = appendVarints(b, ids, packed)
	}
	for _, c := range cands {
		b = protowire.AppendTag(b, wire.RequestCandidates, protowire.BytesType)
		b = protowire.AppendString(b, c)
	}
	return b
}

// appendVarints appends ids as varints, packed bytes long in all. Token
// ids take one to three bytes; those cases are written without a loop,
// which beat a plain loop and storing each id as a 4-byte word with
// computed continuation bits (BenchmarkEncodeTokenRequest; figures in
// api/README.md).
func appendVarints(b []byte, ids []uint64, packed int) []byte {
	n := len(b)
	b = b[:n+packed]
	out := b[n:]
	for _, x := range ids {
		switch {
		case x < 1<<7:
			out[0] = byte(x)
			out = out[1:]
		case x < 1<<14:
			_ = out[1]
			out[0] = byte(x) | 0x80
			out[1] = byte(x >> 7)
			out = out[2:]
		case x < 1<<21:
			_ = out[2]
			out[0] = byte(x) | 0x80
			out[1] = byte(x>>7) | 0x80
			out[2] = byte(x >> 14)
			out = out[3:]
		default:
			i := 0
			for ; x >= 0x80; i++ {
				out[i] = byte(x) | 0x80
				x >>= 7
			}
			out[i] = byte(x)
			out = out[i+1:]
		}
	}
	return b
}

// marshalTokenRequest encodes v if it is a request of token ids.
func marshalTokenRequest(v any, get func(int) []byte) ([]byte, bool) {
	model, p, ids, cands, ok := tokenRequest(v)
	if !ok {
		return nil, false
	}
	packed := packedSize(ids)
	prompt, tokens, total := tokenRequestSize(model, p, packed, cands)
	b := get(total)[:0]
	return appendTokenRequest(b, model, p, ids, cands, packed, prompt, tokens), true
}

// LongestPrefixResponse is decoded by hand as well (the server encodes it
// by hand): its tier maps go through protobuf-go's reflection, which
// allocates several objects per map entry on each side (entries boxed as
// interface values), most of a round trip's allocations in
// BenchmarkLongestPrefixGRPC.

// decodePrefixResponse decodes a LongestPrefixResponse into r (which must
// be empty), following protobuf's rules (the last value of a field wins, a
// repeated field appends); unknown fields are dropped.
func decodePrefixResponse(b []byte, r *kvindexv1.LongestPrefixResponse) error {
	for len(b) > 0 {
		num, typ, n := wire.ConsumeTag(b)
		if n < 0 {
			return wire.ErrInvalid
		}
		b = b[n:]
		switch {
		case typ == protowire.VarintType && (num == wire.ResponseBlocksTotal || num == wire.ResponseBlockSize ||
			num == wire.ResponsePromptTokens || num == wire.ResponseIndexSeq):
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return wire.ErrInvalid
			}
			b = b[n:]
			switch num {
			case wire.ResponseBlocksTotal:
				r.BlocksTotal = uint32(v)
			case wire.ResponseBlockSize:
				r.BlockSize = uint32(v)
			case wire.ResponseIndexSeq:
				r.IndexSeq = v
			default:
				r.PromptTokens = uint32(v)
			}
		case typ == protowire.BytesType && (num == wire.ResponsePods || num == wire.ResponseTokenSource):
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return wire.ErrInvalid
			}
			b = b[n:]
			if num == wire.ResponseTokenSource {
				if !utf8.Valid(v) {
					return wire.ErrUTF8
				}
				r.TokenSource = string(v)
				continue
			}
			p := new(kvindexv1.PodMatch)
			if err := decodePodMatch(v, p); err != nil {
				return err
			}
			r.Pods = append(r.Pods, p)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return wire.ErrInvalid
			}
			b = b[n:]
		}
	}
	return nil
}

func decodePodMatch(b []byte, p *kvindexv1.PodMatch) error {
	for len(b) > 0 {
		num, typ, n := wire.ConsumeTag(b)
		if n < 0 {
			return wire.ErrInvalid
		}
		b = b[n:]
		switch {
		case typ == protowire.VarintType && num >= wire.PodDPRank && num <= wire.PodHealth && num != wire.PodTiers:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return wire.ErrInvalid
			}
			b = b[n:]
			switch num {
			case wire.PodDPRank:
				p.DpRank = uint32(v)
			case wire.PodMatchedBlocks:
				p.MatchedBlocks = uint32(v)
			case wire.PodMatchedTokens:
				p.MatchedTokens = uint32(v)
			case wire.PodHashCheck:
				p.HashCheck = kvindexv1.HashCheck(int32(v))
			case wire.PodHealth:
				p.Health = kvindexv1.EngineHealth(int32(v))
			}
		case typ == protowire.BytesType && (num == wire.PodPod || num == wire.PodTiers):
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return wire.ErrInvalid
			}
			b = b[n:]
			if num == wire.PodPod {
				if !utf8.Valid(v) {
					return wire.ErrUTF8
				}
				p.Pod = string(v)
				continue
			}
			k, val, err := decodeTierEntry(v)
			if err != nil {
				return err
			}
			if p.Tiers == nil {
				p.Tiers = make(map[string]uint32, 1)
			}
			p.Tiers[k] = val
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return wire.ErrInvalid
			}
			b = b[n:]
		}
	}
	return nil
}

func decodeTierEntry(b []byte) (string, uint32, error) {
	var k string
	var v uint32
	for len(b) > 0 {
		num, typ, n := wire.ConsumeTag(b)
		if n < 0 {
			return "", 0, wire.ErrInvalid
		}
		b = b[n:]
		switch {
		case num == wire.EntryKey && typ == protowire.BytesType:
			s, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return "", 0, wire.ErrInvalid
			}
			if !utf8.Valid(s) {
				return "", 0, wire.ErrUTF8
			}
			k, b = string(s), b[n:]
		case num == wire.EntryValue && typ == protowire.VarintType:
			x, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return "", 0, wire.ErrInvalid
			}
			v, b = uint32(x), b[n:]
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return "", 0, wire.ErrInvalid
			}
			b = b[n:]
		}
	}
	return k, v, nil
}
