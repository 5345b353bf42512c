package client

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kvindex/kvindex/api/kvindexv1"
)

// ParseChatPrompt reads a chat prompt as OpenAI clients write one: a JSON
// array of messages, or a chat request object as sent to
// /v1/chat/completions, of which the messages and the fields that change
// how they are rendered (tools, chat_template_kwargs, ...: the fields
// kvindexv1.ChatMessages.chat_params_json lists) are kept, verbatim; the
// other fields (model, sampling parameters, tool_choice, stream, ...) do
// not reach the template and are ignored. A message of a role and a text
// content becomes a plain ChatMessage; any other message object (content
// parts, a null content, tool calls, tool results, names) is kept whole
// (MessageJSON). The server decodes the messages and fields of its HTTP
// API the same way.
func ParseChatPrompt(data []byte) (*kvindexv1.Prompt, error) {
	var req struct {
		Messages chatMessages `json:"messages"`
		chatParams
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
		return nil, errors.New("no messages")
	}
	params, err := req.chatParams.encode()
	if err != nil {
		return nil, err
	}
	return ChatPrompt(params, req.Messages...), nil
}

// chatParams are the top-level fields of a chat request that change how
// its messages are rendered, as kvindexv1.ChatMessages.chat_params_json
// lists them (tokenizer.ChatFields on the server's side; a test keeps the
// two lists the same). Values are raw JSON, kept verbatim: the template
// renders a tool's schema key by key.
type chatParams struct {
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

// encode returns p as the chat_params_json of a prompt: a JSON object of
// the fields it carries, in declaration order, or "" for none. <, > and &
// stay as the request wrote them.
func (p *chatParams) encode() (string, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(p); err != nil {
		return "", fmt.Errorf("chat parameters: %v", err)
	}
	if s := string(bytes.TrimSuffix(buf.Bytes(), []byte("\n"))); s != "{}" {
		return s, nil
	}
	return "", nil
}

// chatMessages decodes the messages of a chat request.
type chatMessages []*kvindexv1.ChatMessage

// UnmarshalJSON reads a JSON array of OpenAI chat message objects (null
// is none).
func (m *chatMessages) UnmarshalJSON(b []byte) error {
	var raw []json.RawMessage
	if t := bytes.TrimSpace(b); len(t) == 0 || t[0] != '[' && string(t) != "null" {
		return fmt.Errorf("the messages are %s, not an array", jsonKind(t))
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	*m = nil
	for _, r := range raw {
		msg, err := chatMessage(r)
		if err != nil {
			return err
		}
		*m = append(*m, msg)
	}
	return nil
}

// chatMessage reads an OpenAI chat message object: role and content when
// they are all it has and the content is a string, else the whole object.
func chatMessage(b []byte) (*kvindexv1.ChatMessage, error) {
	var obj map[string]json.RawMessage
	if t := bytes.TrimSpace(b); len(t) == 0 || t[0] != '{' || json.Unmarshal(t, &obj) != nil {
		return nil, fmt.Errorf(`a chat message must be a JSON object such as {"role":"user","content":"hi"}, not %s`, jsonKind(t))
	}
	var m kvindexv1.ChatMessage
	_, simple := obj["content"]
	simple = simple && len(obj) <= 2
	for k, v := range obj {
		switch k {
		case "role":
			if json.Unmarshal(v, &m.Role) != nil {
				return nil, fmt.Errorf("a chat message's role must be a string, not %s", jsonKind(v))
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
		return MessageJSON(string(b)), nil
	}
	return &kvindexv1.ChatMessage{Role: m.Role, Content: m.Content}, nil
}

// jsonKind names the kind of a JSON value, for errors.
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
