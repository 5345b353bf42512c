package client

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// ParseTokenIDs reads token ids as a file holds them: a JSON array of
// non-negative integers (ids above 2^53 stay exact), or ids separated by
// commas or whitespace (ParseTokenList). Surrounding whitespace is
// ignored. An error names the element at fault, e.g.
// `element 3: "x" is not a non-negative integer`.
func ParseTokenIDs(data []byte) ([]uint64, error) {
	data = bytes.TrimSpace(data)
	if len(data) > 0 && data[0] == '[' {
		return parseTokenJSON(data)
	}
	return ParseTokenList(string(data))
}

// parseTokenJSON reads a JSON array of non-negative integers; json.Number
// keeps ids above 2^53 exact.
func parseTokenJSON(data []byte) ([]uint64, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var raw []any
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("not a JSON array of integers: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("not a JSON array of integers: more data after the array")
	}
	if len(raw) == 0 {
		return nil, errors.New("empty token array")
	}
	out := make([]uint64, len(raw))
	for i, v := range raw {
		n, ok := v.(json.Number)
		if !ok {
			return nil, fmt.Errorf("element %d is %v, not an integer", i, v)
		}
		t, err := parseTokenID(n.String())
		if err != nil {
			return nil, fmt.Errorf("element %d: %v", i, err)
		}
		out[i] = t
	}
	return out, nil
}

// ParseTokenList reads token ids separated by commas or whitespace
// ("1,2,3", "1 2 3"). An error names the token at fault, e.g.
// `token 1: "-2" is negative; token ids are non-negative integers`.
func ParseTokenList(s string) ([]uint64, error) {
	fields := strings.FieldsFunc(s, func(r rune) bool {
		return r == ',' || r == ' ' || r == '\t' || r == '\n' || r == '\r'
	})
	if len(fields) == 0 {
		return nil, errors.New("no token ids")
	}
	out := make([]uint64, len(fields))
	for i, f := range fields {
		t, err := parseTokenID(f)
		if err != nil {
			return nil, fmt.Errorf("token %d: %v", i, err)
		}
		out[i] = t
	}
	return out, nil
}

// parseTokenID reads one id in decimal.
func parseTokenID(s string) (uint64, error) {
	if strings.HasPrefix(s, "-") {
		return 0, fmt.Errorf("%q is negative; token ids are non-negative integers", s)
	}
	t, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a non-negative integer", s)
	}
	return t, nil
}
