package server

import (
	"encoding/binary"
	"math/bits"
	"unicode/utf8"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/api/internal/wire"
	"github.com/kvindex/kvindex/api/kvindexv1"
)

// poolingCodec is the server's gRPC codec: protobuf with buffers from the
// non-zeroing pool (wire.Marshal, wire.Unmarshal), except for the two
// messages carrying prompts and the LongestPrefix response. The prompts'
// token ids and block hashes are decoded into pooled buffers, which
// protobuf-go cannot do (it allocates a new slice for every packed field,
// whatever the capacity at hand: most of the bytes allocated per request
// in BenchmarkLongestPrefixGRPC). LongestPrefix responses are encoded by
// hand (encode.go) and return to their pool once encoded (the
// server has no stats handler or binary log that would look at them
// later).
//
// The hand-written decoder follows protobuf's merge rules (the last oneof
// member wins, repeated fields append, a message field seen twice
// merges) and validates UTF-8 as proto3 requires; unknown fields are
// dropped, as the server has no use for them. FuzzPoolingCodec holds it
// to the standard decoder's answers. wire.ServerDecodes declares every
// field it knows; TestCodecsKnowEveryField fails when the .proto gains
// one it does not.
type poolingCodec struct{}

func (poolingCodec) Name() string { return wire.CodecName }

func (poolingCodec) Marshal(v any) (mem.BufferSlice, error) {
	r, ok := v.(*kvindexv1.LongestPrefixResponse)
	if !ok {
		return wire.Marshal(v)
	}
	out, err := marshalPrefixResponse(r)
	putPrefixResponse(r)
	return out, err
}

func (poolingCodec) Unmarshal(data mem.BufferSlice, v any) error {
	switch m := v.(type) {
	case *kvindexv1.LongestPrefixRequest:
		return wire.WithBytes(data, func(b []byte) error { return decodePrefixRequest(b, m) })
	case *kvindexv1.LookupRequest:
		return wire.WithBytes(data, func(b []byte) error { return decodeLookupRequest(b, m) })
	}
	return wire.Unmarshal(data, v)
}

func decodePrefixRequest(b []byte, m *kvindexv1.LongestPrefixRequest) error {
	return decodeRequest(b, &m.Model, &m.Prompt, &m.CandidatePods)
}

func decodeLookupRequest(b []byte, m *kvindexv1.LookupRequest) error {
	return decodeRequest(b, &m.Model, &m.Prompt, nil)
}

// decodeRequest decodes the fields shared by both requests; candidates is
// nil for LookupRequest.
func decodeRequest(b []byte, model *string, prompt **kvindexv1.Prompt, candidates *[]string) error {
	for len(b) > 0 {
		num, typ, n := wire.ConsumeTag(b)
		if n < 0 {
			return wire.ErrInvalid
		}
		b = b[n:]
		if typ == protowire.BytesType && (num == wire.RequestModel || num == wire.RequestPrompt || num == wire.RequestCandidates && candidates != nil) {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return wire.ErrInvalid
			}
			b = b[n:]
			switch num {
			case wire.RequestModel:
				if !utf8.Valid(v) {
					return wire.ErrUTF8
				}
				*model = string(v)
			case wire.RequestPrompt:
				if *prompt == nil {
					*prompt = new(kvindexv1.Prompt)
				}
				if err := decodePrompt(v, *prompt); err != nil {
					return err
				}
			case wire.RequestCandidates:
				if !utf8.Valid(v) {
					return wire.ErrUTF8
				}
				*candidates = append(*candidates, string(v))
			}
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return wire.ErrInvalid
		}
		b = b[n:]
	}
	return nil
}

