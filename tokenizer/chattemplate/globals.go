package chattemplate

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// tojsonName is the name the template's tojson filter is renamed to (see
// rewriteToJSON): the engine looks its own filters up before the
// caller's, so HF's tojson can only take over under another name.
const tojsonName = "__hf_tojson"

// macroGuardName and macroGuardParam name the function and the parameter
// rewrite adds to every macro; macroCallBudget bounds the macro calls of
// one render. The engine recurses on the Go stack with no limit of its
// own, so a template whose macro calls itself without end would crash
// the process (a Go stack overflow cannot be recovered); Python's Jinja
// stops such a template with a RecursionError. A real template makes a
// few hundred calls even for large tool lists (gpt-oss's schema
// printer is the largest we know).
const (
	macroGuardName  = "__macro_call"
	macroGuardParam = "__macro_guard"
	macroCallBudget = 10_000
)

// macroGuard returns the per-render counting function.
func macroGuard() jinja.Value {
	calls := 0
	return jinja.NewCallable(macroGuardName, func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
		if calls++; calls > macroCallBudget {
			return jinja.Value{}, fmt.Errorf("more than %d macro calls in one render (a macro calling itself without end?)", macroCallBudget)
		}
		return jinja.None(), nil
	})
}

// globals are variables every render gets, for what the engine lacks
// against transformers' environment.
var globals = map[string]jinja.Value{
	tojsonName: jinja.NewCallable("tojson", filterToJSON),
}

// filterToJSON is transformers' tojson filter: json.dumps(x,
// ensure_ascii=False, indent=indent, separators=separators,
// sort_keys=sort_keys). The engine's own tojson escapes U+2028 and U+2029
// (Go's encoding/json does), and with indent sorts keys and escapes HTML,
// where Python prints the text as it is.
func filterToJSON(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Value{}, fmt.Errorf("tojson: no value")
	}
	e := jsonEncoder{item: ", ", key: ": "}
	for i, a := range args[1:] { // positional: indent
		if i > 0 {
			return jinja.Value{}, fmt.Errorf("tojson: too many arguments")
		}
		kwargs = withKw(kwargs, "indent", a)
	}
	for k, v := range kwargs {
		switch k {
		case "indent":
			switch {
			case v.IsNone() || v.IsUndefined():
			case v.IsInt():
				e.indent = strings.Repeat(" ", int(max(0, min(v.AsInt(), 64))))
				e.indented = true
			case v.IsString():
				e.indent, e.indented = v.AsString(), true
			default:
				return jinja.Value{}, fmt.Errorf("tojson: indent must be an integer or a string")
			}
		case "separators":
			if v.IsNone() {
				continue
			}
			if !v.IsList() || v.AsList().Len() != 2 || !v.AsList().Items[0].IsString() || !v.AsList().Items[1].IsString() {
				return jinja.Value{}, fmt.Errorf("tojson: separators must be two strings")
			}
			e.item, e.key = v.AsList().Items[0].AsString(), v.AsList().Items[1].AsString()
			e.customSep = true
		case "sort_keys":
			e.sortKeys = v.IsTruthy()
		case "ensure_ascii":
			e.ascii = v.IsTruthy()
		default:
			return jinja.Value{}, fmt.Errorf("tojson: unknown argument %q", k)
		}
	}
	if e.indented && !e.customSep {
		e.item = "," // json.dumps' default item separator when indenting
	}
	var sb strings.Builder
	if err := e.encode(&sb, args[0], 0); err != nil {
		return jinja.Value{}, err
	}
	return jinja.NewString(sb.String()), nil
}

func withKw(kw map[string]jinja.Value, k string, v jinja.Value) map[string]jinja.Value {
	out := make(map[string]jinja.Value, len(kw)+1)
	for kk, vv := range kw {
		out[kk] = vv
	}
	out[k] = v
	return out
}

