//go:build kvevents_msgpacklib

package kvevents

import (
	"bytes"
	"errors"
	"io"

	"github.com/vmihailenco/msgpack/v5"
)

// reader reads msgpack values from one payload with vmihailenco/msgpack's
// streaming Decoder. It is the reference the hand-written reader of
// decode_reader.go was measured against, built only with the tag
// kvevents_msgpacklib (see there for the numbers). Callers peek at a
// value's code and check its family before reading it, so the library
// only ever sees the type it expects.
type reader struct {
	br   bytes.Reader
	dec  *msgpack.Decoder
	size int
	buf  []byte // scratch for str and bin values
}

func newDecodeState() *decodeState {
	s := &decodeState{}
	s.r.dec = msgpack.NewDecoder(nil)
	return s
}

func (r *reader) reset(p []byte) {
	r.br.Reset(p)
	r.size = len(p)
	if p == nil && cap(r.buf) > 64<<10 {
		r.buf = nil // do not keep a hostile payload's scratch in the pool
	}
	r.dec.Reset(&r.br)
}

func (r *reader) left() int { return r.br.Len() }
func (r *reader) pos() int  { return r.size - r.br.Len() }

func (r *reader) seek(pos int) { _, _ = r.br.Seek(int64(pos), io.SeekStart) }

func (r *reader) peek() (byte, bool) {
	c, err := r.dec.PeekCode()
	return c, err == nil
}

func libErr(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errTruncated
	}
	return err
}

func (r *reader) arrayLen() (int, error) {
	n, err := r.dec.DecodeArrayLen()
	return n, libErr(err)
}

func (r *reader) mapLen() (int, error) {
	n, err := r.dec.DecodeMapLen()
	return n, libErr(err)
}

// integer reads an int of any width. For the signed family a negative
// value is returned as its two's complement bit pattern with neg set.
func (r *reader) integer() (v uint64, neg bool, err error) {
	c, err := r.dec.PeekCode()
	if err != nil {
		return 0, false, libErr(err)
	}
	if c <= 0x7f || (c >= 0xcc && c <= 0xcf) {
		v, err = r.dec.DecodeUint64()
		return v, false, libErr(err)
	}
	i, err := r.dec.DecodeInt64()
	return uint64(i), i < 0, libErr(err)
}

// token reads a non-negative int; anything else is errNotUint, with the
// value left unread.
func (r *reader) token() (uint64, error) {
	c, err := r.dec.PeekCode()
	if err != nil {
		return 0, errNotUint
	}
	switch {
	case c <= 0x7f, c >= 0xcc && c <= 0xcf:
		v, err := r.dec.DecodeUint64()
		return v, libErr(err)
	case c >= 0xd0 && c <= 0xd3:
		// A signed encoding of a non-negative value is legal msgpack.
		i, err := r.dec.DecodeInt64()
		if err != nil {
			return 0, libErr(err)
		}
		if i < 0 {
			r.seekBack(c)
			return 0, errNotUint
		}
		return uint64(i), nil
	}
	return 0, errNotUint
}

// seekBack un-reads the signed int whose code was c.
func (r *reader) seekBack(c byte) {
	r.seek(r.pos() - 1 - (1 << (c - 0xd0)))
}

func (r *reader) float() (float64, error) {
	f, err := r.dec.DecodeFloat64()
	return f, libErr(err)
}

// bytes reads a str or bin value; the result aliases a scratch buffer
// valid until the next call.
func (r *reader) bytes() ([]byte, error) {
	n, err := r.dec.DecodeBytesLen()
	if err != nil {
		return nil, libErr(err)
	}
	n = max(n, 0)
	if n > r.br.Len() {
		return nil, errTruncated
	}
	if cap(r.buf) < n {
		r.buf = make([]byte, n)
	}
	b := r.buf[:n]
	if err := r.dec.ReadFull(b); err != nil {
		return nil, libErr(err)
	}
	return b, nil
}

// skip skips one value of any type. It is iterative (no recursion, so no
// nesting depth can exhaust the stack) and checks every declared length
// against the bytes that remain.
func (r *reader) skip() error {
	for pending := 1; pending > 0; pending-- {
		c, err := r.dec.PeekCode()
		if err != nil {
			return errTruncated
		}
		switch familyOf(c) {
		case famArray:
			n, err := r.dec.DecodeArrayLen()
			if err != nil {
				return libErr(err)
			}
			if n > r.br.Len() {
				return errTruncated
			}
			pending += n
		case famMap:
			n, err := r.dec.DecodeMapLen()
			if err != nil {
				return libErr(err)
			}
			if 2*n > r.br.Len() {
				return errTruncated
			}
			pending += 2 * n
		case famStr, famBin:
			// Not the library's Skip: on a length beyond the data it
			// grows the Decoder's buffer by 1 MiB per call and keeps it,
			// so a reused Decoder fed hostile headers grows without bound
			// (v5.4.1: 10 GiB after 40 eight-byte payloads).
			n, err := r.dec.DecodeBytesLen()
			if err != nil {
				return libErr(err)
			}
			if err := r.discard(n); err != nil {
				return err
			}
		case famExt:
			n, err := r.extLen(c)
			if err != nil {
				return err
			}
			if err := r.discard(n); err != nil {
				return err
			}
		case famInvalid:
			return errInvalid
		default: // nil, bool, int, float: fixed sizes
			if err := r.dec.Skip(); err != nil {
				return libErr(err)
			}
		}
		if pending > r.br.Len()+1 {
			return errTruncated
		}
	}
	return nil
}

// discard skips n bytes of the payload.
func (r *reader) discard(n int) error {
	n = max(n, 0)
	if n > r.br.Len() {
		return errTruncated
	}
	_, _ = r.br.Seek(int64(n), io.SeekCurrent)
	return nil
}

// extLen reads the header of the ext value starting with c and returns
// the number of bytes that follow it (type byte and data).
func (r *reader) extLen(c byte) (int, error) {
	var hdr [5]byte
	if c >= 0xd4 && c <= 0xd8 { // fixext 1, 2, 4, 8, 16
		if err := r.dec.ReadFull(hdr[:1]); err != nil {
			return 0, libErr(err)
		}
		return 1 + 1<<(c-0xd4), nil
	}
	w := 1 << (c - 0xc7) // ext8, ext16, ext32: 1, 2 or 4 length bytes
	if err := r.dec.ReadFull(hdr[:1+w]); err != nil {
		return 0, libErr(err)
	}
	var n int
	for _, b := range hdr[1 : 1+w] {
		n = n<<8 | int(b)
	}
	return 1 + n, nil
}