func decodePrompt(b []byte, p *kvindexv1.Prompt) error {
	for len(b) > 0 {
		num, typ, n := wire.ConsumeTag(b)
		if n < 0 {
			return wire.ErrInvalid
		}
		b = b[n:]
		if typ != protowire.BytesType || num < wire.PromptTokens || num > wire.PromptMMItems {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return wire.ErrInvalid
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return wire.ErrInvalid
		}
		b = b[n:]
		var err error
		switch num {
		case wire.PromptTokens:
			w, ok := p.Input.(*kvindexv1.Prompt_Tokens)
			if !ok || w.Tokens == nil {
				w = &kvindexv1.Prompt_Tokens{Tokens: tokenIDs.Get().(*kvindexv1.TokenIds)}
				p.Input = w
			}
			w.Tokens.Ids, err = decodeIDs(v, w.Tokens.Ids, nil)
		case wire.PromptText:
			if !utf8.Valid(v) {
				return wire.ErrUTF8
			}
			p.Input = &kvindexv1.Prompt_Text{Text: string(v)}
		case wire.PromptMessages:
			w, ok := p.Input.(*kvindexv1.Prompt_Messages)
			if !ok || w.Messages == nil {
				w = &kvindexv1.Prompt_Messages{Messages: new(kvindexv1.ChatMessages)}
				p.Input = w
			}
			err = proto.UnmarshalOptions{Merge: true, DiscardUnknown: true}.Unmarshal(v, w.Messages)
		case wire.PromptBlockHashes:
			w, ok := p.Input.(*kvindexv1.Prompt_BlockHashes)
			if !ok || w.BlockHashes == nil {
				w = &kvindexv1.Prompt_BlockHashes{BlockHashes: blockHashes.Get().(*kvindexv1.BlockHashes)}
				p.Input = w
			}
			w.BlockHashes.Hashes, err = decodeIDs(v, w.BlockHashes.Hashes, &w.BlockHashes.ConfigDigest)
		case wire.PromptLoraName, wire.PromptCacheSalt:
			if !utf8.Valid(v) {
				return wire.ErrUTF8
			}
			if num == wire.PromptLoraName {
				p.LoraName = string(v)
			} else {
				p.CacheSalt = string(v)
			}
		case wire.PromptMMItems:
			item := new(kvindexv1.MultimodalItem)
			err = proto.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(v, item)
			p.MmItems = append(p.MmItems, item)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// decodeIDs appends the ids of a TokenIds or BlockHashes message (field
// 1, packed or not) to dst, growing it at most once per packed run, and
// reads a BlockHashes' config_digest into digest (nil for TokenIds).
func decodeIDs(b []byte, dst []uint64, digest *uint64) ([]uint64, error) {
	for len(b) > 0 {
		num, typ, n := wire.ConsumeTag(b)
		if n < 0 {
			return dst, wire.ErrInvalid
		}
		b = b[n:]
		switch {
		case num == wire.IDs && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return dst, wire.ErrInvalid
			}
			b = b[n:]
			var ok bool
			if dst, ok = appendPacked(dst, v); !ok {
				return dst, wire.ErrInvalid
			}
		case num == wire.IDs && typ == protowire.VarintType:
			x, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return dst, wire.ErrInvalid
			}
			b = b[n:]
			dst = append(dst, x)
		case num == wire.BlockHashesConfigDigest && typ == protowire.VarintType && digest != nil:
			x, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return dst, wire.ErrInvalid
			}
			b = b[n:]
			*digest = x
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return dst, wire.ErrInvalid
			}
			b = b[n:]
		}
	}
	return dst, nil
}

// appendPacked appends the varints of a packed field to dst. The pooled
// buffers it fills already have room for prompts like the ones before,
// so it pre-counts the varints only for a fresh buffer (that pass is a
// sizeable part of the decoding). A decoder reading eight bytes at a
// time, locating varint ends from the continuation bits, was tried too
// and was slower (BenchmarkDecodeIDs; figures in api/README.md).
func appendPacked(dst []uint64, v []byte) ([]uint64, bool) {
	if cap(dst) == 0 {
		// A fresh buffer (the pool was empty): size it in one go.
		n := 0
		for _, c := range v {
			if c < 0x80 {
				n++
			}
		}
		dst = make([]uint64, 0, n)
	}
	for len(v) > 0 {
		var x uint64
		switch {
		case v[0] < 0x80:
			x, v = uint64(v[0]), v[1:]
		case len(v) >= 2 && v[1] < 0x80:
			x, v = uint64(v[0]&0x7f)|uint64(v[1])<<7, v[2:]
		case len(v) >= 3 && v[2] < 0x80:
			x, v = uint64(v[0]&0x7f)|uint64(v[1]&0x7f)<<7|uint64(v[2])<<14, v[3:]
		case len(v) >= 10:
			var n int
			if x, n = wideVarint(v); n < 0 {
				return dst, false
			}
			v = v[n:]
		default:
			var n int
			if x, n = protowire.ConsumeVarint(v); n < 0 {
				return dst, false
			}
			v = v[n:]
		}
		dst = append(dst, x)
	}
	return dst, true
}

// wideVarint decodes the varint at the start of b (len(b) >= 10) from
// two loads instead of a byte at a time, for block hashes: random 64-bit
// values, nine or ten bytes each, which a byte loop decoded at a fraction
// of the speed of token ids (BenchmarkDecodeIDs/hashes). It answers as
// protowire.ConsumeVarint does, a negative length for a bad varint.
func wideVarint(b []byte) (uint64, int) {
	w := binary.LittleEndian.Uint64(b)
	stops := ^w & 0x8080808080808080 // the high bit of each byte that ends the varint
	n := 9
	if stops != 0 {
		n = bits.TrailingZeros64(stops)/8 + 1
		w &= 1<<(8*n) - 1 // n < 9: the shift stays below 64
	}
	// Pack the eight 7-bit groups of w into 56 bits.
	w &= 0x7f7f7f7f7f7f7f7f
	w = w&0x007f007f007f007f | w&0x7f007f007f007f00>>1
	w = w&0x00003fff00003fff | w&0x3fff00003fff0000>>2
	w = w&0x000000000fffffff | w&0x0fffffff00000000>>4
	if n < 9 {
		return w, n
	}
	if b[8] < 0x80 {
		return w | uint64(b[8])<<56, 9
	}
	if b[9] > 1 { // a tenth byte holds only bit 63
		return 0, -1
	}
	return w | uint64(b[8]&0x7f)<<56 | uint64(b[9])<<63, 10
}
