package kvevents

import (
	"math"
	"strconv"

	"github.com/kvindex/kvindex/blockhash"
)

// The encoder writes msgpack by hand rather than through
// vmihailenco/msgpack's Encoder: the goal is byte-for-byte equality with
// what vLLM's msgspec writes (smallest int encoding in both signs, str8
// for 32..255-byte strings, float64 always, declaration-order maps with
// omit_defaults), which the library does not promise across its options,
// and an append-style API that allocates nothing beyond dst's growth. The
// golden tests pin the bytes against msgspec 0.19.0's output.

// EncodeOptions selects how an Encoder writes a batch.
type EncodeOptions struct {
	Shape Shape
	// BytesHashes writes block hashes and parents as digests (msgpack bin),
	// as engines with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 do; every hash
	// and parent must then carry its digest (Event.Digests, ParentDigest).
	BytesHashes bool
}

// EncodeError reports an event AppendBatch cannot write.
type EncodeError struct {
	Event int // index in the batch, -1 for the batch itself
	Msg   string
}

func (e *EncodeError) Error() string {
	if e.Event < 0 {
		return "kvevents: encode batch: " + e.Msg
	}
	return "kvevents: encode event " + strconv.Itoa(e.Event) + ": " + e.Msg
}

// AppendBatch appends the msgpack encoding of b in the given shape, as
// vLLM's msgspec would write it, and returns the extended slice. Fields
// map to the wire as the Decoder maps them back: "" strings, a zero
// sliding window and an absent parent or LoRA id become nil (or are
// omitted in ShapeMap where vLLM's struct has a default); GroupIdx is
// always written. ShapeV090 drops the fields that version lacked.
// b.Skipped is not encoded. On error dst is returned unchanged.
func AppendBatch(dst []byte, b *Batch, opts EncodeOptions) ([]byte, error) {
	start := len(dst)
	out, err := appendBatch(dst, b, opts)
	if err != nil {
		return dst[:start], err
	}
	return out, nil
}

func appendBatch(dst []byte, b *Batch, opts EncodeOptions) ([]byte, error) {
	switch opts.Shape {
	case ShapeV090:
		dst = appendArrayLen(dst, 2)
	case ShapeArray, ShapeMap:
		dst = appendArrayLen(dst, 3)
	default:
		return dst, &EncodeError{Event: -1, Msg: "unknown shape " + opts.Shape.String()}
	}
	dst = appendFloat64(dst, b.TS)
	dst = appendArrayLen(dst, len(b.Events))
	var err error
	for i := range b.Events {
		if dst, err = appendEvent(dst, &b.Events[i], opts); err != nil {
			err.(*EncodeError).Event = i
			return dst, err
		}
	}
	if opts.Shape != ShapeV090 {
		if b.HasDPRank {
			dst = appendInt(dst, int64(b.DPRank))
		} else {
			dst = appendNil(dst)
		}
	}
	return dst, nil
}

// Field names and tags, pre-encoded as msgpack strings.
var (
	mpType              = appendStr(nil, "type")
	mpBlockStored       = appendStr(nil, "BlockStored")
	mpBlockRemoved      = appendStr(nil, "BlockRemoved")
	mpAllBlocksCleared  = appendStr(nil, "AllBlocksCleared")
	mpBlockHashes       = appendStr(nil, "block_hashes")
	mpParentBlockHash   = appendStr(nil, "parent_block_hash")
	mpTokenIDs          = appendStr(nil, "token_ids")
	mpBlockSize         = appendStr(nil, "block_size")
	mpLoRAID            = appendStr(nil, "lora_id")
	mpMedium            = appendStr(nil, "medium")
	mpLoRAName          = appendStr(nil, "lora_name")
	mpExtraKeys         = appendStr(nil, "extra_keys")
	mpGroupIdx          = appendStr(nil, "group_idx")
	mpSpecKind          = appendStr(nil, "kv_cache_spec_kind")
	mpSpecSlidingWindow = appendStr(nil, "kv_cache_spec_sliding_window")
)

