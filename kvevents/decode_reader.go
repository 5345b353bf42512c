//go:build !kvevents_msgpacklib

package kvevents

import (
	"encoding/binary"
	"errors"
	"math"
)

// reader reads msgpack values straight from the payload slice.
//
// It replaces vmihailenco/msgpack's streaming Decoder on the hot path for
// two reasons the benchmark and the tests found. Speed: the library costs
// every value an io.ByteScanner call to peek, another to read the code and
// an io.ReadFull for the argument bytes, most of the decoding time;
// BenchmarkDecode measures both readers (README.md's Performance section
// has the figures).
//
// Safety: on a str, bin or ext header declaring more bytes than remain,
// the library's Skip grows the Decoder's buffer by 1 MiB and keeps it, so
// a Decoder reused across hostile payloads grows without bound (v5.4.1:
// about 10 GiB after 40 payloads of 8 bytes);
// TestDecodeHugeDeclaredSizesAllocateLittle guards against that here.
//
// The library-backed reader is kept, selected by the build tag
// kvevents_msgpacklib, so the comparison can be rerun
// (go test -tags kvevents_msgpacklib -bench Decode ./kvevents) and the
// whole test suite, fuzz target included, can run against either reader.
//
// Callers peek at a value's code and check its family before reading it;
// the methods still check every bound themselves and never index past
// the payload.
type reader struct {
	p   []byte
	off int
}

func newDecodeState() *decodeState { return &decodeState{} }

func (r *reader) reset(p []byte) { r.p, r.off = p, 0 }

func (r *reader) left() int    { return len(r.p) - r.off }
func (r *reader) pos() int     { return r.off }
func (r *reader) seek(pos int) { r.off = pos }

func (r *reader) peek() (byte, bool) {
	if r.off < len(r.p) {
		return r.p[r.off], true
	}
	return 0, false
}

// arg reads the n-byte big-endian argument that follows the code byte and
// advances past both.
func (r *reader) arg(n int) (uint64, bool) {
	if len(r.p)-r.off < 1+n {
		return 0, false
	}
	b := r.p[r.off+1:]
	var v uint64
	switch n {
	case 1:
		v = uint64(b[0])
	case 2:
		v = uint64(binary.BigEndian.Uint16(b))
	case 4:
		v = uint64(binary.BigEndian.Uint32(b))
	case 8:
		v = binary.BigEndian.Uint64(b)
	}
	r.off += 1 + n
	return v, true
}

var errWrongType = errors.New("unexpected msgpack type")

func (r *reader) arrayLen() (int, error) { return r.containerLen(0x90, 0xdc, 0xdd) }

func (r *reader) mapLen() (int, error) { return r.containerLen(0x80, 0xde, 0xdf) }

// containerLen reads an array or map header: a fix form (fix..fix+15)
// carrying the length in its low nibble, or the 16- and 32-bit forms.
func (r *reader) containerLen(fix, c16, c32 byte) (int, error) {
	c, ok := r.peek()
	if !ok {
		return 0, errTruncated
	}
	var n uint64
	switch {
	case c >= fix && c <= fix+0x0f:
		r.off++
		return int(c & 0x0f), nil
	case c == c16:
		n, ok = r.arg(2)
	case c == c32:
		n, ok = r.arg(4)
	default:
		return 0, errWrongType
	}
	if !ok {
		return 0, errTruncated
	}
	return int(n), nil
}

// integer reads an int of any width. For the signed family a negative
// value is returned as its two's complement bit pattern with neg set.
func (r *reader) integer() (v uint64, neg bool, err error) {
	c, ok := r.peek()
	if !ok {
		return 0, false, errTruncated
	}
	switch {
	case c <= 0x7f:
		r.off++
		return uint64(c), false, nil
	case c >= 0xe0:
		r.off++
		return uint64(int64(int8(c))), true, nil
	case c >= 0xcc && c <= 0xcf:
		v, ok = r.arg(1 << (c - 0xcc))
	case c >= 0xd0 && c <= 0xd3:
		n := 1 << (c - 0xd0)
		if v, ok = r.arg(n); ok {
			// Sign-extend from n bytes.
			shift := 64 - 8*uint(n)
			s := int64(v<<shift) >> shift
			return uint64(s), s < 0, nil
		}
	default:
		return 0, false, errWrongType
	}
	if !ok {
		return 0, false, errTruncated
	}
	return v, false, nil
}

// token reads a non-negative int; anything else is errNotUint, with the
// value left unread. It is the innermost loop of decoding.
func (r *reader) token() (uint64, error) {
	p, off := r.p, r.off
	if off >= len(p) {
		return 0, errNotUint
	}
	c := p[off]
	if c <= 0x7f {
		r.off = off + 1
		return uint64(c), nil
	}
	switch c {
	case 0xcd: // uint16: most vocabularies
		if len(p)-off >= 3 {
			r.off = off + 3
			return uint64(binary.BigEndian.Uint16(p[off+1:])), nil
		}
	case 0xce: // uint32: vocabularies beyond 65535
		if len(p)-off >= 5 {
			r.off = off + 5
			return uint64(binary.BigEndian.Uint32(p[off+1:])), nil
		}
	case 0xcc:
		if len(p)-off >= 2 {
			r.off = off + 2
			return uint64(p[off+1]), nil
		}
	case 0xcf:
		if len(p)-off >= 9 {
			r.off = off + 9
			return binary.BigEndian.Uint64(p[off+1:]), nil
		}
	case 0xd0, 0xd1, 0xd2, 0xd3:
		// A signed encoding of a non-negative value is legal msgpack.
		v, neg, err := r.integer()
		if err != nil {
			return 0, err
		}
		if neg {
			r.off = off
			return 0, errNotUint
		}
		return v, nil
	default:
		return 0, errNotUint
	}
	return 0, errTruncated
}

