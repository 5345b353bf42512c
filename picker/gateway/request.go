package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/internal/jsonids"
	"github.com/kvindex/kvindex/internal/jsonstr"
	"github.com/kvindex/kvindex/picker"
	"github.com/zeebo/xxh3"
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
	// PickNamespace is the dynamic metadata namespace of what the picker
	// says about its pick beyond the destination: IndexSeqKey, the index
	// sequence of the index answer it scored (picker.Decision.IndexSeq),
	// in decimal (a string: metadata numbers are doubles, exact only to
	// 2^53).
	PickNamespace = "kvindex.picker"
	IndexSeqKey   = "index_seq"
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
	// tokenizes the last two, unless the picker does: Config.Tokenizer).
	// Nil for a request without a prompt.
	Prompt *kvindexv1.Prompt
	// Tokens are the caller's token ids, when it sent ids (or the
	// picker's tokenizer's, once Pick has tokenized the prompt).
	Tokens   []uint64
	Session  string
	Priority picker.Priority
	// pooledIDs: Tokens are a buffer of the picker's tokenizer, recycled
	// by Service.release unless idsSent (the ids prompt went to the
	// index, which may keep them).
	pooledIDs, idsSent bool
	// cpu is the CPU slot the request was read in (Service.enterCPU),
	// given back before its index query; nil: pick takes one.
	cpu *cpuTurn
	// BodyHash is a hash of the whole body: the scorer's tie-break input
	// (picker.Request.TieBreak), so that exact ties are broken the same
	// way for the same request by every replica of the picker.
	BodyHash uint64
}

// chatParams are the chat request fields that change how the engine
// renders the conversation (kvindexv1.ChatMessages.chat_params_json).
var chatParams = [...]string{"tools", "chat_template", "chat_template_kwargs", "add_generation_prompt",
	"continue_final_message", "add_special_tokens", "mm_processor_kwargs", "media_io_kwargs", "documents", "reasoning_effort"}