func appendEvent(dst []byte, ev *Event, opts EncodeOptions) ([]byte, error) {
	isMap := opts.Shape == ShapeMap
	var err error
	switch ev.Kind {
	case BlockStored:
		if err := checkDigests(ev, opts); err != nil {
			return dst, err
		}
		switch opts.Shape {
		case ShapeV090:
			dst = appendArrayLen(dst, 6)
		case ShapeArray:
			dst = appendArrayLen(dst, 12)
		case ShapeMap:
			n := 8 // type and the seven fields without a default
			if ev.ExtraKeys != nil {
				n++
			}
			n++ // group_idx: 0 and None are one value in Event; write it
			if ev.SpecKind != "" {
				n++
			}
			if ev.SlidingWindow != 0 {
				n++
			}
			dst = appendMapLen(dst, n)
			dst = append(dst, mpType...)
		}
		dst = append(dst, mpBlockStored...)
		dst = appendKey(dst, isMap, mpBlockHashes)
		dst = appendHashes(dst, ev, opts.BytesHashes)
		dst = appendKey(dst, isMap, mpParentBlockHash)
		switch {
		case !ev.HasParent:
			dst = appendNil(dst)
		case opts.BytesHashes:
			dst = appendBin(dst, ev.ParentDigest)
		default:
			dst = appendUint(dst, ev.Parent)
		}
		dst = appendKey(dst, isMap, mpTokenIDs)
		dst = appendArrayLen(dst, len(ev.TokenIDs))
		for _, t := range ev.TokenIDs {
			dst = appendUint(dst, t)
		}
		dst = appendKey(dst, isMap, mpBlockSize)
		dst = appendInt(dst, int64(ev.BlockSize))
		dst = appendKey(dst, isMap, mpLoRAID)
		if ev.HasLoRAID {
			dst = appendInt(dst, ev.LoRAID)
		} else {
			dst = appendNil(dst)
		}
		if opts.Shape == ShapeV090 {
			return dst, nil
		}
		dst = appendKey(dst, isMap, mpMedium)
		dst = appendOptStr(dst, ev.Medium)
		dst = appendKey(dst, isMap, mpLoRAName)
		dst = appendOptStr(dst, ev.LoRAName)
		if !isMap || ev.ExtraKeys != nil {
			dst = appendKey(dst, isMap, mpExtraKeys)
			if dst, err = appendExtraKeys(dst, ev.ExtraKeys); err != nil {
				return dst, err
			}
		}
		dst = appendKey(dst, isMap, mpGroupIdx)
		dst = appendInt(dst, int64(ev.GroupIdx))
		if !isMap || ev.SpecKind != "" {
			dst = appendKey(dst, isMap, mpSpecKind)
			dst = appendOptStr(dst, ev.SpecKind)
		}
		if !isMap || ev.SlidingWindow != 0 {
			dst = appendKey(dst, isMap, mpSpecSlidingWindow)
			if ev.SlidingWindow != 0 {
				dst = appendInt(dst, int64(ev.SlidingWindow))
			} else {
				dst = appendNil(dst)
			}
		}
		return dst, nil
	case BlockRemoved:
		if err := checkDigests(ev, opts); err != nil {
			return dst, err
		}
		switch opts.Shape {
		case ShapeV090:
			dst = appendArrayLen(dst, 2)
		case ShapeArray:
			dst = appendArrayLen(dst, 4)
		case ShapeMap:
			dst = appendMapLen(dst, 4)
			dst = append(dst, mpType...)
		}
		dst = append(dst, mpBlockRemoved...)
		dst = appendKey(dst, isMap, mpBlockHashes)
		dst = appendHashes(dst, ev, opts.BytesHashes)
		if opts.Shape == ShapeV090 {
			return dst, nil
		}
		dst = appendKey(dst, isMap, mpMedium)
		dst = appendOptStr(dst, ev.Medium)
		dst = appendKey(dst, isMap, mpGroupIdx)
		dst = appendInt(dst, int64(ev.GroupIdx))
		return dst, nil
	case AllBlocksCleared:
		if isMap {
			dst = appendMapLen(dst, 1)
			dst = append(dst, mpType...)
		} else {
			dst = appendArrayLen(dst, 1)
		}
		return append(dst, mpAllBlocksCleared...), nil
	}
	return dst, &EncodeError{Msg: "unknown event kind " + ev.Kind.String()}
}

// checkDigests verifies that a bytes-hash encoding has every digest it needs.
func checkDigests(ev *Event, opts EncodeOptions) error {
	if !opts.BytesHashes {
		return nil
	}
	if len(ev.Digests) != len(ev.Hashes) {
		return &EncodeError{Msg: "bytes hashes requested but the event carries " + strconv.Itoa(len(ev.Digests)) + " digests for " + strconv.Itoa(len(ev.Hashes)) + " hashes"}
	}
	for i, d := range ev.Digests {
		if len(d) == 0 {
			return &EncodeError{Msg: "bytes hashes requested but hash " + strconv.Itoa(i) + " has no digest"}
		}
	}
	if ev.Kind == BlockStored && ev.HasParent && len(ev.ParentDigest) == 0 {
		return &EncodeError{Msg: "bytes hashes requested but the parent has no digest"}
	}
	return nil
}