type jsonEncoder struct {
	item, key string
	indent    string
	indented  bool
	customSep bool
	sortKeys  bool
	ascii     bool
}

func (e *jsonEncoder) newline(sb *strings.Builder, depth int) {
	if e.indented {
		sb.WriteByte('\n')
		for range depth {
			sb.WriteString(e.indent)
		}
	}
}

func (e *jsonEncoder) encode(sb *strings.Builder, v jinja.Value, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("tojson: nested deeper than %d", maxDepth)
	}
	switch {
	case v.IsNone():
		sb.WriteString("null")
	case v.IsBool():
		sb.WriteString(strconv.FormatBool(v.AsBool()))
	case v.IsInt():
		sb.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		sb.WriteString(pyFloat(v.AsFloat()))
	case v.IsString():
		e.str(sb, v.AsString())
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			sb.WriteString("[]")
			return nil
		}
		sb.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				sb.WriteString(e.item)
			}
			e.newline(sb, depth+1)
			if err := e.encode(sb, it, depth+1); err != nil {
				return err
			}
		}
		e.newline(sb, depth)
		sb.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		keys := d.OrderedKeys()
		if len(keys) == 0 {
			sb.WriteString("{}")
			return nil
		}
		if e.sortKeys {
			keys = slices.Clone(keys)
			slices.Sort(keys)
		}
		sb.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				sb.WriteString(e.item)
			}
			e.newline(sb, depth+1)
			e.str(sb, k)
			sb.WriteString(e.key)
			val, _ := d.Get(k)
			if err := e.encode(sb, val, depth+1); err != nil {
				return err
			}
		}
		e.newline(sb, depth)
		sb.WriteByte('}')
	case v.IsUndefined():
		return fmt.Errorf("tojson: value is undefined")
	default:
		return fmt.Errorf("tojson: value is not JSON serializable")
	}
	return nil
}

// str writes s as json.dumps does: only '"', '\\' and control characters
// are escaped (and, with ensure_ascii, everything past ASCII, as UTF-16).
func (e *jsonEncoder) str(sb *strings.Builder, s string) {
	const hex = "0123456789abcdef"
	u4 := func(r rune) {
		sb.WriteString(`\u`)
		for shift := 12; shift >= 0; shift -= 4 {
			sb.WriteByte(hex[(r>>shift)&0xf])
		}
	}
	sb.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			sb.WriteString(`\"`)
		case r == '\\':
			sb.WriteString(`\\`)
		case r == '\n':
			sb.WriteString(`\n`)
		case r == '\r':
			sb.WriteString(`\r`)
		case r == '\t':
			sb.WriteString(`\t`)
		case r == '\b':
			sb.WriteString(`\b`)
		case r == '\f':
			sb.WriteString(`\f`)
		case r < 0x20:
			u4(r)
		case e.ascii && r > 0x7e:
			if r > 0xffff {
				r -= 0x10000
				u4(0xd800 + (r >> 10))
				u4(0xdc00 + (r & 0x3ff))
			} else {
				u4(r)
			}
		default:
			var buf [utf8.UTFMax]byte
			sb.Write(buf[:utf8.EncodeRune(buf[:], r)])
		}
	}
	sb.WriteByte('"')
}

// pyFloat formats f as Python's repr (and so json.dumps) does: the
// shortest round-tripping digits, in positional form for exponents in
// [-4, 16) with at least one decimal ("1.0"), else as "1e+16".
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	sci := strconv.FormatFloat(f, 'e', -1, 64)
	mant, expStr, _ := strings.Cut(sci, "e")
	exp, _ := strconv.Atoi(expStr)
	if exp >= -4 && exp < 16 {
		s := strconv.FormatFloat(f, 'f', -1, 64)
		if !strings.ContainsAny(s, ".") {
			s += ".0"
		}
		return s
	}
	sign := "+"
	if exp < 0 {
		sign, exp = "-", -exp
	}
	return fmt.Sprintf("%se%s%02d", mant, sign, exp)
}
