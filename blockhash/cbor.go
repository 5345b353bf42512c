package blockhash

import (
	"encoding/binary"
	"fmt"
)

// cborCodec writes the canonical CBOR (RFC 8949 core deterministic
// encoding, as Python's cbor2.dumps(x, canonical=True) produces it) of the
// 3-tuple (parent, tokens, extra). Only the value types that occur in block
// hashing are needed: unsigned and negative ints, bytes, text, arrays and
// null, all with shortest-form heads.
//
// Hand-written rather than github.com/fxamacker/cbor/v2: the library
// allocates per call and costs several times the hash itself
// (BenchmarkCBOREncode compares both); the tests check this encoder
// against the library byte for byte.
type cborCodec struct{}

const (
	cborUint  = 0 << 5
	cborNeg   = 1 << 5
	cborBytes = 2 << 5
	cborText  = 3 << 5
	cborArray = 4 << 5
	cborNull  = 0xf6
)

func (cborCodec) appendBlock(b []byte, parent []byte, tokens []uint64, extra BlockExtra) ([]byte, error) {
	b = append(b, cborArray|3)
	b = cborHead(b, cborBytes, uint64(len(parent)))
	b = append(b, parent...)
	b = cborHead(b, cborArray, uint64(len(tokens)))
	b = cborAppendUints(b, tokens)
	if extra == nil {
		return append(b, cborNull), nil
	}
	return cborAppendTuple(b, extra, 0)
}

func (cborCodec) appendSeed(b []byte, seed string) ([]byte, error) {
	b = cborHead(b, cborText, uint64(len(seed)))
	return append(b, seed...), nil
}

// maxDepth bounds tuple nesting in extra keys; engines send depth 2.
const maxDepth = 8

func cborAppendTuple(b []byte, vs []Value, depth int) ([]byte, error) {
	if depth > maxDepth {
		return b, fmt.Errorf("%w: extra keys nested deeper than %d", ErrUnsupported, maxDepth)
	}
	b = cborHead(b, cborArray, uint64(len(vs)))
	var err error
	for i := range vs {
		v := &vs[i]
		switch v.Kind {
		case KindStr:
			b = cborHead(b, cborText, uint64(len(v.Str)))
			b = append(b, v.Str...)
		case KindInt:
			if v.Int >= 0 {
				b = cborHead(b, cborUint, uint64(v.Int))
			} else {
				b = cborHead(b, cborNeg, uint64(-1-v.Int))
			}
		case KindBytes:
			b = cborHead(b, cborBytes, uint64(len(v.Bytes)))
			b = append(b, v.Bytes...)
		case KindTuple:
			if b, err = cborAppendTuple(b, v.Tuple, depth+1); err != nil {
				return b, err
			}
		default:
			return b, fmt.Errorf("blockhash: extra key %d has invalid kind %d", i, v.Kind)
		}
	}
	return b, nil
}

// cborAppendUints appends each token as a CBOR unsigned int. It is the
// hot loop of block hashing: it sizes the buffer once and writes heads by
// index instead of appending byte by byte through cborHead, which was
// markedly slower per token (BenchmarkChain).
func cborAppendUints(b []byte, tokens []uint64) []byte {
	p := len(b)
	if need := p + 9*len(tokens); cap(b) < need {
		grown := make([]byte, p, need+need/2)
		copy(grown, b)
		b = grown
	}
	buf := b[:cap(b)]
	for _, t := range tokens {
		w := buf[p : p+9 : p+9]
		switch {
		case t < 24:
			w[0] = byte(t)
			p++
		case t <= 0xff:
			w[0], w[1] = cborUint|24, byte(t)
			p += 2
		case t <= 0xffff:
			w[0] = cborUint | 25
			binary.BigEndian.PutUint16(w[1:], uint16(t))
			p += 3
		case t <= 0xffffffff:
			w[0] = cborUint | 26
			binary.BigEndian.PutUint32(w[1:], uint32(t))
			p += 5
		default:
			w[0] = cborUint | 27
			binary.BigEndian.PutUint64(w[1:], t)
			p += 9
		}
	}
	return buf[:p]
}

// cborHead appends a major type with its shortest-form argument.
func cborHead(b []byte, major byte, v uint64) []byte {
	switch {
	case v < 24:
		return append(b, major|byte(v))
	case v <= 0xff:
		return append(b, major|24, byte(v))
	case v <= 0xffff:
		return append(b, major|25, byte(v>>8), byte(v))
	case v <= 0xffffffff:
		return append(b, major|26, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	default:
		return append(b, major|27, byte(v>>56), byte(v>>48), byte(v>>40), byte(v>>32),
			byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
}
