package simhttp

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/tokenizer"
)

// completionRequest is the part of an OpenAI completion request the
// simulated engine reads; other fields are ignored.
type completionRequest struct {
	Model            string          `json:"model"`
	Prompt           json.RawMessage `json:"prompt"`
	MaxTokens        *int            `json:"max_tokens"`
	N                *int            `json:"n"`
	Stream           bool            `json:"stream"`
	StreamOptions    *streamOptions  `json:"stream_options"`
	CacheSalt        *string         `json:"cache_salt"`
	AddSpecialTokens *bool           `json:"add_special_tokens"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// chatRequest is the part of an OpenAI chat request the simulated engine
// reads, and of the chat form of vLLM's /tokenize.
type chatRequest struct {
	Model                string          `json:"model"`
	Messages             []chatMessage   `json:"messages"`
	MaxTokens            *int            `json:"max_tokens"`
	MaxCompletionTokens  *int            `json:"max_completion_tokens"`
	N                    *int            `json:"n"`
	Stream               bool            `json:"stream"`
	StreamOptions        *streamOptions  `json:"stream_options"`
	CacheSalt            *string         `json:"cache_salt"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	AddSpecialTokens     *bool           `json:"add_special_tokens"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	Tools                json.RawMessage `json:"tools"`
	ChatTemplate         json.RawMessage `json:"chat_template"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// tokenizeRequest is vLLM's /tokenize request, both forms.
type tokenizeRequest struct {
	chatRequest
	Prompt *string `json:"prompt"`
}

// badRequest is an error the client caused: a 4xx with its message.
type badRequest struct {
	code int
	msg  string
}

func (e *badRequest) Error() string { return e.msg }

func bad(format string, args ...any) error {
	return &badRequest{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

// decode reads a JSON request body of at most MaxBodyBytes into v.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return &badRequest{http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", s.cfg.MaxBodyBytes)}
		}
		return bad("reading the request body: %v", err)
	}
	if t := bytes.TrimSpace(body); len(t) == 0 || t[0] != '{' {
		return bad("the request body must be a JSON object")
	}
	if err := json.Unmarshal(body, v); err != nil {
		msg := strings.TrimPrefix(err.Error(), "json: ")
		if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
			msg = fmt.Sprintf("field %s: want %s, not a JSON %s", te.Field, jsonType(te.Type.String()), te.Value)
		}
		return bad("malformed request: %s", msg)
	}
	return nil
}

// jsonType names a Go type of these requests as JSON.
func jsonType(t string) string {
	switch {
	case strings.HasPrefix(t, "[]"):
		return "an array"
	case t == "string" || t == "*string":
		return "a string"
	case t == "bool" || t == "*bool":
		return "a boolean"
	case strings.Contains(t, "int"):
		return "an integer"
	}
	return "an object"
}

