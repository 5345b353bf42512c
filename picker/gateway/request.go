package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/picker"
)

// Request headers the picker reads.
const (
	// HeaderSession names the conversation; requests of one session
	// prefer the pod that served the last one.
	HeaderSession = "x-session-id"
	// HeaderPriority marks a turn nobody waits on: "background" (or
	// "batch"); anything else, or none, is interactive.
	HeaderPriority = "x-request-priority"
	// HeaderDestination is where the gateway sends the request (the
	// Endpoint Picker Protocol's header and metadata key).
	HeaderDestination = "x-gateway-destination-endpoint"
	// MetadataNamespace is the dynamic metadata namespace of the
	// destination; SubsetNamespace and SubsetKey hold the gateway's
	// subset hint.
	MetadataNamespace = "envoy.lb"
	SubsetNamespace   = "envoy.lb.subset_hint"
	SubsetKey         = "x-gateway-destination-endpoint-subset"
)

// ErrBadRequest is matched (errors.Is) by every error ParseRequest
// returns: the body is not an inference request the picker can read.
var ErrBadRequest = errors.New("bad request")

// Request is an inference request as the picker reads it: the model, the
// prompt in the form kvindex takes it, and the routing hints.
type Request struct {
	Model string
	// Prompt is the prompt for kvindex's LongestPrefix: the caller's
	// token ids, the completion text, or the chat messages (kvindex
	// tokenizes the last two). Nil for a request without a prompt.
	Prompt *kvindexv1.Prompt
	// Tokens are the caller's token ids, when it sent ids.
	Tokens   []uint64
	Session  string
	Priority picker.Priority
}

// chatParams are the chat request fields that change how the engine
// renders the conversation (kvindexv1.ChatMessages.chat_params_json).
var chatParams = []string{"tools", "chat_template", "chat_template_kwargs", "add_generation_prompt",
	"continue_final_message", "add_special_tokens", "mm_processor_kwargs", "media_io_kwargs", "documents", "reasoning_effort"}

// body is the union of the fields the three APIs use.
type body struct {
	Model              string          `json:"model"`
	Prompt             json.RawMessage `json:"prompt"`   // /v1/completions
	Messages           json.RawMessage `json:"messages"` // /v1/chat/completions
	Input              json.RawMessage `json:"input"`    // Responses API
	Instructions       string          `json:"instructions"`
	PreviousResponseID string          `json:"previous_response_id"`
}

// ParseRequest reads an OpenAI request body: /v1/completions (prompt as
// text or token ids), /v1/chat/completions (messages) or the Responses
// API (input as text or items, with instructions). The API is told by the
// body's fields, so that /v1/pick needs no path. header returns a request
// header's value by lower-case name ("" when absent).
//
// A completions batch (several prompts) is routed by its first prompt:
// one pod serves the whole request. A Responses API input carries only
// its message items (function calls and reasoning items are left out:
// kvindex cannot render them), so its prefix is approximate; its
// previous_response_id, when no session header is set, is the session.
func ParseRequest(data []byte, header func(string) string) (*Request, error) {
	var b body
	if err := json.Unmarshal(data, &b); err != nil {
		return nil, fmt.Errorf("%w: body is not a JSON object: %v", ErrBadRequest, err)
	}
	r := &Request{Model: b.Model, Session: header(HeaderSession), Priority: parsePriority(header(HeaderPriority))}
	if r.Session == "" {
		r.Session = b.PreviousResponseID
	}
	var err error
	switch {
	case present(b.Messages):
		r.Prompt, err = chatPrompt(data, b.Messages)
	case present(b.Prompt):
		r.Prompt, r.Tokens, err = completionPrompt(b.Prompt)
	case present(b.Input):
		r.Prompt, err = responsesPrompt(b.Instructions, b.Input)
	default:
		return nil, fmt.Errorf("%w: the body has no prompt, messages or input", ErrBadRequest)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	return r, nil
}

func present(raw json.RawMessage) bool {
	return len(raw) > 0 && !bytes.Equal(raw, []byte("null"))
}

func parsePriority(v string) picker.Priority {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "background", "batch":
		return picker.Background
	}
	return picker.Interactive
}

