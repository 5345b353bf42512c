package tokenizer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"
)

// engine is a real HTTP server speaking vLLM's /tokenize protocol, backed by
// the Qwen2.5 tokenizer and a ChatML template, recording what it was sent.
type engine struct {
	tok   *Local
	model string
	calls atomic.Int64
	srv   *httptest.Server

	mu   sync.Mutex
	last map[string]json.RawMessage

	// handle, when set, replaces the protocol for error-path tests.
	handle func(w http.ResponseWriter, r *http.Request)
}

const engineModel = "Qwen/Qwen2.5-7B-Instruct"

func newEngine(t *testing.T, handle func(w http.ResponseWriter, r *http.Request)) *engine {
	t.Helper()
	tok, _ := qwen(t)
	e := &engine{tok: tok, model: engineModel, handle: handle}
	e.srv = httptest.NewServer(e)
	t.Cleanup(e.srv.Close)
	return e
}

func (e *engine) lastRequest() map[string]json.RawMessage {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.last
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func vllmError(w http.ResponseWriter, status int, typ, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": status}})
}

func (e *engine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.calls.Add(1)
	if e.handle != nil {
		e.handle(w, r)
		return
	}
	if r.Method != http.MethodPost || r.URL.Path != "/tokenize" {
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
		return
	}
	var req map[string]json.RawMessage
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		vllmError(w, http.StatusBadRequest, "BadRequestError", err.Error())
		return
	}
	e.mu.Lock()
	e.last = req
	e.mu.Unlock()
	flag := func(name string, def bool) bool {
		v := def
		if raw, ok := req[name]; ok {
			json.Unmarshal(raw, &v)
		}
		return v
	}
	if raw, ok := req["model"]; ok {
		var m string
		json.Unmarshal(raw, &m)
		if m != e.model {
			vllmError(w, http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", m))
			return
		}
	}
	var text string
	var special bool
	if raw, ok := req["messages"]; ok {
		var msgs []struct {
			Role    string
			Content json.RawMessage
		}
		if err := json.Unmarshal(raw, &msgs); err != nil {
			vllmError(w, http.StatusBadRequest, "BadRequestError", err.Error())
			return
		}
		gen, cont := flag("add_generation_prompt", true), flag("continue_final_message", false)
		if gen && cont {
			vllmError(w, http.StatusBadRequest, "BadRequestError",
				"Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
			return
		}
		var b strings.Builder
		if tools, ok := req["tools"]; ok {
			// Qwen2.5's template lists the tools, as JSON, in the system turn.
			var list []json.RawMessage
			if err := json.Unmarshal(tools, &list); err != nil {
				vllmError(w, http.StatusBadRequest, "BadRequestError", "tools: "+err.Error())
				return
			}
			b.WriteString("<|im_start|>system\n# Tools\n<tools>")
			for _, t := range list {
				fmt.Fprintf(&b, "\n%s", t)
			}
			b.WriteString("\n</tools><|im_end|>\n")
		}
		for _, m := range msgs {
			text, err := contentText(m.Content)
			if err != nil {
				vllmError(w, http.StatusBadRequest, "BadRequestError", err.Error())
				return
			}
			fmt.Fprintf(&b, "<|im_start|>%s\n%s<|im_end|>\n", m.Role, text)
		}
		if gen {
			b.WriteString("<|im_start|>assistant\n")
		}
		text, special = b.String(), flag("add_special_tokens", false)
	} else if raw, ok := req["prompt"]; ok {
		json.Unmarshal(raw, &text)
		special = flag("add_special_tokens", true)
	} else {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]any{
			"detail": []map[string]any{{"type": "missing", "loc": []string{"body", "prompt"}, "msg": "Field required"}},
		})
		return
	}
	ids := e.tok.Encode(text, special)
	writeJSON(w, http.StatusOK, map[string]any{"count": len(ids), "max_model_len": 32768, "tokens": ids})
}

