package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"testing"
)

// FuzzChatRequest feeds arbitrary chat messages and chat parameters, as a
// caller sends them, through the decoding of messages and the rendering of
// the engine's /tokenize request: a refusal is ErrInvalidInput, and a
// request sent is one JSON object of known keys, with the messages in order
// and verbatim, and documents and reasoning_effort moved into
// chat_template_kwargs.
//
//	go test -run '^$' -fuzz '^FuzzChatRequest$' -fuzztime 60s ./tokenizer
func FuzzChatRequest(f *testing.F) {
	for _, s := range [][2]string{
		{`[{"role":"user","content":"hi"}]`, ``},
		{`[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"x"}]}]`, `{"tools":[{"type":"function","function":{"name":"f"}}]}`},
		{`[{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]},{"role":"tool","tool_call_id":"1","content":"r"}]`, `{"add_generation_prompt":false,"continue_final_message":true}`},
		{`[{"role":"user","content":"<a&b>"}]`, `{"documents":[{"title":"t"}],"reasoning_effort":"high","chat_template_kwargs":{"enable_thinking":false}}`},
		{`[{"role":"user","content":"x"}]`, `{"reasoning_effort":"auto","documents":null,"chat_template_kwargs":null}`},
		{`[{"role":"user","content":"x"}]`, `{"documents":[],"chat_template_kwargs":[1]}`},
		{`[{"role":"user","content":"x"}]`, `{"add_special_tokens":true,"chat_template":"{{ messages }}","mm_processor_kwargs":{},"media_io_kwargs":{}}`},
		{`[{"role":"user","content":"x"}]`, `{"temperature":0}`},
		{`[{"role":"user","content":"x"}]`, `{"tools":[]} {}`},
		{`[{"role":"user","content":"x"}]`, `[]`},
		{`[{"role":1}]`, ``},
		{`["hi"]`, ``},
		{`[{"role":"user","content":"x","role":"system"}]`, ``},
	} {
		f.Add([]byte(s[0]), []byte(s[1]))
	}
	known := append(ChatFieldNames(), "model", "messages")
	f.Fuzz(func(t *testing.T, messages, params []byte) {
		var msgs []Message
		if err := json.Unmarshal(messages, &msgs); err != nil || len(msgs) == 0 {
			return // the caller's JSON decoder refuses these before a tokenizer sees them
		}
		in := Input{Messages: msgs}
		if len(params) > 0 {
			in.ChatParams = params
		}
		body, err := requestBody("m", &in, true)
		if err != nil {
			if !errors.Is(err, ErrInvalidInput) {
				t.Fatalf("refusal %v is not ErrInvalidInput", err)
			}
			return
		}
		var req map[string]json.RawMessage
		dec := json.NewDecoder(bytes.NewReader(body))
		if err := dec.Decode(&req); err != nil || dec.More() {
			t.Fatalf("request %q is not one JSON object: %v", body, err)
		}
		for k := range req {
			if !slices.Contains(known, k) {
				t.Fatalf("request %s has key %q", body, k)
			}
		}
		if _, ok := req["documents"]; ok {
			t.Fatalf("documents not moved into chat_template_kwargs: %s", body)
		}
		if _, ok := req["reasoning_effort"]; ok {
			t.Fatalf("reasoning_effort not moved into chat_template_kwargs: %s", body)
		}
		var sent []json.RawMessage
		if err := json.Unmarshal(req["messages"], &sent); err != nil || len(sent) != len(msgs) {
			t.Fatalf("messages %s, want %d: %v", req["messages"], len(msgs), err)
		}
		for i, m := range msgs {
			var want []byte
			if m.Raw != nil {
				want = m.Raw
			} else {
				want, _ = json.Marshal(plainMessage{m.Role, m.Content})
			}
			if !bytes.Equal(compact(t, sent[i]), compact(t, want)) {
				t.Fatalf("message %d sent as %s, want %s", i, sent[i], want)
			}
		}
	})
}

// compact returns the JSON value b without insignificant space.
func compact(t *testing.T, b []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		t.Fatalf("%q: %v", b, err)
	}
	return out.Bytes()
}
