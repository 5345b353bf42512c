package client

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/tokenizer"
)

// An agent's chat request, as it is sent to /v1/chat/completions: tools,
// a tool call and its result, content parts, template arguments, and
// fields that do not reach the template (sampling, tool_choice, stream).
const (
	agentTool = `{"type":"function","function":{"name":"get_weather","description":"Weather in <city>",` +
		`"parameters":{"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"integer"}},"required":["zeta"]}}}`
	agentMessages = `[{"role":"system","content":"Be brief."},` +
		`{"role":"user","content":[{"type":"text","text":"Weather?"},{"type":"image_url","image_url":{"url":"http://img/1.png"}}]},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]},` +
		`{"role":"tool","tool_call_id":"c1","content":"sunny"}]`
	agentRequest = `{
  "model": "qwen",
  "messages": ` + agentMessages + `,
  "tools": [` + agentTool + `],
  "tool_choice": "auto",
  "chat_template_kwargs": {"enable_thinking": false},
  "temperature": 0.2,
  "max_tokens": 64,
  "stream": true
}`
)

func TestParseChatPrompt(t *testing.T) {
	plain := func(role, content string) *kvindexv1.ChatMessage {
		return &kvindexv1.ChatMessage{Role: role, Content: content}
	}
	for _, tc := range []struct {
		name, in string
		params   string // the prompt's chat_params_json
		want     []*kvindexv1.ChatMessage
	}{
		{"array", `[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}]`, "",
			[]*kvindexv1.ChatMessage{plain("user", "hi"), plain("assistant", "hello")}},
		{"request, messages only", `{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":1}`, "",
			[]*kvindexv1.ChatMessage{plain("user", "hi")}},
		{"full request", agentRequest, `{"tools":[` + agentTool + `],"chat_template_kwargs":{"enable_thinking":false}}`,
			[]*kvindexv1.ChatMessage{plain("system", "Be brief."),
				MessageJSON(`{"role":"user","content":[{"type":"text","text":"Weather?"},{"type":"image_url","image_url":{"url":"http://img/1.png"}}]}`),
				MessageJSON(`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]}`),
				MessageJSON(`{"role":"tool","tool_call_id":"c1","content":"sunny"}`)}},
		{"fields in declaration order, null kept", `{"reasoning_effort":"low","messages":[{"content":"hi"}],"tools":null}`,
			`{"tools":null,"reasoning_effort":"low"}`, []*kvindexv1.ChatMessage{plain("", "hi")}},
		{"keys match as encoding/json matches them", `{"Messages":[{"role":"user","content":"hi"}],"TOOLS":[]}`,
			`{"tools":[]}`, []*kvindexv1.ChatMessage{plain("user", "hi")}},
		{"the last of repeated keys", `{"messages":[{"role":"a","content":"x"}],"messages":[{"role":"b","content":"y"}]}`,
			"", []*kvindexv1.ChatMessage{plain("b", "y")}},
		{"a message with more than role and content", ` [{"role":"user","content":"hi","name":"ann"}] `, "",
			[]*kvindexv1.ChatMessage{MessageJSON(`{"role":"user","content":"hi","name":"ann"}`)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParseChatPrompt([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if got := p.GetMessages().GetChatParamsJson(); got != tc.params {
				t.Errorf("chat_params_json %s\nwant %s", got, tc.params)
			}
			if got := p.GetMessages().GetMessages(); !slices.EqualFunc(got, tc.want, func(a, b *kvindexv1.ChatMessage) bool { return proto.Equal(a, b) }) {
				t.Errorf("messages %v\nwant %v", got, tc.want)
			}
		})
	}
	const want = `want a JSON array of messages ({"role","content"}) or a chat request object with "messages": `
	for _, tc := range []struct{ in, err string }{
		{``, want + "unexpected end of JSON input"},
		{`null`, "no messages"},
		{`[]`, "no messages"},
		{`{}`, "no messages"},
		{`{"messages":[]}`, "no messages"},
		{`{"messages":null}`, "no messages"},
		{`{"messages":[["user","hi"]]}`, want + `a chat message must be a JSON object such as {"role":"user","content":"hi"}, not an array`},
		{`[1]`, want + `a chat message must be a JSON object such as {"role":"user","content":"hi"}, not a number`},
		{`[{"role":1,"content":"hi"}]`, want + "a chat message's role must be a string, not a number"},
		{`{"messages":[{"role":"user","content":"hi"}],"tools":[1,}`, want + "invalid character '}' looking for beginning of value"},
		{`[{"role":"user","content":"hi"}] [{"role":"user","content":"hi"}]`, want + "invalid character '[' after top-level value"},
		{`{"messages":"hi"}`, want + "the messages are a string, not an array"},
		{`{"messages":{"role":"user","content":"hi"}}`, want + "the messages are an object, not an array"},
		{`"hi"`, want + "the messages are a string, not an array"},
		{`true`, want + "the messages are a boolean, not an array"},
		{`5`, want + "the messages are a number, not an array"},
		{strings.Repeat(`[`, 20000), want + "invalid character '[' exceeded max depth"},
	} {
		p, err := ParseChatPrompt([]byte(tc.in))
		if err == nil || err.Error() != tc.err || p != nil {
			t.Errorf("ParseChatPrompt(%.40q) = %v, %v; want the error %q", tc.in, p, err, tc.err)
		}
	}
}

// The chat request fields the client keeps are the tokenizer's, which the
// server reads them with.
func TestChatParamsAreTheTokenizers(t *testing.T) {
	typ := reflect.TypeFor[chatParams]()
	var names []string
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		names = append(names, name)
	}
	if want := tokenizer.ChatFieldNames(); !slices.Equal(names, want) {
		t.Errorf("chatParams has %v, tokenizer.ChatFields %v", names, want)
	}
}

// chatPromptByTokenizer reads a chat prompt with the tokenizer's own types,
// as the server reads a chat request: the reference ParseChatPrompt
// follows.
func chatPromptByTokenizer(data []byte) (*kvindexv1.Prompt, error) {
	var req struct {
		Messages []tokenizer.Message `json:"messages"`
		tokenizer.ChatFields
	}
	var err error
	if data = bytes.TrimSpace(data); len(data) > 0 && data[0] == '{' {
		err = json.Unmarshal(data, &req)
	} else {
		err = json.Unmarshal(data, &req.Messages)
	}
	if err != nil {
		return nil, fmt.Errorf(`want a JSON array of messages ({"role","content"}) or a chat request object with "messages": %v`, err)
	}
	if len(req.Messages) == 0 {
		return nil, fmt.Errorf("no messages")
	}
	params, err := req.ChatFields.JSON()
	if err != nil {
		return nil, err
	}
	out := make([]*kvindexv1.ChatMessage, len(req.Messages))
	for i, m := range req.Messages {
		if m.Raw != nil {
			out[i] = MessageJSON(string(m.Raw))
		} else {
			out[i] = &kvindexv1.ChatMessage{Role: m.Role, Content: m.Content}
		}
	}
	return ChatPrompt(string(params), out...), nil
}

// FuzzParseChatPrompt: any input gives a prompt or an error, never a
// panic, and the same as the tokenizer's types read: the same prompt, or
// the same error, except that where the messages are not an array the
// client says so rather than name a Go type.
func FuzzParseChatPrompt(f *testing.F) {
	for _, s := range []string{agentRequest, agentMessages, `{"messages":"hi"}`, `[1]`, `null`, `{"messages":[{"role":1}]}`,
		`{"tools":null,"messages":[{"content":"x"}],"Documents":[1]}`, `{"messages":"x","messages":[{"content":"y"}]}`, `[{"content":"a<b&c"}]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := ParseChatPrompt(data)
		want, wantErr := chatPromptByTokenizer(data)
		switch {
		case err != nil && wantErr != nil:
			if err.Error() != wantErr.Error() && !strings.Contains(err.Error(), "not an array") {
				t.Errorf("ParseChatPrompt(%q): %v\nthe tokenizer's types: %v", data, err, wantErr)
			}
		case err != nil || wantErr != nil:
			t.Errorf("ParseChatPrompt(%q) = %v, %v\nthe tokenizer's types: %v, %v", data, got, err, want, wantErr)
		case !proto.Equal(got, want):
			t.Errorf("ParseChatPrompt(%q) = %v\nthe tokenizer's types: %v", data, got, want)
		}
	})
}
