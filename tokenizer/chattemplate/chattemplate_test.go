package chattemplate

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func render(t *testing.T, src string, r Request) (string, error) {
	t.Helper()
	tmpl, err := Parse(src, map[string]string{"bos_token": "<s>"})
	if err != nil {
		t.Fatal(err)
	}
	return tmpl.Render(r)
}

// TestToJSON checks transformers' tojson: json.dumps(ensure_ascii=False)
// and its indent, separators, sort_keys and ensure_ascii arguments.
func TestToJSON(t *testing.T) {
	const v = `{"b": [1, 2.5, 1.0, 1e20, 0.00001, -0.0], "a": "x\u2028<&>\"\\\n\u0007é😀", "e": {}, "l": [], "n": null, "t": true}`
	cases := []struct {
		name, expr, want string
	}{
		{"default", `x|tojson`, `{"b": [1, 2.5, 1.0, 1e+20, 1e-05, -0.0], "a": "x` + "\u2028" + `<&>\"\\\n\u0007é😀", "e": {}, "l": [], "n": null, "t": true}`},
		{"compact", `x|tojson(separators=(",", ":"))`, `{"b":[1,2.5,1.0,1e+20,1e-05,-0.0],"a":"x` + "\u2028" + `<&>\"\\\n\u0007é😀","e":{},"l":[],"n":null,"t":true}`},
		{"sorted", `x.e|tojson(sort_keys=true) ~ {"z": 1, "a": 2}|tojson(sort_keys=true)`, `{}{"a": 2, "z": 1}`},
		{"ascii", `x.a|tojson(ensure_ascii=true)`, `"x\u2028<&>\"\\\n\u0007\u00e9\ud83d\ude00"`},
		{"indent", `x.b[:2]|tojson(indent=2) ~ x.e|tojson(indent=2)`, "[\n  1,\n  2.5\n]{}"},
		{"indent_positional", `{"k": [1]}|tojson(1)`, "{\n \"k\": [\n  1\n ]\n}"},
		{"spaced_filter", `x.t | tojson`, `true`},
		{"in_string_literal_untouched", `'|tojson' ~ "x|tojson"`, `|tojsonx|tojson`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := render(t, `{%- set x = messages[0] -%}{{ `+c.expr+` }}`, Request{Messages: []byte(`[` + v + `]`)})
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Fatalf("got  %q\nwant %q", got, c.want)
			}
		})
	}
}

func TestRewriteToJSON(t *testing.T) {
	cases := []struct{ in, want string }{
		{`{{ x|tojson }}`, `{{ x|` + tojsonName + ` }}`},
		{`{{ x | tojson(indent=2) }}`, `{{ x | ` + tojsonName + `(indent=2) }}`},
		{`tojson {{ tojson }} {# x|tojson #}`, `tojson {{ tojson }} {# x|tojson #}`},
		{`{% set y = x|tojsonx %}`, `{% set y = x|tojsonx %}`},
		{`{% raw %}{{ x|tojson }}{% endraw %}{{ x|tojson }}`, `{% raw %}{{ x|tojson }}{% endraw %}{{ x|` + tojsonName + ` }}`},
		{`{{ "}}|tojson" }}|tojson {`, `{{ "}}|tojson" }}|tojson {`},
		{`{%- macro f(a, b=")") -%}{%- endmacro %}`, `{%- macro f(a, b=")", ` + macroGuardParam + `=` + macroGuardName + `()) -%}{%- endmacro %}`},
		{`{% macro g() %}{% endmacro %}{% macros %}`, `{% macro g(` + macroGuardParam + `=` + macroGuardName + `()) %}{% endmacro %}{% macros %}`},
	}
	for _, c := range cases {
		if got := rewrite(c.in); got != c.want {
			t.Errorf("rewrite(%q)\n got %q\nwant %q", c.in, got, c.want)
		}
	}
}

