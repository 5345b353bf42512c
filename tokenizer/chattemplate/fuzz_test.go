package chattemplate

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzRender renders arbitrary messages, tools and kwargs through every
// golden template: Render must return a prompt or an error wrapping one of
// the package's errors, and never panic.
func FuzzRender(f *testing.F) {
	names, err := filepath.Glob("testdata/templates/*.*")
	if err != nil {
		f.Fatal(err)
	}
	var templates []*Template
	for _, n := range names {
		if filepath.Base(n) == "NOTICE" {
			continue
		}
		templates = append(templates, loadTestTemplate(f, filepath.Base(n)))
	}
	for _, c := range readGolden(f) {
		f.Add([]byte(c.Messages), []byte(c.Tools), []byte(nil), c.AddGenerationPrompt)
	}
	f.Add([]byte(`[{"role": 1, "content": [null, {"type": "text"}]}, {"tool_calls": [{}]}]`), []byte(`[1, "x", {"function": null}]`), []byte(`{"enable_thinking": true}`), true)
	f.Add([]byte(`[{"role": "assistant", "content": {"content": 3}}, {"role": "tool"}]`), []byte(`[]`), []byte(`{}`), false)
	f.Fuzz(func(t *testing.T, messages, tools, kwargs []byte, agp bool) {
		for _, tmpl := range templates {
			_, err := tmpl.Render(Request{Messages: messages, Tools: tools, Kwargs: kwargs, AddGenerationPrompt: agp})
			if err != nil && !errors.Is(err, ErrInput) && !errors.Is(err, ErrRender) {
				t.Fatalf("error wraps none of the package's errors: %v", err)
			}
		}
	})
}

// FuzzParse compiles arbitrary template sources: Parse must compile or
// return ErrTemplate, and a compiled template must render or fail with
// ErrRender, never panic.
func FuzzParse(f *testing.F) {
	names, _ := filepath.Glob("testdata/templates/*.jinja")
	for _, n := range names {
		src, err := os.ReadFile(n)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(src))
	}
	for _, s := range []string{`{{`, `{% for %}`, `{% if x %}`, `{{ x|tojson( }}`, `{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}`, `{{ 1/0 }}`, `{{ messages[0].content.split()[5] }}`, `{% raw %}{{`} {
		f.Add(s)
	}
	msgs, _ := json.Marshal([]map[string]any{{"role": "user", "content": "hi"}})
	f.Fuzz(func(t *testing.T, src string) {
		tmpl, err := Parse(src, map[string]string{"bos_token": "<s>"})
		if err != nil {
			if !errors.Is(err, ErrTemplate) {
				t.Fatalf("Parse error is not ErrTemplate: %v", err)
			}
			return
		}
		if _, err := tmpl.Render(Request{Messages: msgs}); err != nil && !errors.Is(err, ErrRender) {
			t.Fatalf("Render error is not ErrRender: %v", err)
		}
	})
}

// FuzzMessageList renders a plain message (arbitrary role and content
// bytes) and a raw one (arbitrary JSON) through every golden template from
// a MessageList and from the same messages written as one JSON array: the
// two agree, prompt or failure.
//
//	go test -run '^$' -fuzz '^FuzzMessageList$' -fuzztime 60s ./tokenizer/chattemplate
func FuzzMessageList(f *testing.F) {
	names, err := filepath.Glob("testdata/templates/*.*")
	if err != nil {
		f.Fatal(err)
	}
	var templates []*Template
	for _, n := range names {
		if filepath.Base(n) != "NOTICE" {
			templates = append(templates, loadTestTemplate(f, filepath.Base(n)))
		}
	}
	f.Add("user", "hi", []byte(`{"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": 2.0}"}}]}`), true)
	f.Add("assistant", "a\xffb <&> \u2028", []byte(`{"role": "tool", "content": "r", "tool_call_id": "1"}`), false)
	f.Add("system", "", []byte(`null`), true)
	f.Add("user", "x", []byte(`{"role": "user", "content": "y"} x`), false)
	f.Fuzz(func(t *testing.T, role, content string, raw []byte, plainFirst bool) {
		plain := Message{Role: role, Content: content}
		plainJSON, _ := json.Marshal(struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		}{role, content})
		list := []Message{plain, {Raw: raw}}
		arr := "[" + string(plainJSON) + "," + string(raw) + "]"
		if !plainFirst {
			list = []Message{{Raw: raw}, plain}
			arr = "[" + string(raw) + "," + string(plainJSON) + "]"
		}
		var probe any
		if json.Unmarshal(raw, &probe) != nil {
			// Not one JSON value: spliced into an array it could read as
			// several messages; the list form must refuse it.
			for _, tmpl := range templates {
				if _, err := tmpl.Render(Request{MessageList: list}); !errors.Is(err, ErrInput) {
					t.Fatalf("raw %q: err %v, want ErrInput", raw, err)
				}
			}
			return
		}
		for _, tmpl := range templates {
			for _, decode := range []bool{false, true} {
				want, wantErr := tmpl.Render(Request{Messages: []byte(arr), DecodeToolArguments: decode})
				got, err := tmpl.Render(Request{MessageList: list, DecodeToolArguments: decode})
				if got != want || (err == nil) != (wantErr == nil) {
					t.Fatalf("from the list %q, %v; from JSON %s: %q, %v", got, err, arr, want, wantErr)
				}
				if err != nil && !errors.Is(err, ErrInput) && !errors.Is(err, ErrRender) {
					t.Fatalf("error wraps none of the package's errors: %v", err)
				}
			}
		}
	})
}