// body is the union of the fields the three APIs use. Raw values alias
// the request body: they are read before ParseRequest returns.
type body struct {
	Model              string          `json:"model"`
	Prompt             json.RawMessage `json:"prompt"`   // /v1/completions
	Messages           json.RawMessage `json:"messages"` // /v1/chat/completions
	Input              json.RawMessage `json:"input"`    // Responses API
	Instructions       string          `json:"instructions"`
	PreviousResponseID string          `json:"previous_response_id"`

	// params are the chatParams' values, by chatParams' index.
	params [len(chatParams)]json.RawMessage
	// ids are the prompt's token ids when scanBody read the prompt as an
	// array of ids (idsRead).
	ids     []uint64
	idsRead bool
	// chat are the messages when scanBody read them (chatRead).
	chat     []*kvindexv1.ChatMessage
	chatRead bool
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
// Token ids must be JSON integers that fit in 64 bits: a null id is
// refused, not read as 0.
//
// The body is read in one pass (scanBody) when it is a plain JSON
// object; anything that pass is unsure of goes to encoding/json
// (decodeBody), which reads the same fields the same way.
func ParseRequest(data []byte, header func(string) string) (*Request, error) {
	return parseRequest(data, header, true)
}

// parseRequest is ParseRequest, with scanBody's pass or (scan false, as
// the fuzz test's reference) encoding/json alone.
func parseRequest(data []byte, header func(string) string, scan bool) (*Request, error) {
	var b *body
	ok := false
	if scan {
		b, ok = scanBody(data)
	}
	if !ok {
		var err error
		if b, err = decodeBody(data); err != nil {
			return nil, err
		}
	}
	r := &Request{Model: b.Model, Session: header(HeaderSession), Priority: parsePriority(header(HeaderPriority)), BodyHash: xxh3.Hash(data)}
	if r.Session == "" {
		r.Session = b.PreviousResponseID
	}
	var err error
	switch {
	case present(b.Messages):
		r.Prompt, err = chatPrompt(b)
	case present(b.Prompt):
		if b.idsRead {
			r.Prompt, r.Tokens, err = idsPrompt(b.ids)
		} else {
			r.Prompt, r.Tokens, err = completionPrompt(b.Prompt)
		}
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

// decodeBody reads the body with encoding/json: the reference scanBody
// agrees with, and the reader of what scanBody leaves to it (escaped or
// case-folded keys, repeated fields, deep nesting, bad JSON).
func decodeBody(data []byte) (*body, error) {
	b := new(body)
	if err := json.Unmarshal(data, b); err != nil {
		return nil, fmt.Errorf("%w: body is not a JSON object: %v", ErrBadRequest, err)
	}
	if !present(b.Messages) {
		return b, nil
	}
	// The chat rendering fields are matched by exact name, as the engine
	// matches them.
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, fmt.Errorf("%w: body is not a JSON object: %v", ErrBadRequest, err)
	}
	for k, name := range chatParams {
		b.params[k] = top[name]
	}
	return b, nil
}

// The top-level fields scanBody reads, by their JSON names.
var bodyFields = []string{"model", "prompt", "messages", "input", "instructions", "previous_response_id"}

// maxScanDepth bounds the nesting scanBody skips; deeper bodies go to
// encoding/json, whose own limit (10,000) they may reach.
const maxScanDepth = 512

// scanBody reads the body in one pass: each top-level value is
// delimited, validated (json.Valid) and kept as a slice of data; the
// prompt, when it is an array of ids, is decoded by jsonids.Parse as it
// is delimited, which validates it too, and so are the messages, read by
// scanMessages. A 16k-id prompt is so read once,
// with one allocation for the ids, where encoding/json scanned it five
// times (the body's validation, delimiting the RawMessage, a failed
// string decode, and the []uint64 decode's validation and decoding).
// BenchmarkPickerParse measures the difference (README, Performance).
//
// It returns false, for decodeBody to read the body, on anything it
// does not read exactly as encoding/json would: a key with an escape or
// a non-ASCII byte, a key that matches a field only case-insensitively
// (encoding/json matches those), a repeated field, nesting deeper than
// maxScanDepth, a string field that does not decode, or invalid JSON.
func scanBody(data []byte) (*body, bool) {
	b := new(body)
	var seen [6]bool
	i := jsonids.SkipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return nil, false
	}
	i = jsonids.SkipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return b, jsonids.SkipSpace(data, i+1) == len(data)
	}
	for {
		if i >= len(data) || data[i] != '"' {
			return nil, false
		}
		j := i + 1
		for j < len(data) && data[j] != '"' {
			if c := data[j]; c == '\\' || c < 0x20 || c >= 0x80 {
				return nil, false
			}
			j++
		}
		if j >= len(data) {
			return nil, false
		}
		key := string(data[i+1 : j])
		i = jsonids.SkipSpace(data, j+1)
		if i >= len(data) || data[i] != ':' {
			return nil, false
		}
		i = jsonids.SkipSpace(data, i+1)
		field := -1
		for k, name := range bodyFields {
			if key == name {
				field = k
			} else if strings.EqualFold(key, name) {
				return nil, false
			}
		}
		if field >= 0 {
			if seen[field] {
				return nil, false
			}
			seen[field] = true
		}
		if field == 1 && i < len(data) && data[i] == '[' {
			// Sized by the commas left in the body: one allocation, at most
			// a little too large when other fields follow the prompt.
			ids := make([]uint64, 0, bytes.Count(data[i:], []byte{','})+1)
			if ids, end, err := jsonids.Parse(ids, data, i, "prompt"); err == nil {
				b.Prompt, b.ids, b.idsRead = data[i:end], ids, true
				i = end
				goto next
			}
		}
		if field == 2 && i < len(data) && data[i] == '[' {
			if chat, end, ok := scanMessages(data, i); ok {
				b.Messages, b.chat, b.chatRead = data[i:end], chat, true
				i = end
				goto next
			}
		}
		{
			end, ok := skipValue(data, i)
			if !ok {
				return nil, false
			}
			v := data[i:end]
			i = end
			if s := b.stringField(field); s != nil {
				if json.Unmarshal(v, s) != nil {
					return nil, false
				}
				goto next
			}
			if !json.Valid(v) {
				return nil, false
			}
			switch field {
			case 1:
				b.Prompt = v
			case 2:
				b.Messages = v
			case 3:
				b.Input = v
			case -1:
				for k, name := range chatParams {
					if key == name {
						b.params[k] = v
					}
				}
			}
		}
	next:
		i = jsonids.SkipSpace(data, i)
		if i >= len(data) {
			return nil, false
		}
		switch data[i] {
		case ',':
			i = jsonids.SkipSpace(data, i+1)
		case '}':
			return b, jsonids.SkipSpace(data, i+1) == len(data)
		default:
			return nil, false
		}
	}
}

// stringField is the string of bodyFields[k], nil for the others.
func (b *body) stringField(k int) *string {
	switch k {
	case 0:
		return &b.Model
	case 4:
		return &b.Instructions
	case 5:
		return &b.PreviousResponseID
	}
	return nil
}