func appendKey(dst []byte, isMap bool, key []byte) []byte {
	if isMap {
		return append(dst, key...)
	}
	return dst
}

func appendHashes(dst []byte, ev *Event, bytesHashes bool) []byte {
	dst = appendArrayLen(dst, len(ev.Hashes))
	if bytesHashes {
		for _, d := range ev.Digests {
			dst = appendBin(dst, d)
		}
		return dst
	}
	for _, h := range ev.Hashes {
		dst = appendUint(dst, h)
	}
	return dst
}

func appendExtraKeys(dst []byte, keys []blockhash.BlockExtra) ([]byte, error) {
	if keys == nil {
		return appendNil(dst), nil
	}
	dst = appendArrayLen(dst, len(keys))
	var err error
	for _, k := range keys {
		if k == nil {
			dst = appendNil(dst)
			continue
		}
		if dst, err = appendValues(dst, k); err != nil {
			return dst, err
		}
	}
	return dst, nil
}

func appendValues(dst []byte, vs []blockhash.Value) ([]byte, error) {
	dst = appendArrayLen(dst, len(vs))
	var err error
	for _, v := range vs {
		switch v.Kind {
		case blockhash.KindStr:
			dst = appendStr(dst, v.Str)
		case blockhash.KindInt:
			dst = appendInt(dst, v.Int)
		case blockhash.KindBytes:
			dst = appendBin(dst, v.Bytes)
		case blockhash.KindTuple:
			if dst, err = appendValues(dst, v.Tuple); err != nil {
				return dst, err
			}
		default:
			return dst, &EncodeError{Msg: "extra key value of unknown kind " + strconv.Itoa(int(v.Kind))}
		}
	}
	return dst, nil
}

// msgpack primitives, in msgspec's choice of encodings.

func appendNil(dst []byte) []byte { return append(dst, 0xc0) }

func appendFloat64(dst []byte, f float64) []byte {
	return appendBE64(append(dst, 0xcb), math.Float64bits(f))
}

func appendUint(dst []byte, v uint64) []byte {
	switch {
	case v <= 0x7f:
		return append(dst, byte(v))
	case v <= math.MaxUint8:
		return append(dst, 0xcc, byte(v))
	case v <= math.MaxUint16:
		return append(dst, 0xcd, byte(v>>8), byte(v))
	case v <= math.MaxUint32:
		return append(dst, 0xce, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
	return appendBE64(append(dst, 0xcf), v)
}

func appendInt(dst []byte, v int64) []byte {
	switch {
	case v >= 0:
		return appendUint(dst, uint64(v))
	case v >= -32:
		return append(dst, byte(v))
	case v >= math.MinInt8:
		return append(dst, 0xd0, byte(v))
	case v >= math.MinInt16:
		return append(dst, 0xd1, byte(v>>8), byte(v))
	case v >= math.MinInt32:
		return append(dst, 0xd2, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
	return appendBE64(append(dst, 0xd3), uint64(v))
}

func appendBE64(dst []byte, v uint64) []byte {
	return append(dst, byte(v>>56), byte(v>>48), byte(v>>40), byte(v>>32), byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
}

func appendLen(dst []byte, n int, fix, fixMax byte, c8, c16, c32 byte) []byte {
	switch {
	case n <= int(fixMax) && fix != 0:
		return append(dst, fix|byte(n))
	case n <= math.MaxUint8 && c8 != 0:
		return append(dst, c8, byte(n))
	case n <= math.MaxUint16:
		return append(dst, c16, byte(n>>8), byte(n))
	}
	return append(dst, c32, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
}

func appendArrayLen(dst []byte, n int) []byte { return appendLen(dst, n, 0x90, 15, 0, 0xdc, 0xdd) }
func appendMapLen(dst []byte, n int) []byte   { return appendLen(dst, n, 0x80, 15, 0, 0xde, 0xdf) }

func appendStr(dst []byte, s string) []byte {
	dst = appendLen(dst, len(s), 0xa0, 31, 0xd9, 0xda, 0xdb)
	return append(dst, s...)
}

func appendOptStr(dst []byte, s string) []byte {
	if s == "" {
		return appendNil(dst)
	}
	return appendStr(dst, s)
}

func appendBin(dst []byte, b []byte) []byte {
	dst = appendLen(dst, len(b), 0, 0, 0xc4, 0xc5, 0xc6)
	return append(dst, b...)
}