// contentText renders a message's content as vLLM's "string" content
// format does: a string as it is, content parts as their text parts
// joined by newlines.
func contentText(raw json.RawMessage) (string, error) {
	var s string
	if len(raw) == 0 || string(raw) == "null" || json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct{ Type, Text string }
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("content: %v", err)
	}
	var texts []string
	for _, p := range parts {
		if p.Type == "text" {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n"), nil
}

func newHTTPFor(t *testing.T, e *engine, cfg HTTPConfig) *HTTP {
	t.Helper()
	cfg.BaseURL = e.srv.URL
	h, err := NewHTTP(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func field[T any](t *testing.T, req map[string]json.RawMessage, name string) T {
	t.Helper()
	var v T
	raw, ok := req[name]
	if !ok {
		t.Fatalf("request has no %q: %v", name, req)
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("request field %q: %v", name, err)
	}
	return v
}

func TestHTTPCompletionForm(t *testing.T) {
	e := newEngine(t, nil)
	h := newHTTPFor(t, e, HTTPConfig{CacheEntries: -1})
	local, _ := qwen(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		in      Input
		special bool
	}{
		{"default adds special tokens", Input{Prompt: "Hello world"}, true},
		{"explicit false", Input{Prompt: "Hello world", AddSpecialTokens: Bool(false)}, false},
		{"empty prompt", Input{Prompt: ""}, true},
		{"special tokens in text", Input{Prompt: "<|im_start|>user\nhi<|im_end|>"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ids, err := h.Tokenize(ctx, engineModel, tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if want := local.Encode(tc.in.Prompt, tc.special); !slices.Equal(ids, want) {
				t.Fatalf("ids %v, want %v", ids, want)
			}
			req := e.lastRequest()
			if got := field[string](t, req, "prompt"); got != tc.in.Prompt {
				t.Errorf("prompt %q, want %q", got, tc.in.Prompt)
			}
			if got := field[bool](t, req, "add_special_tokens"); got != tc.special {
				t.Errorf("add_special_tokens %v, want %v", got, tc.special)
			}
			if got := field[string](t, req, "model"); got != engineModel {
				t.Errorf("model %q", got)
			}
			if _, ok := req["messages"]; ok {
				t.Error("completion form sent messages")
			}
		})
	}
	// Without a model name the field is omitted (vLLM then uses its model).
	if _, err := h.Tokenize(ctx, "", Input{Prompt: "x"}); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.lastRequest()["model"]; ok {
		t.Error("empty model was sent")
	}
}

func TestHTTPChatForm(t *testing.T) {
	e := newEngine(t, nil)
	h := newHTTPFor(t, e, HTTPConfig{CacheEntries: -1})
	local, _ := qwen(t)
	ctx := context.Background()
	msgs := []Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi 你好"}}
	chatml := "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi 你好<|im_end|>\n"

	ids, err := h.Tokenize(ctx, engineModel, Input{Messages: msgs})
	if err != nil {
		t.Fatal(err)
	}
	if want := local.Encode(chatml+"<|im_start|>assistant\n", false); !slices.Equal(ids, want) {
		t.Fatalf("ids %v, want %v", ids, want)
	}
	req := e.lastRequest()
	if !field[bool](t, req, "add_generation_prompt") || field[bool](t, req, "add_special_tokens") {
		t.Errorf("chat defaults: %s", mustJSON(req))
	}
	if got := field[[]map[string]string](t, req, "messages"); len(got) != 2 || got[1]["content"] != "Hi 你好" || got[0]["role"] != "system" {
		t.Errorf("messages %v", got)
	}
	if _, ok := req["prompt"]; ok {
		t.Error("chat form sent prompt")
	}

	// ChatParams pass through and override the defaults.
	ids, err = h.Tokenize(ctx, engineModel, Input{Messages: msgs,
		ChatParams: json.RawMessage(`{"add_generation_prompt":false,"continue_final_message":true,"chat_template_kwargs":{"enable_thinking":false}}`)})
	if err != nil {
		t.Fatal(err)
	}
	if want := local.Encode(chatml, false); !slices.Equal(ids, want) {
		t.Fatalf("with params: ids %v, want %v", ids, want)
	}
	req = e.lastRequest()
	if field[bool](t, req, "add_generation_prompt") || !field[bool](t, req, "continue_final_message") {
		t.Errorf("params not forwarded: %s", mustJSON(req))
	}
	if got := field[map[string]bool](t, req, "chat_template_kwargs"); got["enable_thinking"] {
		t.Errorf("chat_template_kwargs %v", got)
	}

	// An explicit AddSpecialTokens wins over the form default.
	if _, err := h.Tokenize(ctx, engineModel, Input{Messages: msgs, AddSpecialTokens: Bool(true)}); err != nil {
		t.Fatal(err)
	}
	if !field[bool](t, e.lastRequest(), "add_special_tokens") {
		t.Error("AddSpecialTokens=true not sent")
	}

	// Raw messages are sent verbatim.
	raw := json.RawMessage(`{"role":"user","content":"x","name":"bob"}`)
	if _, err := h.Tokenize(ctx, engineModel, Input{Messages: []Message{{Raw: raw}}}); err != nil {
		t.Fatal(err)
	}
	if got := field[[]map[string]string](t, e.lastRequest(), "messages"); len(got) != 1 || got[0]["name"] != "bob" {
		t.Errorf("raw message not forwarded: %v", got)
	}
}

// Every chat field, content parts and tool calls reach the engine
// verbatim: same values, same key order, no escaping of < and >. The
// template renders them into the prompt, so anything else changes the ids.
func TestHTTPChatVerbatim(t *testing.T) {
	e := newEngine(t, nil)
	h := newHTTPFor(t, e, HTTPConfig{CacheEntries: -1})
	local, _ := qwen(t)
	ctx := context.Background()

	tool := `{"type":"function","function":{"name":"get_weather","description":"Weather in <city> & around",` +
		`"parameters":{"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"integer","maximum":12345678901234567890}},"required":["zeta"]}}}`
	params := map[string]string{
		"tools":                  "[" + tool + "]",
		"chat_template":          `"{% for m in messages %}{{ m.content }}{% endfor %}"`,
		"chat_template_kwargs":   `{"enable_thinking":false,"z":1,"a":2}`,
		"add_generation_prompt":  `true`,
		"continue_final_message": `false`,
		"mm_processor_kwargs":    `{"fps":2}`,
		"media_io_kwargs":        `{"video":{"num_frames":8}}`,
	}
	var obj strings.Builder
	obj.WriteString("{")
	for _, name := range ChatFieldNames() {
		if v, ok := params[name]; ok {
			if obj.Len() > 1 {
				obj.WriteString(", ")
			}
			fmt.Fprintf(&obj, "%q: %s", name, v)
		}
	}
	obj.WriteString("}")
	messages := `[{"role":"system","content":"Be brief."},` +
		`{"role":"user","content":[{"type":"text","text":"Weather in"},{"type":"image_url","image_url":{"url":"http://img/1.png"}},{"type":"text","text":"<Paris>?"}]},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"zeta\":\"Paris\"}"}}]},` +
		`{"role":"tool","tool_call_id":"c1","content":"sunny"}]`
	var msgs []Message
	if err := json.Unmarshal([]byte(messages), &msgs); err != nil {
		t.Fatal(err)
	}

	ids, err := h.Tokenize(ctx, engineModel, Input{Messages: msgs, ChatParams: json.RawMessage(obj.String())})
	if err != nil {
		t.Fatal(err)
	}
	req := e.lastRequest()
	for name, v := range params {
		if got := string(req[name]); got != v {
			t.Errorf("%s: engine got %s, want %s", name, got, v)
		}
	}
	if got := string(req["messages"]); got != messages {
		t.Errorf("messages: engine got\n%s\nwant\n%s", got, messages)
	}
	want := local.Encode("<|im_start|>system\n# Tools\n<tools>\n"+tool+"\n</tools><|im_end|>\n"+
		"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWeather in\n<Paris>?<|im_end|>\n"+
		"<|im_start|>assistant\n<|im_end|>\n<|im_start|>tool\nsunny<|im_end|>\n<|im_start|>assistant\n", false)
	if !slices.Equal(ids, want) {
		t.Errorf("ids %v, want %v", ids, want)
	}
}

// documents and reasoning_effort reach the template through
// chat_template_kwargs, overriding the keys there, as in vLLM's chat
// completions; null and "auto" leave them unset.
func TestHTTPTemplateArgs(t *testing.T) {
	e := newEngine(t, nil)
	h := newHTTPFor(t, e, HTTPConfig{CacheEntries: -1})
	msgs := []Message{{Role: "user", Content: "hi"}}
	for _, tc := range []struct {
		name, params string
		kwargs       string // chat_template_kwargs the engine gets; "" for none
	}{
		{"both", `{"chat_template_kwargs":{"reasoning_effort":"low","x":1},"documents":[{"title":"t","text":"<b>"}],"reasoning_effort":"high"}`,
			`{"documents":[{"title":"t","text":"<b>"}],"reasoning_effort":"high","x":1}`},
		{"no kwargs before", `{"reasoning_effort":"medium"}`, `{"reasoning_effort":"medium"}`},
		{"null kwargs before", `{"chat_template_kwargs":null,"documents":[]}`, `{"documents":[]}`},
		{"unset values", `{"chat_template_kwargs":{"b":1, "a":2},"documents":null,"reasoning_effort":"auto"}`, `{"b":1,"a":2}`},
		{"none", `{"tools":[]}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := h.Tokenize(context.Background(), engineModel, Input{Messages: msgs, ChatParams: json.RawMessage(tc.params)}); err != nil {
				t.Fatal(err)
			}
			req := e.lastRequest()
			if got := string(req["chat_template_kwargs"]); got != tc.kwargs {
				t.Errorf("chat_template_kwargs %s, want %s", got, tc.kwargs)
			}
			for _, name := range []string{"documents", "reasoning_effort"} {
				if v, ok := req[name]; ok {
					t.Errorf("%s sent at the top level: %s", name, v)
				}
			}
		})
	}
}

func TestChatFields(t *testing.T) {
	var f ChatFields
	if b, err := f.JSON(); b != nil || err != nil || f.Set() != nil {
		t.Errorf("empty: JSON %s %v, set %v", b, err, f.Set())
	}
	f.Tools, f.ReasoningEffort = json.RawMessage(`[ {"b":1, "a":"<x>"} ]`), json.RawMessage(`"low"`)
	b, err := f.JSON()
	if err != nil || string(b) != `{"tools":[{"b":1,"a":"<x>"}],"reasoning_effort":"low"}` {
		t.Errorf("JSON = %s, %v", b, err)
	}
	if got := f.Set(); !slices.Equal(got, []string{"tools", "reasoning_effort"}) {
		t.Errorf("Set = %v", got)
	}
	f.Tools = json.RawMessage(`[`)
	if _, err := f.JSON(); !errors.Is(err, ErrInvalidInput) {
		t.Errorf("invalid field: %v", err)
	}
	names := ChatFieldNames()
	if len(names) != 10 || names[0] != "tools" || names[9] != "reasoning_effort" {
		t.Errorf("names %v", names)
	}
	names[0] = "x"
	if ChatFieldNames()[0] != "tools" {
		t.Error("ChatFieldNames shares its slice")
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestHTTPInvalidInput(t *testing.T) {
	e := newEngine(t, nil)
	h := newHTTPFor(t, e, HTTPConfig{})
	msgs := []Message{{Role: "user", Content: "hi"}}
	for _, tc := range []struct {
		name string
		in   Input
	}{
		{"both forms", Input{Prompt: "x", Messages: msgs}},
		{"chat params without messages", Input{Prompt: "x", ChatParams: json.RawMessage(`{}`)}},
		{"chat params not an object", Input{Messages: msgs, ChatParams: json.RawMessage(`[1]`)}},
		{"chat params with messages", Input{Messages: msgs, ChatParams: json.RawMessage(`{"messages":[]}`)}},
		{"invalid raw message", Input{Messages: []Message{{Raw: json.RawMessage(`{"role":`)}}}},
		{"unknown chat parameter", Input{Messages: msgs, ChatParams: json.RawMessage(`{"tool_choice":"auto"}`)}},
		{"chat params null", Input{Messages: msgs, ChatParams: json.RawMessage(`null`)}},
		{"chat params trailing data", Input{Messages: msgs, ChatParams: json.RawMessage(`{} {}`)}},
		{"documents with kwargs not an object", Input{Messages: msgs, ChatParams: json.RawMessage(`{"chat_template_kwargs":[1],"documents":[]}`)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.Tokenize(context.Background(), engineModel, tc.in)
			if !errors.Is(err, ErrInvalidInput) {
				t.Fatalf("err %v, want ErrInvalidInput", err)
			}
		})
	}
	if n := e.calls.Load(); n != 0 {
		t.Errorf("invalid input reached the engine %d times", n)
	}
	if s := h.Stats(); s.Errors != 9 || s.Requests != 0 {
		t.Errorf("stats %+v, want 9 errors, 0 requests", s)
	}
	_, err := h.Tokenize(context.Background(), engineModel, Input{Messages: msgs, ChatParams: json.RawMessage(`{"tools":[],"tool_choice":"auto"}`)})
	if err == nil || !strings.Contains(err.Error(), `unknown field "tool_choice" (accepted: tools, chat_template, chat_template_kwargs,`) {
		t.Errorf("unknown chat parameter: %v, want it named with the accepted ones", err)
	}
}

func TestHTTPErrors(t *testing.T) {
	long := strings.Repeat("é", 2000)
	for _, tc := range []struct {
		name   string
		model  string
		in     Input
		handle func(w http.ResponseWriter, r *http.Request)
		status int      // want a *StatusError with this code, or 0
		want   []string // substrings of the error text
		is     error    // errors.Is target, if any
	}{
		{name: "unknown model", model: "nope", in: Input{Prompt: "x"},
			status: 404, want: []string{"HTTP 404", "The model `nope` does not exist."}},
		{name: "engine rejects parameters", model: engineModel,
			in:     Input{Messages: []Message{{Role: "user", Content: "x"}}, ChatParams: json.RawMessage(`{"continue_final_message":true}`)},
			status: 400, want: []string{"HTTP 400 Bad Request", "Cannot set both"}},
		{name: "plain text 500", handle: func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "upstream exploded", http.StatusInternalServerError)
		}, status: 500, want: []string{"HTTP 500 Internal Server Error", "upstream exploded"}},
		{name: "fastapi detail", handle: func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, 422, map[string]any{"detail": []map[string]any{{"msg": "Field required"}}})
		}, status: 422, want: []string{"HTTP 422", "Field required"}},
		{name: "long error is truncated", handle: func(w http.ResponseWriter, r *http.Request) {
			vllmError(w, 503, "ServiceUnavailable", long)
		}, status: 503, want: []string{"HTTP 503", "éé…"}},
		{name: "empty error body", handle: func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(502)
		}, status: 502, want: []string{"(empty body)"}},
		{name: "malformed JSON", handle: func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`{"count": 2, "tokens": [1, 2`))
		}, want: []string{"malformed response", `{\"count\": 2`}},
		{name: "not an object", handle: func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`<html>proxy error</html>`))
		}, want: []string{"malformed response", "proxy error"}},
		{name: "no tokens", handle: func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`{"count": 0, "max_model_len": 10}`))
		}, want: []string{"response has no tokens"}},
		{name: "count mismatch", handle: func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`{"count": 3, "tokens": [1, 2]}`))
		}, want: []string{"count 3 but 2 tokens"}},
		{name: "negative id", handle: func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`{"count": 1, "tokens": [-1]}`))
		}, want: []string{"malformed response"}},
		{name: "id too large", handle: func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`{"count": 1, "tokens": [4294967296]}`))
		}, want: []string{"malformed response"}},
		{name: "oversized response (chunked)", handle: func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`{"tokens": [`))
			for i := 0; i < 2000; i++ {
				w.Write([]byte("151643,"))
			}
			w.(http.Flusher).Flush()
			w.Write([]byte("1]}"))
		}, want: []string{"more than 4096 bytes"}, is: ErrResponseTooLarge},
		{name: "oversized response (content-length)", handle: func(w http.ResponseWriter, r *http.Request) {
			body := `{"tokens": [` + strings.Repeat("1,", 3000) + `1]}`
			w.Header().Set("Content-Length", fmt.Sprint(len(body)))
			w.Write([]byte(body))
		}, want: []string{"6015 bytes, limit 4096"}, is: ErrResponseTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, tc.handle)
			h := newHTTPFor(t, e, HTTPConfig{MaxResponseBytes: 4096})
			in := tc.in
			if in.Prompt == "" && !in.IsChat() {
				in.Prompt = "hello"
			}
			ids, err := h.Tokenize(context.Background(), tc.model, in)
			if err == nil {
				t.Fatalf("no error; ids %v", ids)
			}
			var se *StatusError
			if tc.status != 0 && (!errors.As(err, &se) || se.StatusCode != tc.status) {
				t.Errorf("err %v, want StatusError %d", err, tc.status)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("err %v, want errors.Is %v", err, tc.is)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if !strings.Contains(err.Error(), e.srv.URL+"/tokenize") {
				t.Errorf("error %q does not name the URL", err)
			}
			if len(err.Error()) > 800 {
				t.Errorf("error is %d bytes long", len(err.Error()))
			}
			// Failures are not cached: the next call asks again.
			h.Tokenize(context.Background(), tc.model, in)
			if n := e.calls.Load(); n != 2 {
				t.Errorf("engine called %d times, want 2 (errors must not be cached)", n)
			}
			if s := h.Stats(); s.Errors != 2 || s.CacheEntries != 0 {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

// stall is a handler that signals arrived (when not nil) and answers only
// when the client gives up or the test ends.
func stall(arrived chan<- struct{}, done <-chan struct{}) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		if arrived != nil {
			arrived <- struct{}{}
		}
		select {
		case <-r.Context().Done():
		case <-done:
		}
	}
}

