package chattemplate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// Errors, for errors.Is. Every error Parse, Load and Render return wraps
// exactly one of them.
var (
	// ErrTemplate: the template source does not compile, or a
	// tokenizer_config.json carries no usable chat_template.
	ErrTemplate = errors.New("chat template")
	// ErrInput: the request is not what a template can be given (messages
	// not a JSON array, kwargs not a JSON object, ...).
	ErrInput = errors.New("chat template input")
	// ErrRender: the template failed while rendering, most often through
	// its own raise_exception (for example "roles must alternate").
	ErrRender = errors.New("chat template render")
)

// DefaultName is the entry picked from a tokenizer_config.json whose
// chat_template is a list of {name, template}: the one transformers
// applies when the caller names none.
const DefaultName = "default"

// SpecialTokenKeys are the tokenizer_config.json fields passed to the
// template as variables of the same name, as transformers'
// apply_chat_template passes its special_tokens_map.
var SpecialTokenKeys = []string{"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}

// Template is a compiled chat template and the special tokens of its
// tokenizer. It is safe for concurrent use.
type Template struct {
	source string
	tokens map[string]string
	tmpl   *jinja.Template
}

// Parse compiles source with the given special tokens (bos_token and the
// like; nil for none).
func Parse(source string, tokens map[string]string) (t *Template, err error) {
	defer func() {
		if r := recover(); r != nil {
			t, err = nil, fmt.Errorf("%w: does not compile: %v", ErrTemplate, r)
		}
	}()
	tmpl, err := jinja.Compile(rewrite(source))
	if err != nil {
		return nil, fmt.Errorf("%w: does not compile: %v", ErrTemplate, err)
	}
	tok := make(map[string]string, len(tokens))
	for k, v := range tokens {
		tok[k] = v
	}
	return &Template{source: source, tokens: tok, tmpl: tmpl}, nil
}

// Source returns the template's Jinja source.
func (t *Template) Source() string { return t.source }

// Tokens returns a copy of the special tokens the template is rendered
// with.
func (t *Template) Tokens() map[string]string {
	out := make(map[string]string, len(t.tokens))
	for k, v := range t.tokens {
		out[k] = v
	}
	return out
}

// Load reads a chat template from path: a tokenizer_config.json (any file
// whose content is a JSON object) carrying chat_template and the special
// tokens, or a plain Jinja file (chat_template.jinja), which has no special
// tokens of its own: they are read from the tokenizer_config.json beside
// it, as transformers lays a model's files out, when there is one. tokens,
// which may be nil, supplies those neither file has.
func Load(path string, tokens map[string]string) (*Template, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTemplate, err)
	}
	if trimmed := bytes.TrimLeft(raw, " \t\r\n"); len(trimmed) > 0 && trimmed[0] == '{' && !strings.EqualFold(filepath.Ext(path), ".jinja") {
		t, err := ParseConfig(raw, tokens)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return t, nil
	}
	tok := make(map[string]string, len(tokens))
	for k, v := range tokens {
		tok[k] = v
	}
	beside := filepath.Join(filepath.Dir(path), "tokenizer_config.json")
	if cfg, err := os.ReadFile(beside); err == nil {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(cfg, &fields); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrTemplate, beside, err)
		}
		for _, k := range SpecialTokenKeys {
			if v, ok := configToken(fields[k]); ok {
				tok[k] = v
			}
		}
	}
	t, err := Parse(string(raw), tok)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// ParseConfig compiles the chat_template of a tokenizer_config.json.
// chat_template is either a string or a list of {name, template}, from
// which the entry named DefaultName is taken. Special tokens are read
// from the config, as strings or as AddedToken objects ({"content": ...});
// tokens fills in those the config lacks.
func ParseConfig(raw []byte, tokens map[string]string) (*Template, error) {
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return nil, fmt.Errorf("%w: tokenizer_config.json: %v", ErrTemplate, err)
	}
	source, err := configTemplate(cfg["chat_template"])
	if err != nil {
		return nil, err
	}
	tok := make(map[string]string, len(SpecialTokenKeys))
	for k, v := range tokens {
		tok[k] = v
	}
	for _, k := range SpecialTokenKeys {
		if v, ok := configToken(cfg[k]); ok {
			tok[k] = v
		}
	}
	return Parse(source, tok)
}

