package snapstore

import "strings"

// escapeToken makes s one NATS subject token, reversibly: bytes in
// [A-Za-z0-9-] are kept, every other byte is written _XX (uppercase hex),
// the empty string is "_". The result is also a valid KV key part and
// object name part, with no '.' of its own.
//
// It must match kvevents/natstransport's subject token escaping (the
// contract's rule), so that a model names the same token everywhere.
func escapeToken(s string) string {
	if s == "" {
		return "_"
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-':
			b.WriteByte(c)
		default:
			b.WriteByte('_')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		}
	}
	return b.String()
}