// An output's chain of + with a string literal among its operands is
// written operand by operand, whitespace control kept at the ends; other
// expressions are left alone.
func TestSplitConcat(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}`,
			`{{- '<|im_start|>' }}{{ message.role }}{{ '\n' }}{{ message.content }}{{ '<|im_end|>' }}{{ '\n' }}`},
		{`{{ "a+b" + x -}}`, `{{ "a+b" }}{{ x -}}`},
		{`{{+ 'x' + m['content'] | trim + "y" +}}`, `{{+ 'x' }}{{ m['content'] | trim }}{{ "y" +}}`},
		{`{{ 'it\'s' + f(a + b, 'c') + [1, 2] | join(',') }}`, `{{ 'it\'s' }}{{ f(a + b, 'c') }}{{ [1, 2] | join(',') }}`},
		// Left alone: no string literal, another operator, a test, a
		// conditional, a unary plus, an unterminated literal, a statement.
		{`{{ a + b }}`, `{{ a + b }}`},
		{`{{ loop.index + 1 }}`, `{{ loop.index + 1 }}`},
		{`{{ 'n' + (i - 1) | string }}`, `{{ 'n' }}{{ (i - 1) | string }}`},
		{`{{ 'n' + i - 1 }}`, `{{ 'n' + i - 1 }}`},
		{`{{ 'a' ~ b + 'c' }}`, `{{ 'a' ~ b + 'c' }}`},
		{`{{ 'a' + b if c else 'd' }}`, `{{ 'a' + b if c else 'd' }}`},
		{`{{ 'a' + b is defined }}`, `{{ 'a' + b is defined }}`},
		{`{{ 'a' + b == 'c' }}`, `{{ 'a' + b == 'c' }}`},
		{`{{ + 'a' }}`, `{{ + 'a' }}`},
		{`{{ 'a + b }}`, `{{ 'a + b }}`},
		{`{% set x = 'a' + b %}`, `{% set x = 'a' + b %}`},
		{`{{ 'a' }}`, `{{ 'a' }}`},
	} {
		if got := rewrite(c.in); got != c.want {
			t.Errorf("rewrite(%q)\n got %q\nwant %q", c.in, got, c.want)
		}
	}
}

// A template whose chains are split renders what it rendered before, for
// strings; the chain that adds numbers is kept whole.
func TestSplitConcatRenders(t *testing.T) {
	const src = `{%- for m in messages %}{{- '<' + m.role + '>' + m.content | trim + '</' + m.role + '>' }}{{ loop.index + 1 }}{%- endfor %}`
	got, err := render(t, src, Request{Messages: []byte(`[{"role":"user","content":" hi "},{"role":"assistant","content":"yo"}]`)})
	if err != nil {
		t.Fatal(err)
	}
	if want := "<user>hi</user>2<assistant>yo</assistant>3"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const tmpl = `{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}`
	cases := []struct {
		name, file, content string
		tokens              map[string]string
		want                string
		err                 error
	}{
		{"config_string", "tokenizer_config.json", `{"chat_template": "` + tmpl + `", "bos_token": "<s>", "eos_token": {"content": "</s>", "lstrip": false}}`, nil, "<s>hi</s>", nil},
		{"config_list_default", "a.json", `{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "` + tmpl + `"}], "bos_token": "[", "eos_token": "]"}`, nil, "[hi]", nil},
		{"config_list_no_default", "b.json", `{"chat_template": [{"name": "tool_use", "template": "T"}]}`, nil, "", ErrTemplate},
		{"config_no_template", "c.json", `{"bos_token": "<s>"}`, nil, "", ErrTemplate},
		{"config_null_token_falls_back", "d.json", `{"chat_template": "` + tmpl + `", "bos_token": null}`, map[string]string{"bos_token": "B", "eos_token": "E"}, "BhiE", nil},
		{"config_bad_json", "e.json", `{"chat_template": `, nil, "", ErrTemplate},
		{"jinja_file", "j/t.jinja", tmpl, map[string]string{"bos_token": "<", "eos_token": ">"}, "<hi>", nil},
		{"jinja_bad", "j/u.jinja", `{% for m in messages %}`, nil, "", ErrTemplate},
		{"missing_file", "", "", nil, "", ErrTemplate},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, "missing.jinja")
			if c.file != "" {
				path = write(c.file, c.content)
			}
			tp, err := Load(path, c.tokens)
			if c.err != nil {
				if !errors.Is(err, c.err) {
					t.Fatalf("err %v, want %v", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := tp.Render(Request{Messages: []byte(`[{"role": "user", "content": "hi"}]`)})
			if err != nil || got != c.want {
				t.Fatalf("got %q, %v; want %q", got, err, c.want)
			}
		})
	}
}

func TestRenderInput(t *testing.T) {
	const src = `{{ messages|length }} {{ tools is none }} {{ add_generation_prompt }} {{ enable_thinking | default("unset") }} {{ bos_token }}`
	cases := []struct {
		name string
		r    Request
		want string
		err  error
	}{
		{"minimal", Request{Messages: []byte(`[]`)}, "0 True False unset <s>", nil},
		{"tools_and_kwargs", Request{Messages: []byte(`[{}]`), Tools: []byte(`[{"type": "function"}]`), AddGenerationPrompt: true, Kwargs: []byte(`{"enable_thinking": false, "bos_token": "B"}`)}, "1 False True False B", nil},
		{"null_tools", Request{Messages: []byte(`[]`), Tools: []byte(`null`), Kwargs: []byte(`null`)}, "0 True False unset <s>", nil},
		{"messages_not_array", Request{Messages: []byte(`{}`)}, "", ErrInput},
		{"messages_missing", Request{}, "", ErrInput},
		{"messages_bad_json", Request{Messages: []byte(`[`)}, "", ErrInput},
		{"messages_trailing", Request{Messages: []byte(`[] []`)}, "", ErrInput},
		{"messages_too_deep", Request{Messages: []byte(strings.Repeat("[", 200) + strings.Repeat("]", 200))}, "", ErrInput},
		{"tools_not_array", Request{Messages: []byte(`[]`), Tools: []byte(`{}`)}, "", ErrInput},
		{"kwargs_not_object", Request{Messages: []byte(`[]`), Kwargs: []byte(`[]`)}, "", ErrInput},
		{"kwargs_reserved", Request{Messages: []byte(`[]`), Kwargs: []byte(`{"messages": []}`)}, "", ErrInput},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := render(t, src, c.r)
			if c.err != nil {
				if !errors.Is(err, c.err) {
					t.Fatalf("err %v, want %v", err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %q, %v; want %q", got, err, c.want)
			}
		})
	}
}

func TestRaiseException(t *testing.T) {
	_, err := render(t, `{{ raise_exception("roles must alternate") }}`, Request{Messages: []byte(`[]`)})
	if !errors.Is(err, ErrRender) || !strings.Contains(err.Error(), "roles must alternate") {
		t.Fatalf("err %v, want ErrRender naming the template's message", err)
	}
}

// TestMacroRecursion: a macro that calls itself without end fails the
// render with ErrRender (the engine has no recursion limit of its own and
// would overflow the stack), while a bounded recursion renders.
func TestMacroRecursion(t *testing.T) {
	_, err := render(t, `{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}`, Request{Messages: []byte(`[]`)})
	if !errors.Is(err, ErrRender) {
		t.Fatalf("err %v, want ErrRender", err)
	}
	got, err := render(t, `{% macro m(n) %}{% if n < 50 %}{{ m(n + 1) }}{% else %}{{ n }}{% endif %}{% endmacro %}{{ m(0) }}`, Request{Messages: []byte(`[]`)})
	if err != nil || got != "50" {
		t.Fatalf("got %q, %v; want 50", got, err)
	}
}

func TestDecodeToolArguments(t *testing.T) {
	const src = `{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.arguments is string }} {{ c.function.arguments|tojson }};{% endfor %}{% endfor %}`
	msgs := []byte(`[{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{\"b\":1,\"a\":[true]}"}}, {"function": {"name": "g", "arguments": {"x": 2}}}]}, {"role": "user", "content": "x"}]`)
	cases := []struct {
		decode bool
		want   string
	}{
		{false, `True "{\"b\":1,\"a\":[true]}";False {"x": 2};`},
		{true, `False {"b": 1, "a": [true]};False {"x": 2};`},
	}
	for _, c := range cases {
		got, err := render(t, src, Request{Messages: msgs, DecodeToolArguments: c.decode})
		if err != nil || got != c.want {
			t.Errorf("decode=%v: got %q, %v; want %q", c.decode, got, err, c.want)
		}
	}
	_, err := render(t, src, Request{Messages: []byte(`[{"tool_calls": [{"function": {"arguments": "{oops"}}]}]`), DecodeToolArguments: true})
	if !errors.Is(err, ErrInput) {
		t.Fatalf("bad arguments: err %v, want ErrInput", err)
	}
}

// TestLoadJinjaBesideConfig: a chat_template.jinja takes its special tokens
// from the tokenizer_config.json beside it.
func TestLoadJinjaBesideConfig(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"bos_token": {"content": "<B>"}, "eos_token": "<E>"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "chat_template.jinja")
	if err := os.WriteFile(p, []byte(`{{ bos_token }}{{ messages[0].content }}{{ eos_token }}`), 0o600); err != nil {
		t.Fatal(err)
	}
	tp, err := Load(p, map[string]string{"eos_token": "ignored"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := tp.Render(Request{Messages: []byte(`[{"content": "x"}]`)})
	if err != nil || got != "<B>x<E>" {
		t.Fatalf("got %q, %v", got, err)
	}
}
