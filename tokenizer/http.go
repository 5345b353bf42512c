package tokenizer

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/kvindex/kvindex/internal/configerr"
)

// HTTPConfig configures an HTTP tokenizer.
type HTTPConfig struct {
	// BaseURL is the engine's server root, e.g. "http://vllm:8000"; the
	// tokenizer POSTs to BaseURL + "/tokenize".
	BaseURL string

	// Timeout bounds each request to the engine. Default 5s.
	Timeout time.Duration

	// CacheEntries bounds the result cache by entries. Default 4096;
	// negative disables the cache.
	CacheEntries int

	// CacheBytes bounds the result cache by the memory of the ids it
	// holds (4 bytes per id plus a small per-entry overhead). Default
	// 64 MiB.
	CacheBytes int64

	// MaxResponseBytes bounds the size of a /tokenize response body.
	// Default 16 MiB (about two million ids).
	MaxResponseBytes int64

	// Header is added to every request (for example Authorization).
	Header http.Header

	// Client sends the requests. Default: a client with a pooled,
	// keep-alive transport sized for concurrent use.
	Client *http.Client
}

const (
	defaultTimeout          = 5 * time.Second
	defaultCacheEntries     = 4096
	defaultCacheBytes       = 64 << 20
	defaultMaxResponseBytes = 16 << 20

	// maxErrorBody bounds how much of an error response is read, and
	// maxErrorText how much of it an error message quotes.
	maxErrorBody = 4 << 10
	maxErrorText = 300
)

// HTTP tokenizes by calling an engine's /tokenize endpoint (vLLM's, or any
// server speaking its protocol), which applies the served model's own
// tokenizer and chat template: the ids are exactly the engine's. Results are
// cached in an LRU keyed by a hash of (model, form, special tokens,
// content), since routers see the same prompts again and again.
//
// The completion form sends {"model","prompt","add_special_tokens"}; the
// chat form sends {"model","messages","add_generation_prompt":true,
// "add_special_tokens":false} plus Input.ChatParams (which may override
// both defaults; documents and reasoning_effort go into
// chat_template_kwargs). Both expect {"count","max_model_len","tokens":[...]}.
//
// An HTTP is safe for concurrent use.
type HTTP struct {
	url     string
	timeout time.Duration
	maxResp int64
	header  http.Header
	client  *http.Client
	cache   *idCache // nil when disabled
	keys    keyer

	requests, hits, errs atomic.Uint64
}

// NewHTTP returns an HTTP tokenizer for cfg.
func NewHTTP(cfg HTTPConfig) (*HTTP, error) {
	u, err := url.Parse(cfg.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, configerr.New("BaseURL", "base URL %q: want http(s)://host[:port][/path]", cfg.BaseURL)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, configerr.New("BaseURL", "base URL %q: no query or fragment allowed", cfg.BaseURL)
	}
	if cfg.Timeout < 0 || cfg.CacheBytes < 0 || cfg.MaxResponseBytes < 0 {
		return nil, errors.New("tokenizer: negative timeout or size limit")
	}
	h := &HTTP{
		url:     strings.TrimRight(u.String(), "/") + "/tokenize",
		timeout: cmp.Or(cfg.Timeout, defaultTimeout),
		maxResp: cmp.Or(cfg.MaxResponseBytes, defaultMaxResponseBytes),
		header:  cfg.Header.Clone(),
		client:  cfg.Client,
		keys:    newKeyer(),
	}
	if h.client == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		// The default of 2 idle connections per host makes a busy router
		// open and close a connection per request.
		t.MaxIdleConnsPerHost = 64
		h.client = &http.Client{Transport: t}
	}
	if cfg.CacheEntries >= 0 {
		h.cache = newIDCache(cmp.Or(cfg.CacheEntries, defaultCacheEntries), cmp.Or(cfg.CacheBytes, defaultCacheBytes))
	}
	return h, nil
}

// URL returns the endpoint the tokenizer POSTs to.
func (h *HTTP) URL() string { return h.url }

