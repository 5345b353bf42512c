// Package jsonstr decodes JSON strings as encoding/json does, for the
// one-pass JSON readers of the picker (chat messages) and the chat
// template (its values): String finds a string's end and takes its bytes
// as they stand when they need no decoding (Scan), else decodes them
// (Append).
package jsonstr

import (
	"encoding/binary"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// End returns the index of the quote that closes the JSON string whose
// contents start at data[i] (past its opening quote), or -1 when the
// data ends first. It does not check the contents (Append does).
func End(data []byte, i int) int {
	for ; i < len(data); i++ {
		switch data[i] {
		case '"':
			return i
		case '\\':
			i++
		}
	}
	return -1
}

// Scan returns the index of the quote that closes the JSON string whose
// contents start at data[i] (past its opening quote), or -1 when the data
// ends first, and whether the contents are plain: no escape, no control
// character, valid UTF-8, so that they are the decoded string's bytes
// as they stand. Contents that are not plain go to Append, which decodes
// them or finds them invalid.
//
// It reads eight bytes at a time while they are printable ASCII, as
// most of a chat turn's body is: BenchmarkScan compares it with End's
// byte loop (which only finds the quote).
func Scan(data []byte, i int) (end int, plain bool) {
	plain = true
	for i < len(data) {
		i = skipPlainASCII(data, i)
		if i >= len(data) {
			break
		}
		switch c := data[i]; {
		case c == '"':
			return i, plain
		case c == '\\':
			plain = false
			i += 2
		case c < ' ':
			plain = false
			i++
		case c < utf8.RuneSelf:
			i++
		default:
			r, size := utf8.DecodeRune(data[i:])
			if r == utf8.RuneError && size == 1 {
				plain = false
			}
			i += size
		}
	}
	return -1, false
}

const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// skipPlainASCII returns the index of the first byte at or after data[i]
// that is not printable ASCII other than a quote or a backslash, or
// len(data): whole words first, then bytes.
func skipPlainASCII(data []byte, i int) int {
	for ; i+8 <= len(data); i += 8 {
		w := binary.LittleEndian.Uint64(data[i:])
		// A byte with its high bit set, a byte below 0x20, a quote, a
		// backslash: zero when the word has none (the bit tricks of
		// "Bit Twiddling Hacks", exact as a zero test for ASCII words).
		if w&highs|(w-ones*0x20)&^w&highs|(w^(ones*'"')-ones)&^(w^(ones*'"'))&highs|
			(w^(ones*'\\')-ones)&^(w^(ones*'\\'))&highs != 0 {
			break
		}
	}
	for ; i < len(data); i++ {
		if c := data[i]; c < ' ' || c >= utf8.RuneSelf || c == '"' || c == '\\' {
			break
		}
	}
	return i
}

// String decodes the JSON string whose contents start at data[i] (past
// its opening quote) as encoding/json does: its bytes as they stand when
// plain (Scan), else decoded by Append. end is the index of its closing
// quote, -1 when the data ends first; ok is false for contents that are
// not valid JSON (or no closing quote).
func String(data []byte, i int) (s string, end int, ok bool) {
	end, plain := Scan(data, i)
	if end < 0 {
		return "", -1, false
	}
	v := data[i:end]
	if plain {
		return string(v), end, true
	}
	b, ok := Append(make([]byte, 0, len(v)), v)
	if !ok {
		return "", end, false
	}
	// b is this string's alone and never written again: no copy.
	return unsafe.String(unsafe.SliceData(b), len(b)), end, true
}

// Append appends the decoded contents v of a JSON string (between its
// quotes) to dst, as encoding/json decodes them: escapes, a \u surrogate
// pair as one rune and a lone surrogate as U+FFFD, each byte of invalid
// UTF-8 as U+FFFD. ok is false for contents that are not valid JSON: a
// control character, an unknown or cut escape, an unescaped quote.
func Append(dst, v []byte) (_ []byte, ok bool) {
	for r := 0; r < len(v); {
		if plain := skipPlainASCII(v, r); plain > r {
			dst = append(dst, v[r:plain]...)
			if r = plain; r >= len(v) {
				break
			}
		}
		switch c := v[r]; {
		case c == '\\':
			if r+1 >= len(v) {
				return dst, false
			}
			switch e := v[r+1]; e {
			case '"', '\\', '/':
				dst = append(dst, e)
			case 'b':
				dst = append(dst, '\b')
			case 'f':
				dst = append(dst, '\f')
			case 'n':
				dst = append(dst, '\n')
			case 'r':
				dst = append(dst, '\r')
			case 't':
				dst = append(dst, '\t')
			case 'u':
				rr := hex4(v, r+2)
				if rr < 0 {
					return dst, false
				}
				r += 6
				if utf16.IsSurrogate(rr) {
					// A pair is one rune; a lone surrogate is U+FFFD, and
					// what follows it is read on its own.
					if r+1 < len(v) && v[r] == '\\' && v[r+1] == 'u' {
						if pair := utf16.DecodeRune(rr, hex4(v, r+2)); pair != utf8.RuneError {
							dst = utf8.AppendRune(dst, pair)
							r += 6
							continue
						}
					}
					rr = utf8.RuneError
				}
				dst = utf8.AppendRune(dst, rr)
				continue
			default:
				return dst, false
			}
			r += 2
		case c < ' ' || c == '"':
			return dst, false
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			r++
		default:
			rr, size := utf8.DecodeRune(v[r:])
			dst = utf8.AppendRune(dst, rr) // U+FFFD for a byte of invalid UTF-8
			r += size
		}
	}
	return dst, true
}

// hex4 reads the four hex digits at v[i:], or returns -1.
func hex4(v []byte, i int) rune {
	if i+4 > len(v) {
		return -1
	}
	var r rune
	for _, c := range v[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}
