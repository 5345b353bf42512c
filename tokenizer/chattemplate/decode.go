package chattemplate

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/ardanlabs/jinja"

	"github.com/kvindex/kvindex/internal/jsonstr"
)

// maxDepth bounds the nesting of decoded JSON, so that a hostile request
// cannot exhaust the stack of the (recursive) decoder or of the engine.
const maxDepth = 128

// decodeJSON decodes one JSON value into the engine's values, keeping
// object keys in their order (the engine's dicts are ordered; a Go map
// would not be) and integers apart from floats (json.dumps, and so a
// template's tojson, prints 3 and 3.0 differently).
//
// It reads the bytes in one pass, accepting exactly what encoding/json
// accepts and reading strings as it does (bytes that are not UTF-8 and
// lone surrogates become U+FFFD); a key repeated in an object keeps its
// first place and takes its last value. FuzzDecodeJSON holds it to a
// decoder built on encoding/json's Decoder.Token.
func decodeJSON(raw []byte) (jinja.Value, error) {
	return decodeJSONAt(raw, 0)
}

// decodeJSONAt is decodeJSON for a value nested depth deep in another.
func decodeJSONAt(raw []byte, depth int) (jinja.Value, error) {
	d := decoder{data: raw}
	v, err := d.value(depth)
	if err != nil {
		return jinja.Value{}, err
	}
	if d.skipSpace(); d.pos < len(d.data) {
		return jinja.Value{}, errors.New("trailing data after the JSON value")
	}
	return v, nil
}

// decoder reads JSON from data, pos being the next byte to read.
type decoder struct {
	data []byte
	pos  int
}

func (d *decoder) skipSpace() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

// syntaxError reports what was found at the current position.
func (d *decoder) syntaxError() error {
	if d.pos >= len(d.data) {
		return errors.New("unexpected end of JSON input")
	}
	return fmt.Errorf("invalid character %q at offset %d", d.data[d.pos], d.pos)
}

func (d *decoder) value(depth int) (jinja.Value, error) {
	d.skipSpace()
	if d.pos >= len(d.data) {
		return jinja.Value{}, d.syntaxError()
	}
	switch c := d.data[d.pos]; {
	case c == '"':
		s, err := d.str()
		if err != nil {
			return jinja.Value{}, err
		}
		return jinja.NewString(s), nil
	case c == '[' || c == '{':
		if depth >= maxDepth {
			return jinja.Value{}, fmt.Errorf("nested deeper than %d", maxDepth)
		}
		if c == '[' {
			return d.list(depth)
		}
		return d.dict(depth)
	case c == 't':
		return jinja.NewBool(true), d.literal("true")
	case c == 'f':
		return jinja.NewBool(false), d.literal("false")
	case c == 'n':
		return jinja.None(), d.literal("null")
	case c == '-' || '0' <= c && c <= '9':
		return d.number()
	}
	return jinja.Value{}, d.syntaxError()
}

func (d *decoder) literal(word string) error {
	for i := 0; i < len(word); i++ {
		if d.pos >= len(d.data) || d.data[d.pos] != word[i] {
			return d.syntaxError()
		}
		d.pos++
	}
	return d.scalarEnd()
}

// scalarEnd checks that a literal or number ends where a value may end,
// so that "truex" and "01" are refused, as encoding/json refuses them.
func (d *decoder) scalarEnd() error {
	if d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r', ',', ']', '}':
		default:
			return d.syntaxError()
		}
	}
	return nil
}

// next skips space and consumes the byte that follows a list item or a
// dict entry: a comma (more follows) or close (the end).
func (d *decoder) next(close byte) (more bool, err error) {
	d.skipSpace()
	if d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ',':
			d.pos++
			return true, nil
		case close:
			d.pos++
			return false, nil
		}
	}
	return false, d.syntaxError()
}

func (d *decoder) list(depth int) (jinja.Value, error) {
	d.pos++ // [
	items := []jinja.Value{}
	if d.skipSpace(); d.pos < len(d.data) && d.data[d.pos] == ']' {
		d.pos++
		return jinja.NewList(items), nil
	}
	for more := true; more; {
		v, err := d.value(depth + 1)
		if err != nil {
			return jinja.Value{}, err
		}
		items = append(items, v)
		if more, err = d.next(']'); err != nil {
			return jinja.Value{}, err
		}
	}
	return jinja.NewList(items), nil
}

func (d *decoder) dict(depth int) (jinja.Value, error) {
	d.pos++ // {
	v := jinja.NewDict()
	dict := v.AsDict()
	if d.skipSpace(); d.pos < len(d.data) && d.data[d.pos] == '}' {
		d.pos++
		return v, nil
	}
	for more := true; more; {
		if d.skipSpace(); d.pos >= len(d.data) || d.data[d.pos] != '"' {
			return jinja.Value{}, d.syntaxError()
		}
		key, err := d.str()
		if err != nil {
			return jinja.Value{}, err
		}
		if d.skipSpace(); d.pos >= len(d.data) || d.data[d.pos] != ':' {
			return jinja.Value{}, d.syntaxError()
		}
		d.pos++
		item, err := d.value(depth + 1)
		if err != nil {
			return jinja.Value{}, err
		}
		dict.Set(key, item)
		if more, err = d.next('}'); err != nil {
			return jinja.Value{}, err
		}
	}
	return v, nil
}

// number reads a number as JSON's grammar has it, then converts it (see
// number).
func (d *decoder) number() (jinja.Value, error) {
	start := d.pos
	digits := func() int {
		n := d.pos
		for d.pos < len(d.data) && '0' <= d.data[d.pos] && d.data[d.pos] <= '9' {
			d.pos++
		}
		return d.pos - n
	}
	if d.data[d.pos] == '-' {
		d.pos++
	}
	if d.pos < len(d.data) && d.data[d.pos] == '0' {
		d.pos++
	} else if digits() == 0 {
		return jinja.Value{}, d.syntaxError()
	}
	if d.pos < len(d.data) && d.data[d.pos] == '.' {
		d.pos++
		if digits() == 0 {
			return jinja.Value{}, d.syntaxError()
		}
	}
	if d.pos < len(d.data) && (d.data[d.pos] == 'e' || d.data[d.pos] == 'E') {
		d.pos++
		if d.pos < len(d.data) && (d.data[d.pos] == '+' || d.data[d.pos] == '-') {
			d.pos++
		}
		if digits() == 0 {
			return jinja.Value{}, d.syntaxError()
		}
	}
	if err := d.scalarEnd(); err != nil {
		return jinja.Value{}, err
	}
	return number(json.Number(d.data[start:d.pos]))
}

// str reads a string, d.pos at its opening quote.
func (d *decoder) str() (string, error) {
	start := d.pos + 1 // past "
	s, end, ok := jsonstr.String(d.data, start)
	switch {
	case end < 0:
		d.pos = len(d.data)
		return "", d.syntaxError()
	case !ok:
		return "", fmt.Errorf("invalid string at offset %d", start-1)
	}
	d.pos = end + 1
	return s, nil
}

// number keeps a JSON integer an integer when it fits in int64, as
// Python's json.loads does; anything else is a float.
func number(n json.Number) (jinja.Value, error) {
	s := string(n)
	if !strings.ContainsAny(s, ".eE") {
		if i, err := n.Int64(); err == nil {
			return jinja.NewInt(i), nil
		}
	}
	f, err := n.Float64()
	if err != nil {
		return jinja.Value{}, fmt.Errorf("number %s: %v", s, err)
	}
	return jinja.NewFloat(f), nil
}