func configTemplate(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", fmt.Errorf("%w: tokenizer_config.json has no chat_template", ErrTemplate)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", fmt.Errorf("%w: chat_template is neither a string nor a list of {name, template}", ErrTemplate)
	}
	names := make([]string, 0, len(named))
	for _, n := range named {
		if n.Name == DefaultName {
			return n.Template, nil
		}
		names = append(names, n.Name)
	}
	return "", fmt.Errorf("%w: chat_template has no %q entry (has %s)", ErrTemplate, DefaultName, strings.Join(names, ", "))
}

// configToken reads a special token written as a string or as an
// AddedToken object; null or absent is no token.
func configToken(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 {
		return "", false
	}
	var s *string
	if err := json.Unmarshal(raw, &s); err == nil {
		return deref(s)
	}
	var added struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &added); err == nil {
		return deref(added.Content)
	}
	return "", false
}

func deref(s *string) (string, bool) {
	if s == nil {
		return "", false
	}
	return *s, true
}

// Request is what a chat request hands the template. JSON fields are kept
// raw and decoded with their key order intact: templates print tool
// schemas and tool-call arguments key by key, so an order lost on the way
// would change the prompt.
type Request struct {
	// Messages is the JSON array of chat messages: role, content (a
	// string, null, or a list of parts such as {"type": "text", "text":
	// ...}), tool_calls, tool_call_id, name, reasoning_content...: each
	// message is given to the template as it is.
	Messages json.RawMessage
	// MessageList, when not nil, is taken instead of Messages (which must
	// then be empty): the same messages, one by one, each either plain
	// (role and content strings) or raw JSON. It spares a caller holding
	// plain messages writing them as JSON only for Render to decode them
	// back, a cost that grows with the whole conversation.
	MessageList []Message
	// Tools is the JSON array of tool definitions, or empty for none
	// (then the template sees tools = none, as transformers passes it).
	Tools json.RawMessage
	// AddGenerationPrompt asks the template to open the assistant's turn.
	AddGenerationPrompt bool
	// DecodeToolArguments turns each tool call's function.arguments
	// written as a JSON string (as OpenAI clients send it) into the JSON
	// value it holds, as vLLM does before rendering with a HuggingFace
	// tokenizer: templates print arguments with tojson, or test whether
	// they are a string. Arguments that are not valid JSON are an
	// ErrInput error, as they are for vLLM.
	DecodeToolArguments bool
	// Kwargs is a JSON object of extra template variables
	// (chat_template_kwargs, such as enable_thinking); it may override
	// the special tokens but not messages, tools or add_generation_prompt.
	Kwargs json.RawMessage
}

// Message is one message of Request.MessageList.
type Message struct {
	// Role and Content make the message {"role": Role, "content":
	// Content} when Raw is nil. Bytes that are not UTF-8 become U+FFFD,
	// one per byte, as they would in the message written as JSON.
	Role, Content string
	// Raw, when not nil, is the whole message as a JSON value (an object
	// such as those of Request.Messages), given to the template as it is;
	// Role and Content are then ignored.
	Raw json.RawMessage
}

// reserved are the variables Request sets itself.
var reserved = map[string]bool{"messages": true, "tools": true, "add_generation_prompt": true}

// Render renders the request's prompt text. It never panics: a failure
// of the engine on odd input is returned as an ErrRender error.
func (t *Template) Render(r Request) (out string, err error) {
	data, err := t.variables(r)
	if err != nil {
		return "", err
	}
	defer func() {
		if p := recover(); p != nil {
			out, err = "", fmt.Errorf("%w: engine failed: %v", ErrRender, p)
		}
	}()
	out, err = t.tmpl.RenderValues(data)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrRender, err)
	}
	return out, nil
}