func TestHTTPTimeout(t *testing.T) {
	done := make(chan struct{})
	defer close(done)
	e := newEngine(t, stall(nil, done))
	h := newHTTPFor(t, e, HTTPConfig{Timeout: 50 * time.Millisecond})
	_, err := h.Tokenize(context.Background(), "", Input{Prompt: "x"})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no response within 50ms") {
		t.Fatalf("err %v, want the tokenizer's own timeout", err)
	}
}

func TestHTTPContextCancel(t *testing.T) {
	done := make(chan struct{})
	defer close(done)
	arrived := make(chan struct{}, 1)
	e := newEngine(t, stall(arrived, done))
	h := newHTTPFor(t, e, HTTPConfig{Timeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-arrived // the request is at the server
		cancel()
	}()
	_, err := h.Tokenize(ctx, "", Input{Prompt: "x"})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	// A context that is already done never reaches the server.
	calls := e.calls.Load()
	if _, err := h.Tokenize(ctx, "", Input{Prompt: "y"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
	if e.calls.Load() != calls {
		t.Error("request sent with a cancelled context")
	}
}

func TestHTTPConnectionRefused(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	h, err := NewHTTP(HTTPConfig{BaseURL: url})
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.Tokenize(context.Background(), "", Input{Prompt: "x"})
	if err == nil || !strings.Contains(err.Error(), url+"/tokenize") {
		t.Fatalf("err %v", err)
	}
}

func TestHTTPCache(t *testing.T) {
	e := newEngine(t, nil)
	h := newHTTPFor(t, e, HTTPConfig{})
	ctx := context.Background()
	msgs := []Message{{Role: "user", Content: "same text"}}
	steps := []struct {
		name  string
		model string
		in    Input
		calls int64 // engine calls after this step
	}{
		{"first prompt", engineModel, Input{Prompt: "same text"}, 1},
		{"repeat hits", engineModel, Input{Prompt: "same text"}, 1},
		{"explicit default hits", engineModel, Input{Prompt: "same text", AddSpecialTokens: Bool(true)}, 1},
		{"other special flag misses", engineModel, Input{Prompt: "same text", AddSpecialTokens: Bool(false)}, 2},
		{"other model misses", "", Input{Prompt: "same text"}, 3},
		{"chat form misses", engineModel, Input{Messages: msgs}, 4},
		{"chat repeat hits", engineModel, Input{Messages: msgs}, 4},
		{"chat params miss", engineModel, Input{Messages: msgs, ChatParams: json.RawMessage(`{"add_generation_prompt":false}`)}, 5},
		{"role matters", engineModel, Input{Messages: []Message{{Role: "system", Content: "same text"}}}, 6},
		{"field boundaries matter", engineModel, Input{Messages: []Message{{Role: "users", Content: "ame text"}}}, 7},
		{"first prompt still cached", engineModel, Input{Prompt: "same text"}, 7},
		{"tools miss", engineModel, Input{Messages: msgs, ChatParams: json.RawMessage(`{"tools":[{"type":"function","function":{"name":"a"}}]}`)}, 8},
		{"other tools miss", engineModel, Input{Messages: msgs, ChatParams: json.RawMessage(`{"tools":[{"type":"function","function":{"name":"b"}}]}`)}, 9},
		{"same tools hit", engineModel, Input{Messages: msgs, ChatParams: json.RawMessage(`{"tools":[{"type":"function","function":{"name":"a"}}]}`)}, 9},
		{"template kwargs miss", engineModel, Input{Messages: msgs, ChatParams: json.RawMessage(`{"chat_template_kwargs":{"enable_thinking":false}}`)}, 10},
		{"raw message misses", engineModel, Input{Messages: []Message{{Role: "user", Content: "same text", Raw: json.RawMessage(`{"role":"user","content":[{"type":"text","text":"same text"}]}`)}}}, 11},
		{"plain message still cached", engineModel, Input{Messages: msgs}, 11},
	}
	var first []uint64
	for i, s := range steps {
		ids, err := h.Tokenize(ctx, s.model, s.in)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := e.calls.Load(); got != s.calls {
			t.Errorf("%s: engine calls %d, want %d", s.name, got, s.calls)
		}
		if i == 0 {
			first = ids
		}
		if s.in.Prompt == "same text" && s.in.AddSpecialTokens == nil && s.model == engineModel && !slices.Equal(ids, first) {
			t.Errorf("%s: cached ids %v differ from %v", s.name, ids, first)
		}
	}
	// The caller owns the returned slice: modifying it leaves the cache intact.
	ids, _ := h.Tokenize(ctx, engineModel, Input{Prompt: "same text"})
	ids[0] = 999999
	again, _ := h.Tokenize(ctx, engineModel, Input{Prompt: "same text"})
	if !slices.Equal(again, first) {
		t.Errorf("cache corrupted through a returned slice: %v", again)
	}
	if s := h.Stats(); s.Requests != 11 || s.CacheHits != 8 || s.CacheEntries != 11 || s.Errors != 0 {
		t.Errorf("stats %+v", s)
	}
}

func TestHTTPCacheBounds(t *testing.T) {
	ctx := context.Background()
	t.Run("entries", func(t *testing.T) {
		e := newEngine(t, nil)
		h := newHTTPFor(t, e, HTTPConfig{CacheEntries: 2})
		for _, p := range []string{"a", "b", "c", "a"} { // "a" was evicted by "c"
			if _, err := h.Tokenize(ctx, "", Input{Prompt: p}); err != nil {
				t.Fatal(err)
			}
		}
		if n := e.calls.Load(); n != 4 {
			t.Errorf("engine calls %d, want 4", n)
		}
		h.Tokenize(ctx, "", Input{Prompt: "a"}) // now cached
		if n := e.calls.Load(); n != 4 {
			t.Errorf("engine calls %d, want 4", n)
		}
		if s := h.Stats(); s.CacheEntries != 2 {
			t.Errorf("entries %d", s.CacheEntries)
		}
	})
	t.Run("bytes", func(t *testing.T) {
		e := newEngine(t, nil)
		// Room for two entries of ~100 ids, not three.
		h := newHTTPFor(t, e, HTTPConfig{CacheBytes: 2 * (100*4 + entryOverhead)})
		p := func(c string) string { return strings.Repeat(" "+c, 100) } // 100 ids each
		for _, c := range []string{"x", "y", "z"} {
			ids, err := h.Tokenize(ctx, "", Input{Prompt: p(c), AddSpecialTokens: Bool(false)})
			if err != nil || len(ids) != 100 {
				t.Fatalf("%d ids, %v", len(ids), err)
			}
		}
		s := h.Stats()
		if s.CacheEntries != 2 || s.CacheBytes > 2*(100*4+entryOverhead) {
			t.Errorf("stats %+v: byte bound not kept", s)
		}
		h.Tokenize(ctx, "", Input{Prompt: p("x"), AddSpecialTokens: Bool(false)}) // evicted
		h.Tokenize(ctx, "", Input{Prompt: p("z"), AddSpecialTokens: Bool(false)}) // cached
		if n := e.calls.Load(); n != 4 {
			t.Errorf("engine calls %d, want 4", n)
		}
		// An entry larger than the whole budget is not cached.
		h.Tokenize(ctx, "", Input{Prompt: strings.Repeat("w ", 1000)})
		h.Tokenize(ctx, "", Input{Prompt: strings.Repeat("w ", 1000)})
		if n := e.calls.Load(); n != 6 {
			t.Errorf("engine calls %d, want 6", n)
		}
	})
	t.Run("disabled", func(t *testing.T) {
		e := newEngine(t, nil)
		h := newHTTPFor(t, e, HTTPConfig{CacheEntries: -1})
		for range 3 {
			h.Tokenize(ctx, "", Input{Prompt: "a"})
		}
		if n := e.calls.Load(); n != 3 {
			t.Errorf("engine calls %d, want 3", n)
		}
	})
}

// TestHTTPConcurrent runs many callers over a few prompts; under -race it
// checks the cache and counters for data races, and every caller must get
// the right ids.
func TestHTTPConcurrent(t *testing.T) {
	e := newEngine(t, nil)
	h := newHTTPFor(t, e, HTTPConfig{CacheEntries: 3})
	local, _ := qwen(t)
	prompts := []string{"alpha beta", "gamma delta", "你好 世界", "x y z", "<|im_start|>user"}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 16 {
		wg.Go(func() {
			for i := range 40 {
				p := prompts[(g+i)%len(prompts)]
				ids, err := h.Tokenize(context.Background(), "", Input{Prompt: p})
				if err == nil && !slices.Equal(ids, local.Encode(p, true)) {
					err = fmt.Errorf("prompt %q: ids %v", p, ids)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	s := h.Stats()
	if s.Requests+s.CacheHits != 16*40 || s.CacheEntries > 3 {
		t.Errorf("stats %+v", s)
	}
}

func TestNewHTTPConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg     HTTPConfig
		url     string // want URL(), or "" for an error
		wantErr string
	}{
		{HTTPConfig{BaseURL: "http://vllm:8000"}, "http://vllm:8000/tokenize", ""},
		{HTTPConfig{BaseURL: "https://gw.example/engine/"}, "https://gw.example/engine/tokenize", ""},
		{HTTPConfig{BaseURL: ""}, "", "want http(s)://"},
		{HTTPConfig{BaseURL: "vllm:8000"}, "", "want http(s)://"},
		{HTTPConfig{BaseURL: "ftp://vllm"}, "", "want http(s)://"},
		{HTTPConfig{BaseURL: "http://vllm?x=1"}, "", "no query"},
		{HTTPConfig{BaseURL: "http://vllm", Timeout: -1}, "", "negative"},
		{HTTPConfig{BaseURL: "http://vllm", MaxResponseBytes: -1}, "", "negative"},
	} {
		h, err := NewHTTP(tc.cfg)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%+v: err %v, want %q", tc.cfg, err, tc.wantErr)
			}
			continue
		}
		if err != nil || h.URL() != tc.url {
			t.Errorf("%+v: url %q err %v, want %q", tc.cfg, h.URL(), err, tc.url)
		}
	}
}

func TestHTTPHeader(t *testing.T) {
	got := make(chan string, 1)
	e := newEngine(t, func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Authorization") + "|" + r.Header.Get("Content-Type")
		w.Write([]byte(`{"count":1,"tokens":[7]}`))
	})
	h := newHTTPFor(t, e, HTTPConfig{Header: http.Header{"Authorization": {"Bearer k"}}})
	ids, err := h.Tokenize(context.Background(), "", Input{Prompt: "x"})
	if err != nil || !slices.Equal(ids, []uint64{7}) {
		t.Fatalf("ids %v err %v", ids, err)
	}
	if g := <-got; g != "Bearer k|application/json" {
		t.Errorf("headers %q", g)
	}
}

// FuzzDecodeResponse feeds arbitrary bodies to the response and error
// decoders: they must not panic, must accept only well-formed id lists,
// and must keep quoted error text short.
func FuzzDecodeResponse(f *testing.F) {
	for _, s := range []string{
		`{"count":2,"max_model_len":10,"tokens":[1,2]}`, `{"tokens":[]}`, `{"count":1,"tokens":[1,2]}`,
		`{"tokens":[-1]}`, `{"tokens":null}`, `{"error":{"message":"bad"}}`, `{"detail":[{"msg":"x"}]}`,
		`{"message":"m"}`, `{"error":"plain"}`, `not json`, ``, `{"tokens":[4294967295]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		ids, err := decodeResponse(body)
		if err == nil {
			var check struct {
				Count  *int              `json:"count"`
				Tokens []json.RawMessage `json:"tokens"`
			}
			if json.Unmarshal(body, &check) != nil || check.Tokens == nil || len(check.Tokens) != len(ids) ||
				(check.Count != nil && *check.Count != len(ids)) {
				t.Fatalf("accepted %q as %v", body, ids)
			}
		} else if len(err.Error()) > 4*maxErrorText {
			t.Fatalf("error of %d bytes", len(err.Error()))
		}
		if msg := errorText(body); len(msg) > maxErrorText+len("…") {
			t.Fatalf("error text of %d bytes", len(msg))
		}
	})
}

func TestQuote(t *testing.T) {
	for _, tc := range []struct {
		body string
		want string // prefix of the result
		more bool   // ends with "…"
	}{
		{`{"x":1}`, `"{\"x\":1}"`, false},
		{strings.Repeat("a", 1000), `"aaaa`, true},
		{strings.Repeat("\x00", 1000), `"\x00\x00`, true}, // escaping quadruples the size
		{strings.Repeat("é", 400), `"éé`, true},           // cut between runes
	} {
		q := quote([]byte(tc.body))
		if !strings.HasPrefix(q, tc.want) || strings.HasSuffix(q, "…") != tc.more || len(q) > 2*maxErrorText+len("…") || !utf8.ValidString(q) {
			t.Errorf("quote(%.20q…) = %.40q… (%d bytes)", tc.body, q, len(q))
		}
	}
}
