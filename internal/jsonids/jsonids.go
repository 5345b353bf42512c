package jsonids

import (
	"errors"
	"fmt"
)

var (
	errNegative   = errors.New("is negative; ids are non-negative integers")
	errNotInteger = errors.New("is not an integer")
	errOverflow   = errors.New("does not fit in 64 bits")
	errLeadZero   = errors.New("has a leading zero, which JSON does not allow")
)

// Parse decodes the JSON array at b[i:] (after any whitespace), appending
// its ids to dst, and returns them with the index just after the closing
// bracket. name is the field, for errors ("tokens"); an error names the
// element's index. What follows the array is the caller's to check.
func Parse(dst []uint64, b []byte, i int, name string) ([]uint64, int, error) {
	i = SkipSpace(b, i)
	if i >= len(b) || b[i] != '[' {
		return dst, i, fmt.Errorf("%s must be an array of non-negative integers", name)
	}
	i = SkipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return dst, i + 1, nil
	}
	for n := 0; ; n++ {
		v, j, err := parseID(b, i)
		if err != nil {
			return dst, j, fmt.Errorf("%s[%d]: %v", name, n, err)
		}
		dst = append(dst, v)
		i = SkipSpace(b, j)
		if i >= len(b) {
			return dst, i, fmt.Errorf("%s: unterminated array", name)
		}
		switch b[i] {
		case ',':
			i = SkipSpace(b, i+1)
		case ']':
			return dst, i + 1, nil
		default:
			return dst, i, fmt.Errorf("%s[%d]: unexpected %q", name, n, b[i])
		}
	}
}

// parseID parses the JSON number at b[i:] as a uint64 and returns the
// index after it.
func parseID(b []byte, i int) (uint64, int, error) {
	start := i
	if i < len(b) && b[i] == '-' {
		j := numberEnd(b, i+1)
		return 0, j, fmt.Errorf("%s %w", b[start:j], errNegative)
	}
	var v uint64
	digits := 0
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		d := uint64(b[i] - '0')
		if v > (1<<64-1-d)/10 {
			j := numberEnd(b, i)
			return 0, j, fmt.Errorf("%s %w", b[start:j], errOverflow)
		}
		v = v*10 + d
		digits++
	}
	if digits == 0 {
		return 0, i, fmt.Errorf("%s %w", describeValue(b, i), errNotInteger)
	}
	if i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E') {
		j := numberEnd(b, i)
		return 0, j, fmt.Errorf("%s %w", b[start:j], errNotInteger)
	}
	if digits > 1 && b[start] == '0' {
		return 0, i, fmt.Errorf("%s %w", b[start:i], errLeadZero)
	}
	return v, i, nil
}

func numberEnd(b []byte, i int) int {
	for i < len(b) && (b[i] >= '0' && b[i] <= '9' || b[i] == '.' || b[i] == 'e' || b[i] == 'E' || b[i] == '+' || b[i] == '-') {
		i++
	}
	return i
}

// describeValue names the non-number JSON value at b[i:] for an error.
func describeValue(b []byte, i int) string {
	if i >= len(b) {
		return "end of input"
	}
	switch b[i] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return fmt.Sprintf("%q", b[i])
}

// SkipSpace returns the index of the first byte at or after i that is
// not JSON whitespace.
func SkipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