// completionPrompt reads a completions prompt: a string, an array of
// token ids, or a batch of either (the first one counts).
func completionPrompt(raw json.RawMessage) (*kvindexv1.Prompt, []uint64, error) {
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return client.TextPrompt(text), nil, nil
	}
	var ids []uint64
	if json.Unmarshal(raw, &ids) == nil {
		if len(ids) == 0 {
			return nil, nil, errors.New("prompt is an empty array")
		}
		return client.TokensPrompt(ids), ids, nil
	}
	var batch []json.RawMessage
	if err := json.Unmarshal(raw, &batch); err != nil || len(batch) == 0 {
		return nil, nil, errors.New("prompt must be a string, an array of token ids, or a non-empty batch of them")
	}
	if batch[0][0] == '[' || batch[0][0] == '"' {
		return completionPrompt(batch[0])
	}
	return nil, nil, errors.New("prompt must be a string, an array of token ids, or a non-empty batch of them")
}

// chatPrompt reads a chat conversation and the fields that change its
// rendering. Plain messages (a role and a text content) travel as role
// and content; any other message travels whole, as the engine renders it.
func chatPrompt(data []byte, raw json.RawMessage) (*kvindexv1.Prompt, error) {
	var msgs []json.RawMessage
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return nil, errors.New("messages must be an array of message objects")
	}
	if len(msgs) == 0 {
		return nil, errors.New("messages is empty")
	}
	out := make([]*kvindexv1.ChatMessage, 0, len(msgs))
	for i, m := range msgs {
		cm, err := chatMessage(m)
		if err != nil {
			return nil, fmt.Errorf("messages[%d]: %v", i, err)
		}
		out = append(out, cm)
	}
	params, err := chatParamsJSON(data)
	if err != nil {
		return nil, err
	}
	return client.ChatPrompt(params, out...), nil
}

func chatMessage(raw json.RawMessage) (*kvindexv1.ChatMessage, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, errors.New("not a JSON object")
	}
	var role, content string
	if err := json.Unmarshal(fields["role"], &role); err != nil || role == "" {
		return nil, errors.New("role must be a non-empty string")
	}
	if len(fields) == 2 && json.Unmarshal(fields["content"], &content) == nil {
		return &kvindexv1.ChatMessage{Role: role, Content: content}, nil
	}
	return client.MessageJSON(string(raw)), nil
}

// chatParamsJSON collects the rendering fields of a chat request into one
// JSON object, values verbatim (the template renders them key by key).
func chatParamsJSON(data []byte) (string, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return "", err
	}
	var b strings.Builder
	for _, k := range chatParams {
		v, ok := top[k]
		if !ok || !present(v) {
			continue
		}
		if b.Len() == 0 {
			b.WriteByte('{')
		} else {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%q:", k)
		b.Write(v)
	}
	if b.Len() == 0 {
		return "", nil
	}
	b.WriteByte('}')
	return b.String(), nil
}

// responsesPrompt turns a Responses API input into chat messages: a
// string is one user message; items of type "message" (or with a role)
// are messages whose text parts are joined; instructions come first, as
// a system message.
func responsesPrompt(instructions string, raw json.RawMessage) (*kvindexv1.Prompt, error) {
	var msgs []*kvindexv1.ChatMessage
	if instructions != "" {
		msgs = append(msgs, &kvindexv1.ChatMessage{Role: "system", Content: instructions})
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return client.MessagesPrompt(append(msgs, &kvindexv1.ChatMessage{Role: "user", Content: text})...), nil
	}
	var items []struct {
		Type    string          `json:"type"`
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, errors.New("input must be a string or an array of input items")
	}
	for i, it := range items {
		if it.Role == "" || (it.Type != "" && it.Type != "message") {
			continue
		}
		c, err := partsText(it.Content)
		if err != nil {
			return nil, fmt.Errorf("input[%d].content: %v", i, err)
		}
		msgs = append(msgs, &kvindexv1.ChatMessage{Role: it.Role, Content: c})
	}
	if len(msgs) == 0 {
		return nil, errors.New("input has no message items")
	}
	return client.MessagesPrompt(msgs...), nil
}

// partsText reads a Responses API content: a string, or parts whose text
// (input_text, output_text, text) is joined.
func partsText(raw json.RawMessage) (string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("must be a string or an array of content parts")
	}
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String(), nil
}