// HTTPStats are an HTTP tokenizer's counters since creation.
type HTTPStats struct {
	Requests     uint64 // requests sent to the engine
	CacheHits    uint64 // calls answered from the cache
	Errors       uint64 // calls that failed (bad input, engine errors, timeouts)
	CacheEntries int    // entries in the cache now
	CacheBytes   int64  // accounted bytes of the cache now
}

// Stats returns the counters, for metrics.
func (h *HTTP) Stats() HTTPStats {
	s := HTTPStats{Requests: h.requests.Load(), CacheHits: h.hits.Load(), Errors: h.errs.Load()}
	if h.cache != nil {
		s.CacheEntries, s.CacheBytes = h.cache.stats()
	}
	return s
}

// Tokenize implements Tokenizer.
func (h *HTTP) Tokenize(ctx context.Context, model string, in Input) ([]uint64, error) {
	ids, err := h.AppendTokenize(ctx, nil, model, in)
	if err != nil {
		return nil, err
	}
	return ids, nil
}

// AppendTokenize implements Appender.
func (h *HTTP) AppendTokenize(ctx context.Context, dst []uint64, model string, in Input) ([]uint64, error) {
	ids, err := h.tokenize(ctx, dst, model, &in)
	if err != nil {
		h.errs.Add(1)
		return dst, err
	}
	return ids, nil
}

func (h *HTTP) tokenize(ctx context.Context, dst []uint64, model string, in *Input) ([]uint64, error) {
	if err := in.validate(); err != nil {
		return nil, err
	}
	special := in.addSpecialTokens()
	var key cacheKey
	if h.cache != nil {
		key = h.keys.key(model, in, special)
		if ids, ok := h.cache.get(key, dst); ok {
			h.hits.Add(1)
			return ids, nil
		}
	}
	body, err := requestBody(model, in, special)
	if err != nil {
		return nil, err
	}
	ids32, err := h.post(ctx, body)
	if err != nil {
		return nil, err
	}
	dst = slices.Grow(dst, len(ids32))
	for _, id := range ids32 {
		dst = append(dst, uint64(id))
	}
	if h.cache != nil {
		h.cache.add(key, ids32)
	}
	return dst, nil
}

type completionRequest struct {
	Model            string `json:"model,omitempty"`
	Prompt           string `json:"prompt"`
	AddSpecialTokens bool   `json:"add_special_tokens"`
}

// chatRequest is the chat form of a /tokenize request.
type chatRequest struct {
	Model    string            `json:"model,omitempty"`
	Messages []json.RawMessage `json:"messages"`
	ChatFields
}

// requestBody renders the /tokenize request for in.
func requestBody(model string, in *Input, special bool) ([]byte, error) {
	if !in.IsChat() {
		return json.Marshal(completionRequest{Model: model, Prompt: in.Prompt, AddSpecialTokens: special})
	}
	req := chatRequest{Model: model, Messages: make([]json.RawMessage, len(in.Messages))}
	if len(in.ChatParams) > 0 {
		var err error
		if req.ChatFields, err = parseChatParams(in.ChatParams); err != nil {
			return nil, err
		}
		if err := req.foldTemplateArgs(); err != nil {
			return nil, err
		}
	}
	for i, m := range in.Messages {
		if m.Raw != nil {
			if !json.Valid(m.Raw) {
				return nil, fmt.Errorf("%w: message %d: raw message is not valid JSON", ErrInvalidInput, i)
			}
			req.Messages[i] = m.Raw
			continue
		}
		req.Messages[i], _ = json.Marshal(plainMessage{m.Role, m.Content}) // cannot fail
	}
	if req.AddGenerationPrompt == nil {
		req.AddGenerationPrompt = json.RawMessage("true")
	}
	if req.AddSpecialTokens == nil || in.AddSpecialTokens != nil {
		req.AddSpecialTokens, _ = json.Marshal(special)
	}
	return marshalVerbatim(&req)
}

type tokenizeResponse struct {
	Count  *int     `json:"count"`
	Tokens []uint32 `json:"tokens"`
}