// skipValue returns the index just after the JSON value at data[i:],
// found by its brackets and strings alone: the caller validates it.
func skipValue(data []byte, i int) (int, bool) {
	depth := 0
	for j := i; j < len(data); j++ {
		switch data[j] {
		case '"':
			for j++; j < len(data) && data[j] != '"'; j++ {
				if data[j] == '\\' {
					j++
				}
			}
			if j >= len(data) {
				return 0, false
			}
		case '{', '[':
			if depth++; depth > maxScanDepth {
				return 0, false
			}
			continue
		case '}', ']':
			if depth--; depth < 0 {
				return j, j > i
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return j, j > i
			}
			continue
		default:
			continue
		}
		if depth == 0 {
			return j + 1, true
		}
	}
	if depth == 0 && len(data) > i {
		return len(data), true
	}
	return 0, false
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
	if ids, end, err := jsonids.Parse(nil, raw, 0, "prompt"); err == nil && jsonids.SkipSpace(raw, end) == len(raw) {
		return idsPrompt(ids)
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

func idsPrompt(ids []uint64) (*kvindexv1.Prompt, []uint64, error) {
	if len(ids) == 0 {
		return nil, nil, errors.New("prompt is an empty array")
	}
	return client.TokensPrompt(ids), ids, nil
}

// chatPrompt reads a chat conversation and the fields that change its
// rendering. Plain messages (a role and a text content) travel as role
// and content; any other message travels whole, as the engine renders it.
func chatPrompt(b *body) (*kvindexv1.Prompt, error) {
	if b.chatRead && len(b.chat) > 0 {
		return client.ChatPrompt(chatParamsJSON(b), b.chat...), nil
	}
	var msgs []json.RawMessage
	if err := json.Unmarshal(b.Messages, &msgs); err != nil {
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
	return client.ChatPrompt(chatParamsJSON(b), out...), nil
}

// scanMessages reads and validates the messages array at data[i] in one
// pass, as chatPrompt's encoding/json path reads it, and returns the
// index past it: a message whose only fields are a role and a string
// content becomes role and content, any other goes to chatMessage. A
// chat turn's body is nearly all such messages, which encoding/json
// scanned four times (the body's validation, the array, each message's
// object, each string): BenchmarkPickerChatTurn. ok is false, for
// scanBody's general path and chatPrompt's encoding/json path to read
// the array and name the error, on anything unexpected.
func scanMessages(data []byte, i int) (_ []*kvindexv1.ChatMessage, end int, ok bool) {
	out := []*kvindexv1.ChatMessage{}
	if i = jsonids.SkipSpace(data, i+1); i < len(data) && data[i] == ']' {
		return out, i + 1, true
	}
	for i < len(data) {
		cm, end, ok := plainMessage(data, i)
		if !ok {
			if end, ok = skipValue(data, i); !ok {
				return nil, 0, false
			}
			var err error
			if cm, err = chatMessage(data[i:end]); err != nil { // validated by json.Unmarshal
				return nil, 0, false
			}
		}
		out = append(out, cm)
		if i = jsonids.SkipSpace(data, end); i >= len(data) {
			break
		}
		switch data[i] {
		case ',':
			i = jsonids.SkipSpace(data, i+1)
		case ']':
			return out, i + 1, true
		default:
			return nil, 0, false
		}
	}
	return nil, 0, false
}

// plainMessage reads the JSON object at raw[i] when its only fields are
// "role" and "content", each a string, the role not empty, and returns
// the index past it; ok is false for any other object, and for anything
// that is not valid JSON.
func plainMessage(raw []byte, i int) (_ *kvindexv1.ChatMessage, end int, ok bool) {
	if i >= len(raw) || raw[i] != '{' {
		return nil, 0, false
	}
	var role, content string
	var seen [2]bool
	for i = jsonids.SkipSpace(raw, i+1); ; {
		if i >= len(raw) || raw[i] != '"' {
			return nil, 0, false
		}
		key, end, ok := plainString(raw, i)
		if !ok {
			return nil, 0, false
		}
		if i = jsonids.SkipSpace(raw, end); i >= len(raw) || raw[i] != ':' {
			return nil, 0, false
		}
		if i = jsonids.SkipSpace(raw, i+1); i >= len(raw) || raw[i] != '"' {
			return nil, 0, false
		}
		v, end, ok := plainString(raw, i)
		if !ok {
			return nil, 0, false
		}
		k := 0
		switch key {
		case "role":
			role = v
		case "content":
			k, content = 1, v
		default:
			return nil, 0, false
		}
		if seen[k] {
			return nil, 0, false // a repeated field: encoding/json's path knows which wins
		}
		seen[k] = true
		if i = jsonids.SkipSpace(raw, end); i >= len(raw) {
			return nil, 0, false
		}
		if raw[i] == '}' {
			break
		}
		if raw[i] != ',' {
			return nil, 0, false
		}
		i = jsonids.SkipSpace(raw, i+1)
	}
	if !seen[0] || !seen[1] || role == "" {
		return nil, 0, false
	}
	return &kvindexv1.ChatMessage{Role: role, Content: content}, i + 1, true
}

// plainString decodes the JSON string starting at raw[i] (a quote) and
// returns the index past it; ok is false when it is not valid JSON.
func plainString(raw []byte, i int) (string, int, bool) {
	s, end, ok := jsonstr.String(raw, i+1)
	return s, end + 1, ok
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
func chatParamsJSON(b *body) string {
	var sb strings.Builder
	for k, v := range b.params {
		if !present(v) {
			continue
		}
		if sb.Len() == 0 {
			sb.WriteByte('{')
		} else {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, "%q:", chatParams[k])
		sb.Write(v)
	}
	if sb.Len() == 0 {
		return ""
	}
	sb.WriteByte('}')
	return sb.String()
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
