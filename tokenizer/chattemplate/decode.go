package chattemplate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/ardanlabs/jinja"
)

// maxDepth bounds the nesting of decoded JSON, so that a hostile request
// cannot exhaust the stack of the (recursive) decoder or of the engine.
const maxDepth = 128

// decodeJSON decodes one JSON value into the engine's values, keeping
// object keys in their order (the engine's dicts are ordered; a Go map
// would not be) and integers apart from floats (json.dumps, and so a
// template's tojson, prints 3 and 3.0 differently).
func decodeJSON(raw []byte) (jinja.Value, error) {
	return decodeJSONAt(raw, 0)
}

// decodeJSONAt is decodeJSON for a value nested depth deep in another.
func decodeJSONAt(raw []byte, depth int) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodeValue(dec, depth)
	if err != nil {
		return jinja.Value{}, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return jinja.Value{}, errors.New("trailing data after the JSON value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder, depth int) (jinja.Value, error) {
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
				v, err := decodeValue(dec, depth+1)
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
			v, err := decodeValue(dec, depth+1)
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