// post sends one request and decodes the ids.
func (h *HTTP) post(ctx context.Context, body []byte) ([]uint32, error) {
	rctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	for k, v := range h.header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	h.requests.Add(1)
	resp, err := h.client.Do(req)
	if err != nil {
		return nil, h.transportError(ctx, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		return nil, &StatusError{URL: h.url, StatusCode: resp.StatusCode, Message: errorText(msg)}
	}
	if resp.ContentLength > h.maxResp {
		return nil, fmt.Errorf("%w: POST %s: %d bytes, limit %d", ErrResponseTooLarge, h.url, resp.ContentLength, h.maxResp)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, h.maxResp+1))
	if err != nil {
		return nil, h.transportError(ctx, err)
	}
	if int64(len(data)) > h.maxResp {
		return nil, fmt.Errorf("%w: POST %s: more than %d bytes", ErrResponseTooLarge, h.url, h.maxResp)
	}
	ids, err := decodeResponse(data)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: POST %s: %w", h.url, err)
	}
	return ids, nil
}

// decodeResponse reads a /tokenize response body.
func decodeResponse(data []byte) ([]uint32, error) {
	var r tokenizeResponse
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("malformed response: %v (body %s)", err, quote(data))
	}
	if r.Tokens == nil {
		return nil, fmt.Errorf("response has no tokens (body %s)", quote(data))
	}
	if r.Count != nil && *r.Count != len(r.Tokens) {
		return nil, fmt.Errorf("response count %d but %d tokens", *r.Count, len(r.Tokens))
	}
	return r.Tokens, nil
}

// transportError explains a failed exchange, telling the caller's
// cancellation apart from this tokenizer's own timeout.
func (h *HTTP) transportError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("tokenizer: POST %s: %w", h.url, ctx.Err())
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("tokenizer: POST %s: no response within %v: %w", h.url, h.timeout, context.DeadlineExceeded)
	}
	return fmt.Errorf("tokenizer: POST %s: %w", h.url, err)
}

// StatusError is a non-200 answer from the engine.
type StatusError struct {
	URL        string
	StatusCode int
	Message    string // the server's error text, truncated
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("tokenizer: POST %s: HTTP %d %s: %s", e.URL, e.StatusCode, http.StatusText(e.StatusCode), e.Message)
}

// errorText extracts the message of an error body: vLLM's
// {"error":{"message":...}} or {"message":...}, FastAPI's {"detail":...},
// or else the raw text.
func errorText(body []byte) string {
	var e struct {
		Message string          `json:"message"`
		Detail  json.RawMessage `json:"detail"`
		Error   json.RawMessage `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil {
		var nested struct {
			Message string `json:"message"`
		}
		var s string
		switch {
		case e.Message != "":
			return truncate(e.Message)
		case len(e.Error) > 0 && json.Unmarshal(e.Error, &nested) == nil && nested.Message != "":
			return truncate(nested.Message)
		case len(e.Error) > 0 && json.Unmarshal(e.Error, &s) == nil && s != "":
			return truncate(s)
		case len(e.Detail) > 0 && json.Unmarshal(e.Detail, &s) == nil:
			return truncate(s)
		case len(e.Detail) > 0:
			return truncate(string(e.Detail))
		}
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return "(empty body)"
	}
	return truncate(string(bytes.TrimSpace(body)))
}

// truncate shortens s to maxErrorText bytes at a rune boundary.
func truncate(s string) string {
	if len(s) <= maxErrorText {
		return s
	}
	return s[:runeCut(s, maxErrorText)] + "…"
}

// runeCut returns the largest n' <= n at which s can be cut between runes.
func runeCut(s string, n int) int {
	for n > 0 && n < len(s) && !utf8.RuneStart(s[n]) {
		n--
	}
	return n
}

// quote renders (the start of) a response body for an error message, in
// at most 2*maxErrorText bytes however much escaping expands it.
func quote(b []byte) string {
	s := string(b[:min(len(b), maxErrorText+utf8.UTFMax)])
	more := len(b) > len(s)
	for limit := maxErrorText; ; limit /= 2 {
		if len(s) > limit {
			s, more = s[:runeCut(s, limit)], true
		}
		if q := strconv.Quote(s); len(q) <= 2*maxErrorText {
			if more {
				q += "…"
			}
			return q
		}
	}
}