func (r *reader) float() (float64, error) {
	c, ok := r.peek()
	if !ok {
		return 0, errTruncated
	}
	switch c {
	case 0xca:
		v, ok := r.arg(4)
		if !ok {
			return 0, errTruncated
		}
		return float64(math.Float32frombits(uint32(v))), nil
	case 0xcb:
		v, ok := r.arg(8)
		if !ok {
			return 0, errTruncated
		}
		return math.Float64frombits(v), nil
	}
	return 0, errWrongType
}

// bytesHeader returns the length of the str or bin value at the cursor
// and the size of its header.
func (r *reader) bytesHeader() (n, hdr int, err error) {
	c, ok := r.peek()
	if !ok {
		return 0, 0, errTruncated
	}
	switch {
	case c >= 0xa0 && c <= 0xbf:
		return int(c & 0x1f), 1, nil
	case c == 0xd9 || c == 0xc4:
		hdr = 2
	case c == 0xda || c == 0xc5:
		hdr = 3
	case c == 0xdb || c == 0xc6:
		hdr = 5
	default:
		return 0, 0, errWrongType
	}
	if len(r.p)-r.off < hdr {
		return 0, 0, errTruncated
	}
	return int(r.peekArg(hdr - 1)), hdr, nil
}

// peekArg reads the n-byte argument after the code without advancing; it
// returns 0 when the payload is too short (the caller checks).
func (r *reader) peekArg(n int) uint64 {
	if len(r.p)-r.off < 1+n {
		return 0
	}
	b := r.p[r.off+1:]
	switch n {
	case 1:
		return uint64(b[0])
	case 2:
		return uint64(binary.BigEndian.Uint16(b))
	}
	return uint64(binary.BigEndian.Uint32(b))
}

// bytes reads a str or bin value. The result aliases the payload.
func (r *reader) bytes() ([]byte, error) {
	n, hdr, err := r.bytesHeader()
	if err != nil {
		return nil, err
	}
	start := r.off + hdr
	if n > len(r.p)-start {
		return nil, errTruncated
	}
	r.off = start + n
	return r.p[start:r.off:r.off], nil
}

// skip skips one value of any type. It is iterative, so no nesting depth
// can exhaust the stack, and checks every declared length against the
// bytes that remain.
func (r *reader) skip() error {
	for pending := 1; pending > 0; pending-- {
		c, ok := r.peek()
		if !ok {
			return errTruncated
		}
		var size int // bytes of a scalar value, header included
		switch familyOf(c) {
		case famArray:
			n, err := r.arrayLen()
			if err != nil {
				return err
			}
			pending += n
		case famMap:
			n, err := r.mapLen()
			if err != nil {
				return err
			}
			pending += 2 * n
		case famStr, famBin:
			n, hdr, err := r.bytesHeader()
			if err != nil {
				return err
			}
			size = hdr + n
		case famExt:
			size = extSize(c, r)
			if size < 0 {
				return errTruncated
			}
		case famInvalid:
			return errInvalid
		default:
			size = scalarSize[c]
		}
		if size > len(r.p)-r.off {
			return errTruncated
		}
		r.off += size
		if pending-1 > len(r.p)-r.off {
			return errTruncated // more values declared than bytes remain
		}
	}
	return nil
}

// extSize returns the size of the ext value at the cursor, or -1 when its
// header is truncated.
func extSize(c byte, r *reader) int {
	switch c {
	case 0xd4:
		return 3
	case 0xd5:
		return 4
	case 0xd6:
		return 6
	case 0xd7:
		return 10
	case 0xd8:
		return 18
	}
	hdr := 4 // ext32
	switch c {
	case 0xc7:
		hdr = 1
	case 0xc8:
		hdr = 2
	}
	if len(r.p)-r.off < 1+hdr+1 {
		return -1
	}
	return 1 + hdr + 1 + int(r.peekArg(hdr))
}

// scalarSize is the encoded size of nil, bool, int and float values by
// first byte.
var scalarSize = func() (t [256]int) {
	for c := 0; c < 256; c++ {
		switch {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
			t[c] = 1
		case c == 0xcc || c == 0xd0:
			t[c] = 2
		case c == 0xcd || c == 0xd1:
			t[c] = 3
		case c == 0xce || c == 0xd2 || c == 0xca:
			t[c] = 5
		case c == 0xcf || c == 0xd3 || c == 0xcb:
			t[c] = 9
		}
	}
	return t
}()
