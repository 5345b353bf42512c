package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
)

// ChatFields are the top-level fields of a chat request that change how
// its messages are rendered, and so its tokens: the fields of vLLM's
// /tokenize chat form (TokenizeChatRequest), plus documents and
// reasoning_effort, which vLLM's chat completions hand to the template
// through chat_template_kwargs (the HTTP tokenizer does the same, since
// /tokenize has no field of its own for them).
//
// Values are raw JSON, forwarded verbatim: the template renders a tool's
// schema key by key, so re-encoding it through a map would reorder keys and
// change the tokens. A nil field is absent; the engine then applies its
// default (add_generation_prompt true, the rest off or empty).
//
// This struct is the one list of these fields: its JSON form is what
// Input.ChatParams holds, and kvindex's HTTP API decodes them from the top
// level of a request into it; the Go client (api/client.ParseChatPrompt),
// which cannot import the tokenizer, keeps a copy that its tests check
// against this one. Sampling parameters, tool_choice and the like do not
// reach the template, so they are not here.
type ChatFields struct {
	Tools                json.RawMessage `json:"tools,omitempty"`
	ChatTemplate         json.RawMessage `json:"chat_template,omitempty"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs,omitempty"`
	AddGenerationPrompt  json.RawMessage `json:"add_generation_prompt,omitempty"`
	ContinueFinalMessage json.RawMessage `json:"continue_final_message,omitempty"`
	AddSpecialTokens     json.RawMessage `json:"add_special_tokens,omitempty"`
	MMProcessorKwargs    json.RawMessage `json:"mm_processor_kwargs,omitempty"`
	MediaIOKwargs        json.RawMessage `json:"media_io_kwargs,omitempty"`
	Documents            json.RawMessage `json:"documents,omitempty"`
	ReasoningEffort      json.RawMessage `json:"reasoning_effort,omitempty"`
}

// chatFieldNames are ChatFields' JSON names, in declaration order.
var chatFieldNames = func() []string {
	t := reflect.TypeFor[ChatFields]()
	names := make([]string, t.NumField())
	for i := range names {
		names[i], _, _ = strings.Cut(t.Field(i).Tag.Get("json"), ",")
	}
	return names
}()

// ChatFieldNames returns the JSON names of ChatFields' fields, for
// messages that list what a request may carry.
func ChatFieldNames() []string { return slices.Clone(chatFieldNames) }

// Set returns the JSON names of the fields f carries, in declaration order.
func (f *ChatFields) Set() []string {
	v := reflect.ValueOf(f).Elem()
	var set []string
	for i, name := range chatFieldNames {
		if v.Field(i).Len() > 0 {
			set = append(set, name)
		}
	}
	return set
}

// JSON returns f as the JSON object Input.ChatParams takes, or nil when f
// carries no field. It fails only for a field that is not valid JSON.
func (f *ChatFields) JSON() (json.RawMessage, error) {
	if len(f.Set()) == 0 {
		return nil, nil
	}
	b, err := marshalVerbatim(f)
	if err != nil {
		return nil, fmt.Errorf("%w: chat parameters: %v", ErrInvalidInput, err)
	}
	return b, nil
}

// parseChatParams decodes Input.ChatParams, refusing anything but a JSON
// object of ChatFields' fields.
func parseChatParams(raw json.RawMessage) (ChatFields, error) {
	var f ChatFields
	if t := bytes.TrimSpace(raw); len(t) == 0 || t[0] != '{' {
		return f, fmt.Errorf("%w: chat parameters are not a JSON object", ErrInvalidInput)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	err := dec.Decode(&f)
	if err == nil {
		if _, extra := dec.Token(); extra != io.EOF {
			err = errors.New("unexpected data after the JSON object")
		}
	}
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), "json: ")
		if strings.HasPrefix(msg, "unknown field") {
			msg += " (accepted: " + strings.Join(chatFieldNames, ", ") + ")"
		}
		return f, fmt.Errorf("%w: chat parameters: %s", ErrInvalidInput, msg)
	}
	return f, nil
}

// foldTemplateArgs moves documents and reasoning_effort into
// chat_template_kwargs, as vLLM's chat completions do: their values override
// the same keys there, and null or "auto" leave them unset.
func (f *ChatFields) foldTemplateArgs() error {
	moved := [...]struct {
		name string
		v    *json.RawMessage
	}{{"documents", &f.Documents}, {"reasoning_effort", &f.ReasoningEffort}}
	var kwargs map[string]json.RawMessage
	for _, m := range moved {
		v := bytes.TrimSpace(*m.v)
		*m.v = nil
		if len(v) == 0 || string(v) == "null" || string(v) == `"auto"` {
			continue
		}
		if kwargs == nil {
			kwargs = map[string]json.RawMessage{}
			if k := bytes.TrimSpace(f.ChatTemplateKwargs); len(k) > 0 && string(k) != "null" {
				if k[0] != '{' || json.Unmarshal(k, &kwargs) != nil {
					return fmt.Errorf("%w: chat_template_kwargs is not a JSON object", ErrInvalidInput)
				}
			}
		}
		kwargs[m.name] = v
	}
	if kwargs == nil {
		return nil
	}
	b, err := marshalVerbatim(kwargs)
	if err != nil {
		return fmt.Errorf("%w: chat parameters: %v", ErrInvalidInput, err)
	}
	f.ChatTemplateKwargs = b
	return nil
}

// marshalVerbatim encodes v without escaping <, > and &, so that raw values
// reach the engine as the caller wrote them (whitespace aside).
func marshalVerbatim(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// UnmarshalJSON reads an OpenAI chat message object. Role and, when it is a
// string, Content are taken from it; a message with anything more (content
// parts, a null or missing content, tool_calls, tool_call_id, name, ...)
// is also kept whole in Raw, so that it reaches the engine unchanged.
func (m *Message) UnmarshalJSON(b []byte) error {
	var obj map[string]json.RawMessage
	if t := bytes.TrimSpace(b); len(t) == 0 || t[0] != '{' || json.Unmarshal(t, &obj) != nil {
		return fmt.Errorf(`a chat message must be a JSON object such as {"role":"user","content":"hi"}, not %s`, jsonKind(t))
	}
	*m = Message{}
	_, simple := obj["content"]
	simple = simple && len(obj) <= 2
	for k, v := range obj {
		switch k {
		case "role":
			if json.Unmarshal(v, &m.Role) != nil {
				return fmt.Errorf("a chat message's role must be a string, not %s", jsonKind(v))
			}
		case "content":
			if string(v) == "null" || json.Unmarshal(v, &m.Content) != nil {
				simple = false // content parts, or none
			}
		default:
			simple = false
		}
	}
	if !simple {
		m.Raw = bytes.Clone(b)
	}
	return nil
}

// MarshalJSON writes Raw when it is set, else {"role":...,"content":...}.
func (m Message) MarshalJSON() ([]byte, error) {
	if m.Raw != nil {
		return m.Raw, nil
	}
	return json.Marshal(plainMessage{m.Role, m.Content})
}

type plainMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// jsonKind names the kind of a JSON value, for error messages.
func jsonKind(v []byte) string {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return "nothing"
	}
	switch v[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}