func (t *Template) variables(r Request) (map[string]jinja.Value, error) {
	data := make(map[string]jinja.Value, len(t.tokens)+len(globals)+5)
	for k, v := range globals {
		data[k] = v
	}
	data[macroGuardName] = macroGuard()
	for k, v := range t.tokens {
		data[k] = jinja.NewString(v)
	}
	if len(bytes.TrimSpace(r.Kwargs)) > 0 {
		kw, err := decodeJSON(r.Kwargs)
		if err != nil {
			return nil, fmt.Errorf("%w: kwargs: %v", ErrInput, err)
		}
		if kw.IsNone() {
			kw = jinja.NewDict()
		}
		if !kw.IsDict() {
			return nil, fmt.Errorf("%w: kwargs must be a JSON object", ErrInput)
		}
		d := kw.AsDict()
		for _, k := range d.OrderedKeys() {
			if reserved[k] {
				return nil, fmt.Errorf("%w: kwargs may not set %q", ErrInput, k)
			}
			data[k], _ = d.Get(k)
		}
	}
	msgs, err := messages(r)
	if err != nil {
		return nil, err
	}
	if r.DecodeToolArguments {
		if err := decodeToolArguments(msgs); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInput, err)
		}
	}
	data["messages"] = msgs
	tools := jinja.None()
	if len(bytes.TrimSpace(r.Tools)) > 0 {
		if tools, err = decodeJSON(r.Tools); err != nil {
			return nil, fmt.Errorf("%w: tools: %v", ErrInput, err)
		}
		if !tools.IsList() && !tools.IsNone() {
			return nil, fmt.Errorf("%w: tools must be a JSON array or null", ErrInput)
		}
	}
	data["tools"] = tools
	data["add_generation_prompt"] = jinja.NewBool(r.AddGenerationPrompt)
	return data, nil
}

// messages returns the request's messages as a template list.
func messages(r Request) (jinja.Value, error) {
	if r.MessageList == nil {
		msgs, err := decodeJSON(r.Messages)
		if err != nil {
			return jinja.Value{}, fmt.Errorf("%w: messages: %v", ErrInput, err)
		}
		if !msgs.IsList() {
			return jinja.Value{}, fmt.Errorf("%w: messages must be a JSON array", ErrInput)
		}
		return msgs, nil
	}
	if len(bytes.TrimSpace(r.Messages)) > 0 {
		return jinja.Value{}, fmt.Errorf("%w: both Messages and MessageList are set", ErrInput)
	}
	items := make([]jinja.Value, len(r.MessageList))
	for i, m := range r.MessageList {
		if m.Raw == nil {
			items[i] = plainMessage(m.Role, m.Content)
			continue
		}
		// Depth 1: the message sits in the list, as it does in Messages.
		v, err := decodeJSONAt(m.Raw, 1)
		if err != nil {
			return jinja.Value{}, fmt.Errorf("%w: messages: message %d: %v", ErrInput, i, err)
		}
		items[i] = v
	}
	return jinja.NewList(items), nil
}

// plainMessage is the template value of {"role": role, "content": content}.
func plainMessage(role, content string) jinja.Value {
	v := jinja.NewDict()
	d := v.AsDict()
	d.Keys = make([]string, 0, 2)
	d.Set("role", jinja.NewString(asJSONString(role)))
	d.Set("content", jinja.NewString(asJSONString(content)))
	return v
}

// asJSONString returns s as it reads after a trip through JSON: each byte
// that is not part of a UTF-8 sequence replaced by U+FFFD.
func asJSONString(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// decodeToolArguments replaces, in every message's tool_calls, a string
// function.arguments by the JSON value it holds.
func decodeToolArguments(msgs jinja.Value) error {
	for i, m := range msgs.AsList().Items {
		if !m.IsDict() {
			continue
		}
		calls, ok := m.AsDict().Get("tool_calls")
		if !ok || !calls.IsList() {
			continue
		}
		for j, c := range calls.AsList().Items {
			if !c.IsDict() {
				continue
			}
			fn, ok := c.AsDict().Get("function")
			if !ok || !fn.IsDict() {
				continue
			}
			args, ok := fn.AsDict().Get("arguments")
			if !ok || !args.IsString() {
				continue
			}
			v, err := decodeJSON([]byte(args.AsString()))
			if err != nil {
				return fmt.Errorf("message %d, tool call %d: arguments are not JSON: %v", i, j, err)
			}
			fn.AsDict().Set("arguments", v)
		}
	}
	return nil
}
