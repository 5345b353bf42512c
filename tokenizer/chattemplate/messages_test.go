package chattemplate

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// asMessageList splits a JSON array of messages into a MessageList: a
// message written exactly as {"role": string, "content": string}, in that
// order, becomes a plain one, any other stays raw. ok is false when raw is
// not a JSON array.
func asMessageList(raw []byte) (list []Message, ok bool) {
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil || items == nil {
		return nil, false
	}
	list = make([]Message, len(items))
	for i, item := range items {
		list[i] = Message{Raw: item}
		dec := json.NewDecoder(bytes.NewReader(item))
		var toks []any
		for {
			tok, err := dec.Token()
			if err != nil {
				break
			}
			toks = append(toks, tok)
		}
		if len(toks) == 6 && toks[0] == json.Delim('{') && toks[1] == "role" && toks[3] == "content" && toks[5] == json.Delim('}') {
			role, ok1 := toks[2].(string)
			content, ok2 := toks[4].(string)
			if ok1 && ok2 {
				list[i] = Message{Role: role, Content: content}
			}
		}
	}
	return list, true
}

// TestMessageListGolden renders every golden case again from a
// MessageList, plain messages given as strings: the prompt (or the
// failure) is the same as from the JSON array, and so as the reference's.
func TestMessageListGolden(t *testing.T) {
	templates := map[string]*Template{}
	plain := 0
	for _, c := range readGolden(t) {
		tmpl := templates[c.Template]
		if tmpl == nil {
			tmpl = loadTestTemplate(t, c.Template)
			templates[c.Template] = tmpl
		}
		list, ok := asMessageList(c.Messages)
		if !ok {
			t.Fatalf("%s/%s: messages are not a JSON array", c.Template, c.Name)
		}
		for _, m := range list {
			if m.Raw == nil {
				plain++
			}
		}
		want, wantErr := tmpl.Render(Request{Messages: c.Messages, Tools: c.Tools, AddGenerationPrompt: c.AddGenerationPrompt})
		got, err := tmpl.Render(Request{MessageList: list, Tools: c.Tools, AddGenerationPrompt: c.AddGenerationPrompt})
		if got != want || (err == nil) != (wantErr == nil) {
			t.Errorf("%s/%s: from a MessageList %q, %v; from JSON %q, %v", c.Template, c.Name, got, err, want, wantErr)
		}
	}
	if plain == 0 {
		t.Fatal("no golden message was taken as plain")
	}
}

// TestMessageList: plain messages read as {"role", "content"} in that
// order, with bytes that are not UTF-8 replaced as a JSON encoding would;
// raw messages are decoded (tool-call arguments too) and nested no deeper
// than in a JSON array; Messages and MessageList are not both given.
func TestMessageList(t *testing.T) {
	const src = `{% for m in messages %}{{ m|tojson }};{% endfor %}`
	cases := []struct {
		name string
		list []Message
		want string
		err  error
	}{
		{"plain", []Message{{Role: "user", Content: "hi"}, {Role: "assistant", Content: ""}}, `{"role": "user", "content": "hi"};{"role": "assistant", "content": ""};`, nil},
		{"raw", []Message{{Role: "ignored", Raw: []byte(`{"content": null, "role": "assistant", "tool_calls": [{"function": {"arguments": "{\"b\": 1, \"a\": 2}"}}]}`)}}, `{"content": null, "role": "assistant", "tool_calls": [{"function": {"arguments": {"b": 1, "a": 2}}}]};`, nil},
		{"raw_null", []Message{{Raw: []byte(`null`)}}, `null;`, nil},
		{"not_utf8", []Message{{Role: "u\xffser", Content: "a\xe2\x82b\xc3"}}, `{"role": "u` + "\ufffd" + `ser", "content": "a` + "\ufffd\ufffd" + `b` + "\ufffd" + `"};`, nil},
		{"empty", []Message{}, ``, nil},
		{"raw_bad_json", []Message{{Raw: []byte(`{"role": `)}}, "", ErrInput},
		{"raw_empty", []Message{{Raw: []byte{}}}, "", ErrInput},
		{"raw_trailing", []Message{{Raw: []byte(`{} {}`)}}, "", ErrInput},
		{"raw_too_deep", []Message{{Raw: []byte(strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth))}}, "", ErrInput},
		{"raw_bad_arguments", []Message{{Raw: []byte(`{"tool_calls": [{"function": {"arguments": "{"}}]}`)}}, "", ErrInput},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := render(t, src, Request{MessageList: c.list, DecodeToolArguments: true})
			if c.err != nil {
				if !errors.Is(err, c.err) {
					t.Fatalf("err %v, want %v", err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %q, %v; want %q", got, err, c.want)
			}
			if c.name == "empty" {
				return
			}
			// The same messages as one JSON array render the same.
			var arr bytes.Buffer
			arr.WriteByte('[')
			for i, m := range c.list {
				if i > 0 {
					arr.WriteByte(',')
				}
				if m.Raw == nil {
					b, _ := json.Marshal(struct {
						Role    string `json:"role"`
						Content string `json:"content"`
					}{m.Role, m.Content})
					m.Raw = b
				}
				arr.Write(m.Raw)
			}
			arr.WriteByte(']')
			if fromJSON, err := render(t, src, Request{Messages: arr.Bytes(), DecodeToolArguments: true}); err != nil || fromJSON != got {
				t.Fatalf("from JSON %q, %v; from the list %q", fromJSON, err, got)
			}
		})
	}
	// tojson writes U+FFFD itself: the values must hold it already.
	got, err := render(t, `{{ messages[0].role }}|{{ messages[0].content }}`, Request{MessageList: []Message{{Role: "u\xffser", Content: "a\xe2\x82b\xc3"}}})
	if want := "u\ufffdser|a\ufffd\ufffdb\ufffd"; err != nil || got != want {
		t.Fatalf("not UTF-8: got %q, %v; want %q", got, err, want)
	}
	_, err = render(t, src, Request{Messages: []byte(`[]`), MessageList: []Message{}})
	if !errors.Is(err, ErrInput) {
		t.Fatalf("both forms: err %v, want ErrInput", err)
	}
	// One level less than the limit still decodes, as in a JSON array.
	deep := strings.Repeat("[", maxDepth-1) + strings.Repeat("]", maxDepth-1)
	if _, err := render(t, src, Request{MessageList: []Message{{Raw: []byte(deep)}}}); err != nil {
		t.Fatalf("depth %d: %v", maxDepth-1, err)
	}
	if _, err := render(t, src, Request{Messages: []byte("[" + deep + "]")}); err != nil {
		t.Fatalf("depth %d in JSON: %v", maxDepth-1, err)
	}
}
