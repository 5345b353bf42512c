package chattemplate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"testing"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// decodeJSONStd is what decodeJSON was built on encoding/json's
// Decoder.Token: the reference its fuzz test holds it to.
func decodeJSONStd(raw []byte, depth int) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodeValueStd(dec, depth)
	if err != nil {
		return jinja.Value{}, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return jinja.Value{}, errors.New("trailing data after the JSON value")
	}
	return v, nil
}

func decodeValueStd(dec *json.Decoder, depth int) (jinja.Value, error) {
	tok, err := dec.Token()
	if err != nil {
		return jinja.Value{}, err
	}
	switch tok := tok.(type) {
	case nil:
		return jinja.None(), nil
	case bool:
		return jinja.NewBool(tok), nil
	case string:
		return jinja.NewString(tok), nil
	case json.Number:
		return number(tok)
	case json.Delim:
		if depth >= maxDepth {
			return jinja.Value{}, fmt.Errorf("nested deeper than %d", maxDepth)
		}
		if tok == '[' {
			var items []jinja.Value
			for dec.More() {
				v, err := decodeValueStd(dec, depth+1)
				if err != nil {
					return jinja.Value{}, err
				}
				items = append(items, v)
			}
			if _, err := dec.Token(); err != nil {
				return jinja.Value{}, err
			}
			if items == nil {
				items = []jinja.Value{}
			}
			return jinja.NewList(items), nil
		}
		d := jinja.NewDict()
		dict := d.AsDict()
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return jinja.Value{}, err
			}
			key, _ := kt.(string)
			v, err := decodeValueStd(dec, depth+1)
			if err != nil {
				return jinja.Value{}, err
			}
			dict.Set(key, v)
		}
		if _, err := dec.Token(); err != nil {
			return jinja.Value{}, err
		}
		return d, nil
	}
	return jinja.Value{}, fmt.Errorf("unexpected JSON token %v", tok)
}

// sameValue reports whether a and b are the same value: same kinds, same
// scalars (floats bit for bit), same items, same keys in the same order.
func sameValue(a, b jinja.Value) bool {
	switch {
	case a.IsNone() || b.IsNone():
		return a.IsNone() && b.IsNone()
	case a.IsBool():
		return b.IsBool() && a.AsBool() == b.AsBool()
	case a.IsInt():
		return b.IsInt() && a.AsInt() == b.AsInt()
	case a.IsFloat():
		return b.IsFloat() && math.Float64bits(a.AsFloat()) == math.Float64bits(b.AsFloat())
	case a.IsString():
		return b.IsString() && a.AsString() == b.AsString()
	case a.IsList():
		if !b.IsList() || a.AsList().Len() != b.AsList().Len() {
			return false
		}
		for i, x := range a.AsList().Items {
			if !sameValue(x, b.AsList().Items[i]) {
				return false
			}
		}
		return true
	case a.IsDict():
		if !b.IsDict() || a.AsDict().Len() != b.AsDict().Len() {
			return false
		}
		for i, k := range a.AsDict().Keys {
			if b.AsDict().Keys[i] != k {
				return false
			}
			x, _ := a.AsDict().Get(k)
			y, _ := b.AsDict().Get(k)
			if !sameValue(x, y) {
				return false
			}
		}
		return true
	}
	return false
}

var decodeCases = []string{
	`{"role": "assistant", "content": null, "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": [2.5, -0.0, 1e3]}"}}]}`,
	`[1, -0, 0.5, 1E+2, 9223372036854775807, 9223372036854775808, -9223372036854775809, 1e400, 12345678901234567890123]`,
	`{"a": 1, "b": 2, "a": 3}`,
	`"\u00e9\ud83d\ude00 \ud800 \udc00\ud800\udc00 \ud800\u0041 \ud800x \\ \/ \" \b\f\n\r\t"`,
	"\"a\xffb\xed\xa0\x80c\xc3\"", "\"tab\there\"", `"\'"`, `"\u12"`, `"\uZZZZ"`, `"\ud800\uZZZZ"`,
	` true `, `false`, `null`, `nul`, `truex`, `[true false]`, `tru`,
	`01`, `-`, `-01`, `1.`, `.5`, `+1`, `1e`, `1e+`, `0x1`, `1.5e-3`, `-0.0e0`,
	`[1,]`, `[,1]`, `{"a":1,}`, `{"a" 1}`, `{1: 2}`, `{"a":1 "b":2}`, `[1 2]`, `[`, `{`, `{"a"`, `{"a":`, `"abc`, `"abc\`,
	``, ` `, `[] []`, `{} x`, `1 2`, `[[[]]]`, `{"": {"": []}}`, "\ufeff{}", "[\x00]", "\"\x7f\"",
}

// TestDecodeJSON: the one-pass decoder and the reference decode each case
// to the same value, or both refuse it.
func TestDecodeJSON(t *testing.T) {
	deep := func(n int) string { return string(bytes.Repeat([]byte("["), n)) + string(bytes.Repeat([]byte("]"), n)) }
	for _, c := range append(decodeCases, deep(maxDepth), deep(maxDepth+1), `{"a":`+deep(maxDepth-1)+`}`, `{"a":`+deep(maxDepth)+`}`) {
		for _, depth := range []int{0, 1} {
			got, err := decodeJSONAt([]byte(c), depth)
			want, wantErr := decodeJSONStd([]byte(c), depth)
			if (err == nil) != (wantErr == nil) || err == nil && !sameValue(got, want) {
				t.Errorf("%q at depth %d: got %v, %v; want %v, %v", c, depth, got, err, want, wantErr)
			}
		}
	}
}

// FuzzDecodeJSON holds the one-pass decoder to the reference built on
// encoding/json's Decoder.Token: same value, or both refuse.
//
//	go test -run '^$' -fuzz '^FuzzDecodeJSON$' -fuzztime 60s ./tokenizer/chattemplate
func FuzzDecodeJSON(f *testing.F) {
	for _, c := range decodeCases {
		f.Add([]byte(c))
	}
	for _, c := range readGolden(f) {
		f.Add([]byte(c.Messages))
		f.Add([]byte(c.Tools))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, err := decodeJSON(raw)
		want, wantErr := decodeJSONStd(raw, 0)
		if (err == nil) != (wantErr == nil) || err == nil && !sameValue(got, want) {
			t.Fatalf("%q: got %v, %v; want %v, %v", raw, got, err, want, wantErr)
		}
		if err == nil && !utf8.ValidString(fmt.Sprint(got)) {
			t.Fatalf("%q: decoded strings are not UTF-8", raw)
		}
	})
}
