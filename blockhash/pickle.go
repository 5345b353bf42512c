package blockhash

import (
	"encoding/binary"
	"fmt"
	"math/bits"
)

// pickleCodec writes what CPython's C pickler (pickle.dumps(x,
// protocol=5)) produces for the block tuple, opcode for opcode: PROTO 5,
// FRAME headers (a frame is closed at the first object boundary once it
// holds 64 KiB, and a final frame under 4 bytes loses its header), MEMOIZE
// after every bytes, str and non-empty tuple, and CPython's integer opcode
// choice (BININT1, BININT2, BININT, LONG1).
//
// It never writes memo references (BINGET): CPython writes one only when the
// very same object appears twice in one block's input, which the wire does
// not reveal. Values of 64 KiB or more are refused: CPython writes them
// outside frames, a path not reproduced here.
type pickleCodec struct{}

const (
	pkProto           = 0x80
	pkFrame           = 0x95
	pkMemoize         = 0x94
	pkShortBinUnicode = 0x8c
	pkLong1           = 0x8a
	pkTuple1          = 0x85
	pkTuple2          = 0x86
	pkTuple3          = 0x87
	pkShortBinBytes   = 'C'
	pkBinBytes        = 'B'
	pkBinUnicode      = 'X'
	pkMark            = '('
	pkTuple           = 't'
	pkEmptyTuple      = ')'
	pkBinInt1         = 'K'
	pkBinInt2         = 'M'
	pkBinInt          = 'J'
	pkNone            = 'N'
	pkStop            = '.'

	pkFrameHeader = 9
	pkFrameTarget = 64 * 1024 // CPython's _FRAME_SIZE_TARGET
	pkFrameMin    = 4         // CPython's _FRAME_SIZE_MIN
)

// pickler accumulates one pickle with CPython's framing.
type pickler struct {
	b          []byte
	frameStart int
}

func (p *pickler) begin() {
	p.b = append(p.b, pkProto, 5)
	p.openFrame()
}

func (p *pickler) openFrame() {
	p.frameStart = len(p.b)
	p.b = append(p.b, pkFrame, 0, 0, 0, 0, 0, 0, 0, 0)
}

// commit closes the current frame, as _Pickler_CommitFrame does.
func (p *pickler) commit() {
	n := len(p.b) - p.frameStart - pkFrameHeader
	if n >= pkFrameMin {
		binary.LittleEndian.PutUint64(p.b[p.frameStart+1:], uint64(n))
		return
	}
	copy(p.b[p.frameStart:], p.b[p.frameStart+pkFrameHeader:])
	p.b = p.b[:len(p.b)-pkFrameHeader]
}

// boundary runs before every object is saved: CPython closes a frame at
// the first object boundary after it reached 64 KiB (fitted against the C
// pickler at the exact boundary, see testdata/pickle_edges.json).
func (p *pickler) boundary() {
	if len(p.b)-p.frameStart-pkFrameHeader >= pkFrameTarget {
		p.commit()
		p.openFrame()
	}
}

func (p *pickler) finish() []byte {
	p.b = append(p.b, pkStop)
	p.commit()
	return p.b
}

func (p *pickler) uint(v uint64) {
	p.boundary()
	switch {
	case v <= 0xff:
		p.b = append(p.b, pkBinInt1, byte(v))
	case v <= 0xffff:
		p.b = append(p.b, pkBinInt2, byte(v), byte(v>>8))
	case v <= 0x7fffffff:
		p.b = append(p.b, pkBinInt, byte(v), byte(v>>8), byte(v>>16), byte(v>>24))
	default:
		// LONG1: minimal little-endian two's complement; a positive value
		// needs bits/8+1 bytes so that its sign bit stays clear.
		n := bits.Len64(v)/8 + 1
		p.b = append(p.b, pkLong1, byte(n))
		for i := 0; i < n; i++ {
			if i < 8 {
				p.b = append(p.b, byte(v>>(8*i)))
			} else {
				p.b = append(p.b, 0)
			}
		}
	}
}

// pickleAppendUints writes the tokens' integer opcodes, as uint does, in
// one pass over a pre-sized buffer (the hot loop of pickle hashing).
func pickleAppendUints(b []byte, tokens []uint64) []byte {
	p := len(b)
	if need := p + 11*len(tokens); cap(b) < need {
		grown := make([]byte, p, need+need/2)
		copy(grown, b)
		b = grown
	}
	buf := b[:cap(b)]
	for _, t := range tokens {
		w := buf[p : p+11 : p+11] // opcode, length, up to 9 bytes
		switch {
		case t <= 0xff:
			w[0], w[1] = pkBinInt1, byte(t)
			p += 2
		case t <= 0xffff:
			w[0] = pkBinInt2
			binary.LittleEndian.PutUint16(w[1:], uint16(t))
			p += 3
		case t <= 0x7fffffff:
			w[0] = pkBinInt
			binary.LittleEndian.PutUint32(w[1:], uint32(t))
			p += 5
		default:
			n := bits.Len64(t)/8 + 1 // 5..9
			w[0], w[1] = pkLong1, byte(n)
			binary.LittleEndian.PutUint64(w[2:], t)
			w[10] = 0 // the sign byte when n == 9; overwritten otherwise
			p += 2 + n
		}
	}
	return buf[:p]
}