// checkModel refuses a request for another model, with vLLM's message.
func (s *Server) checkModel(m string) error {
	if m != "" && m != s.cfg.Model {
		return &badRequest{http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist. This engine serves %s.", m, s.cfg.Model)}
	}
	return nil
}

// completion is the fake completion's length and finish reason, and how
// it is sent.
type completion struct {
	tokens int
	finish string
	stream bool // as server-sent events
	usage  bool // streamed: a last chunk carries the usage
}

// common checks the fields both inference endpoints share and returns the
// completion to make and the prompt's hash extras.
func (s *Server) common(model string, n *int, stream bool, so *streamOptions, maxTokens *int, salt *string) (completion, *blockhash.Extras, error) {
	c := completion{tokens: fakeTokens, finish: "stop", stream: stream, usage: so != nil && so.IncludeUsage}
	if err := s.checkModel(model); err != nil {
		return c, nil, err
	}
	if n != nil && *n != 1 {
		return c, nil, bad("n = %d: the simulated engine returns one choice", *n)
	}
	if so != nil && !stream {
		return c, nil, bad("stream_options can only be given with stream true")
	}
	if maxTokens != nil {
		if *maxTokens < 1 {
			return c, nil, bad("max_tokens must be at least 1, got %d", *maxTokens)
		}
		if *maxTokens <= fakeTokens {
			c.tokens, c.finish = *maxTokens, "length"
		}
	}
	var x *blockhash.Extras
	if salt != nil {
		if *salt == "" {
			return c, nil, bad("cache_salt must be a non-empty string when given")
		}
		x = &blockhash.Extras{CacheSalt: *salt}
	}
	return c, x, nil
}

// promptIDs returns a completion prompt's token ids.
func (s *Server) promptIDs(r *http.Request, prompt json.RawMessage, special *bool) ([]uint64, error) {
	p := bytes.TrimSpace(prompt)
	switch {
	case len(p) == 0 || string(p) == "null":
		return nil, bad("prompt is required: a string, or an array of token ids")
	case p[0] == '"':
		var text string
		if err := json.Unmarshal(p, &text); err != nil {
			return nil, bad("prompt: %v", err)
		}
		return s.encode(r, text, special == nil || *special)
	case p[0] != '[':
		return nil, bad("prompt must be a string or an array of token ids")
	}
	var items []json.RawMessage
	if err := json.Unmarshal(p, &items); err != nil {
		return nil, bad("prompt: %v", err)
	}
	ids := make([]uint64, len(items))
	for i, it := range items {
		if len(it) > 0 && (it[0] == '"' || it[0] == '[') {
			return nil, bad("prompt: one prompt per request (a string or an array of token ids), not a batch")
		}
		id, err := strconv.ParseUint(string(it), 10, 32)
		if err != nil {
			return nil, bad("prompt: token %d is %s; token ids are integers from 0 to %d", i, it, uint32(1<<32-1))
		}
		ids[i] = id
	}
	return ids, nil
}

// encode tokenizes text.
func (s *Server) encode(r *http.Request, text string, special bool) ([]uint64, error) {
	if s.cfg.Tokenizer == nil {
		return nil, bad("this engine has no tokenizer: send the prompt as an array of token ids")
	}
	ids, err := s.cfg.Tokenizer.Tokenize(r.Context(), s.cfg.Model, tokenizer.Input{Prompt: text, AddSpecialTokens: &special})
	if err != nil {
		return nil, bad("tokenizing: %v", err)
	}
	return ids, nil
}

// render renders chat messages as ChatML; see the package documentation.
func (c *chatRequest) render() (string, error) {
	switch {
	case len(c.Messages) == 0:
		return "", bad("messages is required: a non-empty array of {\"role\":...,\"content\":...}")
	case len(bytes.TrimSpace(c.Tools)) > 0 && string(bytes.TrimSpace(c.Tools)) != "null" && string(bytes.TrimSpace(c.Tools)) != "[]":
		return "", bad("tools: the simulated engine renders plain ChatML, without tools")
	case len(c.ChatTemplate) > 0 && string(c.ChatTemplate) != "null":
		return "", bad("chat_template: the simulated engine renders plain ChatML only")
	case c.ContinueFinalMessage:
		return "", bad("continue_final_message: not simulated")
	}
	var b strings.Builder
	for i, m := range c.Messages {
		if m.Role == "" {
			return "", bad("messages[%d]: role is required", i)
		}
		text, err := contentText(m.Content)
		if err != nil {
			return "", bad("messages[%d]: %v", i, err)
		}
		b.WriteString("<|im_start|>" + m.Role + "\n" + text + "<|im_end|>\n")
	}
	if c.AddGenerationPrompt == nil || *c.AddGenerationPrompt {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String(), nil
}

// contentText returns a message's content as text: a string, null (none),
// or text parts joined by newlines.
func contentText(raw json.RawMessage) (string, error) {
	c := bytes.TrimSpace(raw)
	if len(c) == 0 || string(c) == "null" {
		return "", nil
	}
	if c[0] == '"' {
		var s string
		err := json.Unmarshal(c, &s)
		return s, err
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if c[0] != '[' || json.Unmarshal(c, &parts) != nil {
		return "", errors.New("content must be a string, null or an array of text parts")
	}
	texts := make([]string, len(parts))
	for i, p := range parts {
		if p.Type != "text" || p.Text == nil {
			return "", fmt.Errorf("content part %d is of type %q: only text parts are simulated", i, p.Type)
		}
		texts[i] = *p.Text
	}
	return strings.Join(texts, "\n"), nil
}

// chatIDs renders and tokenizes a chat request.
func (s *Server) chatIDs(r *http.Request, c *chatRequest) ([]uint64, error) {
	text, err := c.render()
	if err != nil {
		return nil, err
	}
	// The template writes the special tokens; none are added, as vLLM
	// does for chat unless asked.
	return s.encode(r, text, c.AddSpecialTokens != nil && *c.AddSpecialTokens)
}

// usage is an OpenAI response's usage.
type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// infer runs a prompt and fills in the usage and the fake completion.
func (s *Server) infer(r *http.Request, ids []uint64, x *blockhash.Extras, c completion, obs *Request) (u usage, err error) {
	obs.PromptTokens = len(ids)
	want := c.tokens
	if len(ids) == 0 {
		return u, bad("the prompt is empty")
	}
	if len(ids)+want > s.cfg.MaxModelLen {
		return u, bad("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the prompt, %d in the completion).",
			s.cfg.MaxModelLen, len(ids)+want, len(ids), want)
	}
	rk, i, err := s.pick(r)
	if err != nil {
		return u, &badRequest{http.StatusBadRequest, err.Error()}
	}
	obs.Rank = i
	cached, err := s.run(r.Context(), rk, ids, x)
	if err != nil {
		return u, err
	}
	obs.CachedTokens = cached
	u.PromptTokens, u.CompletionTokens, u.TotalTokens = len(ids), want, len(ids)+want
	u.PromptTokensDetails.CachedTokens = cached
	return u, nil
}

// fakeWords are the simulated completion, fakeTokens words.
var fakeWords = strings.Fields("This is a simulated completion from kvindex sim: the engine decodes nothing, answering with sixteen words.")

// fakeText is the simulated completion of n tokens: n words.
func fakeText(n int) string { return strings.Join(fakeWords[:min(n, len(fakeWords))], " ") }

func (s *Server) completions(w http.ResponseWriter, r *http.Request) int {
	return s.generate(w, r, false, func() (*completionRequest, []uint64, error) {
		var req completionRequest
		if err := s.decode(w, r, &req); err != nil {
			return nil, nil, err
		}
		ids, err := s.promptIDs(r, req.Prompt, req.AddSpecialTokens)
		return &req, ids, err
	})
}

func (s *Server) chatCompletions(w http.ResponseWriter, r *http.Request) int {
	return s.generate(w, r, true, func() (*completionRequest, []uint64, error) {
		var req chatRequest
		if err := s.decode(w, r, &req); err != nil {
			return nil, nil, err
		}
		if req.MaxCompletionTokens != nil {
			req.MaxTokens = req.MaxCompletionTokens
		}
		ids, err := s.chatIDs(r, &req)
		return &completionRequest{Model: req.Model, MaxTokens: req.MaxTokens, N: req.N, Stream: req.Stream,
			StreamOptions: req.StreamOptions, CacheSalt: req.CacheSalt}, ids, err
	})
}

// generate answers an inference request: parse returns its fields (of the
// completion form; for chat, those both forms share) and its prompt's ids.
func (s *Server) generate(w http.ResponseWriter, r *http.Request, chat bool, parse func() (*completionRequest, []uint64, error)) int {
	obs := Request{Path: r.URL.Path, Rank: -1}
	req, ids, err := parse()
	var c completion
	var x *blockhash.Extras
	if req != nil {
		// The request's own mistakes come before its prompt's.
		var cerr error
		c, x, cerr = s.common(req.Model, req.N, req.Stream, req.StreamOptions, req.MaxTokens, req.CacheSalt)
		err = cmp.Or(cerr, err)
	}
	var u usage
	if err == nil {
		u, err = s.infer(r, ids, x, c, &obs)
	}
	if err != nil {
		return s.fail(w, &obs, err)
	}
	if c.stream {
		return s.stream(w, &obs, chat, c, u)
	}
	choice := map[string]any{"index": 0, "text": fakeText(c.tokens), "logprobs": nil, "finish_reason": c.finish, "stop_reason": nil}
	id, object := "cmpl-", "text_completion"
	if chat {
		delete(choice, "text")
		choice["message"] = map[string]any{"role": "assistant", "content": fakeText(c.tokens)}
		id, object = "chatcmpl-", "chat.completion"
	}
	return s.reply(w, &obs, map[string]any{
		"id": id + strconv.FormatUint(s.ids.Add(1), 10), "object": object, "created": time.Now().Unix(), "model": s.cfg.Model,
		"choices": []map[string]any{choice}, "usage": u,
	})
}

// tokenize is vLLM's POST /tokenize: the completion form (prompt) or the
// chat form (messages), tokenized as the inference endpoints do.
func (s *Server) tokenize(w http.ResponseWriter, r *http.Request) int {
	obs := Request{Path: r.URL.Path, Rank: -1}
	var req tokenizeRequest
	err := s.decode(w, r, &req)
	if err == nil {
		err = s.checkModel(req.Model)
	}
	var ids []uint64
	if err == nil {
		switch {
		case req.Prompt != nil && len(req.Messages) > 0:
			err = bad("give prompt or messages, not both")
		case req.Prompt != nil:
			ids, err = s.encode(r, *req.Prompt, req.AddSpecialTokens == nil || *req.AddSpecialTokens)
		default:
			ids, err = s.chatIDs(r, &req.chatRequest)
		}
	}
	if err != nil {
		return s.fail(w, &obs, err)
	}
	obs.PromptTokens = len(ids)
	return s.reply(w, &obs, map[string]any{"count": len(ids), "max_model_len": s.cfg.MaxModelLen, "tokens": ids, "token_strs": nil})
}

func (s *Server) models(w http.ResponseWriter, _ *http.Request) int {
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []map[string]any{{
		"id": s.cfg.Model, "object": "model", "created": s.start, "owned_by": "vllm", "root": s.cfg.Model, "parent": nil,
		"max_model_len": s.cfg.MaxModelLen,
	}}})
	return http.StatusOK
}

// stream sends a completion as vLLM streams it: server-sent events of
// chunks (for chat, the role first, then the text, then the finish
// reason), the usage in a chunk of its own when asked, then [DONE].
func (s *Server) stream(w http.ResponseWriter, obs *Request, chat bool, c completion, u usage) int {
	id, object := "cmpl-", "text_completion"
	if chat {
		id, object = "chatcmpl-", "chat.completion.chunk"
	}
	id += strconv.FormatUint(s.ids.Add(1), 10)
	created := time.Now().Unix()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	send := func(choices []map[string]any, u *usage) {
		chunk := map[string]any{"id": id, "object": object, "created": created, "model": s.cfg.Model, "choices": choices}
		if u != nil {
			chunk["usage"] = u
		}
		data, _ := json.Marshal(chunk) // maps of plain values: cannot fail
		fmt.Fprintf(w, "data: %s\n\n", data)
	}
	choice := func(k string, v any, finish any) []map[string]any {
		return []map[string]any{{"index": 0, k: v, "logprobs": nil, "finish_reason": finish}}
	}
	if chat {
		send(choice("delta", map[string]any{"role": "assistant", "content": ""}, nil), nil)
		send(choice("delta", map[string]any{"content": fakeText(c.tokens)}, nil), nil)
		send(choice("delta", map[string]any{}, c.finish), nil)
	} else {
		send(choice("text", fakeText(c.tokens), nil), nil)
		send(choice("text", "", c.finish), nil)
	}
	if c.usage {
		send([]map[string]any{}, &u)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	obs.Status = http.StatusOK
	s.observe(obs)
	return http.StatusOK
}

// reply writes a 200 and tells Observe.
func (s *Server) reply(w http.ResponseWriter, obs *Request, v any) int {
	obs.Status = http.StatusOK
	writeJSON(w, http.StatusOK, v)
	s.observe(obs)
	return http.StatusOK
}

// fail writes err's response, as vLLM's error object, and tells Observe.
func (s *Server) fail(w http.ResponseWriter, obs *Request, err error) int {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, errGone):
		code = 499 // nginx's "client closed request": nobody reads it
	case errors.Is(err, enginesim.ErrClosed):
		code = http.StatusServiceUnavailable
	}
	if br, ok := errors.AsType[*badRequest](err); ok {
		code = br.code
	}
	obs.Status, obs.Err = code, err.Error()
	writeError(w, code, err.Error())
	s.observe(obs)
	return code
}

func (s *Server) observe(obs *Request) {
	if s.cfg.Observe != nil {
		s.cfg.Observe(*obs)
	}
}

// writeError writes vLLM's error response.
func writeError(w http.ResponseWriter, code int, msg string) {
	typ := "BadRequestError"
	switch {
	case code == http.StatusNotFound:
		typ = "NotFoundError"
	case code >= 500:
		typ = "InternalServerError"
	}
	writeJSON(w, code, map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": code}})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		code, data = http.StatusInternalServerError, []byte(`{"error":{"message":"encoding the response failed","type":"InternalServerError","param":null,"code":500}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(append(data, '\n'))
}