func (p *pickler) int(v int64) {
	if v >= 0 {
		p.uint(uint64(v))
		return
	}
	p.boundary()
	if v >= -1<<31 {
		u := uint32(int32(v))
		p.b = append(p.b, pkBinInt, byte(u), byte(u>>8), byte(u>>16), byte(u>>24))
		return
	}
	// CPython sizes by the magnitude's bit length, then drops a redundant
	// 0xff sign byte.
	n := bits.Len64(uint64(-v))/8 + 1
	u := uint64(v)
	at := func(i int) byte { // byte i of the sign-extended value
		if i >= 8 {
			return 0xff
		}
		return byte(u >> (8 * i))
	}
	if n > 1 && at(n-1) == 0xff && at(n-2)&0x80 != 0 {
		n--
	}
	p.b = append(p.b, pkLong1, byte(n))
	for i := 0; i < n; i++ {
		p.b = append(p.b, at(i))
	}
}

func (p *pickler) bytes(v []byte) error {
	p.boundary()
	switch {
	case len(v) < 256:
		p.b = append(p.b, pkShortBinBytes, byte(len(v)))
	case len(v) < pkFrameTarget:
		p.b = append(p.b, pkBinBytes)
		p.b = binary.LittleEndian.AppendUint32(p.b, uint32(len(v)))
	default:
		return fmt.Errorf("%w: pickled bytes of %d bytes (>= 64 KiB)", ErrUnsupported, len(v))
	}
	p.b = append(p.b, v...)
	p.b = append(p.b, pkMemoize)
	return nil
}

func (p *pickler) str(s string) error {
	p.boundary()
	switch {
	case len(s) < 256:
		p.b = append(p.b, pkShortBinUnicode, byte(len(s)))
	case len(s) < pkFrameTarget:
		p.b = append(p.b, pkBinUnicode)
		p.b = binary.LittleEndian.AppendUint32(p.b, uint32(len(s)))
	default:
		return fmt.Errorf("%w: pickled str of %d bytes (>= 64 KiB)", ErrUnsupported, len(s))
	}
	p.b = append(p.b, s...)
	p.b = append(p.b, pkMemoize)
	return nil
}

func (p *pickler) none() {
	p.boundary()
	p.b = append(p.b, pkNone)
}

// tupleStart and tupleEnd bracket a tuple's elements the way save_tuple
// does: TUPLE1..3 for short tuples, MARK ... TUPLE for longer ones, the
// empty tuple as EMPTY_TUPLE without a memo entry.
func (p *pickler) tupleStart(n int) {
	p.boundary()
	if n > 3 {
		p.b = append(p.b, pkMark)
	}
}

func (p *pickler) tupleEnd(n int) {
	switch n {
	case 0:
		p.b = append(p.b, pkEmptyTuple)
		return
	case 1:
		p.b = append(p.b, pkTuple1)
	case 2:
		p.b = append(p.b, pkTuple2)
	case 3:
		p.b = append(p.b, pkTuple3)
	default:
		p.b = append(p.b, pkTuple)
	}
	p.b = append(p.b, pkMemoize)
}

func (p *pickler) values(vs []Value, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("%w: extra keys nested deeper than %d", ErrUnsupported, maxDepth)
	}
	p.tupleStart(len(vs))
	for i := range vs {
		v := &vs[i]
		var err error
		switch v.Kind {
		case KindStr:
			err = p.str(v.Str)
		case KindInt:
			p.int(v.Int)
		case KindBytes:
			err = p.bytes(v.Bytes)
		case KindTuple:
			err = p.values(v.Tuple, depth+1)
		default:
			err = fmt.Errorf("blockhash: extra key %d has invalid kind %d", i, v.Kind)
		}
		if err != nil {
			return err
		}
	}
	p.tupleEnd(len(vs))
	return nil
}

func (pickleCodec) appendBlock(b []byte, parent []byte, tokens []uint64, extra BlockExtra) ([]byte, error) {
	p := pickler{b: b}
	p.begin()
	if err := p.bytes(parent); err != nil {
		return p.b, err
	}
	p.tupleStart(len(tokens))
	if len(p.b)-p.frameStart-pkFrameHeader+11*len(tokens) < pkFrameTarget {
		// No frame boundary can fall inside the tokens: skip the checks.
		p.b = pickleAppendUints(p.b, tokens)
	} else {
		for _, t := range tokens {
			p.uint(t)
		}
	}
	p.tupleEnd(len(tokens))
	if extra == nil {
		p.none()
	} else if err := p.values(extra, 0); err != nil {
		return p.b, err
	}
	p.b = append(p.b, pkTuple3, pkMemoize)
	return p.finish(), nil
}

func (pickleCodec) appendSeed(b []byte, seed string) ([]byte, error) {
	p := pickler{b: b}
	p.begin()
	if err := p.str(seed); err != nil {
		return p.b, err
	}
	return p.finish(), nil
}
