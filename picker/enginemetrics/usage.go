package enginemetrics

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Usage is what Fleet.Observe takes from one response.
type Usage struct {
	// Model is the response's model field.
	Model        string
	PromptTokens int
	CachedTokens int
}

// ErrNoUsage is returned by ParseUsage for a response without prompt and
// cached token counts: a stream without stream_options.include_usage, or
// an engine that does not report cached tokens (vLLM without
// --enable-prompt-tokens-details). Such a response says nothing of the
// cache, which is not the same as a miss, so it must not be observed.
var ErrNoUsage = errors.New("enginemetrics: no prompt and cached token counts in the response")

// ParseUsage reads the usage of an OpenAI-compatible response body, as
// vLLM writes it: a completion or chat completion (usage.prompt_tokens
// and usage.prompt_tokens_details.cached_tokens), a Responses API
// response (usage.input_tokens and input_tokens_details.cached_tokens),
// or their server-sent event streams, whose last event with a usage
// counts (the Responses API's carries it in response.completed). The
// caller bounds the body.
func ParseUsage(body []byte) (Usage, error) {
	t := bytes.TrimSpace(body)
	if !bytes.HasPrefix(t, []byte("data:")) && !bytes.HasPrefix(t, []byte("event:")) && !bytes.HasPrefix(t, []byte(":")) {
		var r usageResponse
		if err := json.Unmarshal(t, &r); err != nil {
			return Usage{}, fmt.Errorf("enginemetrics: response body: %w", err)
		}
		return r.usage()
	}
	var last usageResponse
	found := false
	sc := bufio.NewScanner(bytes.NewReader(t))
	sc.Buffer(nil, len(t)+1)
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:"))
		if !ok {
			continue // event:, id:, comments and the blank separators
		}
		data = bytes.TrimSpace(data)
		if string(data) == "[DONE]" {
			break
		}
		var r usageResponse
		if err := json.Unmarshal(data, &r); err != nil {
			return Usage{}, fmt.Errorf("enginemetrics: response event: %w", err)
		}
		if r.Usage != nil || (r.Response != nil && r.Response.Usage != nil) {
			last, found = r, true
		}
	}
	if err := sc.Err(); err != nil {
		return Usage{}, fmt.Errorf("enginemetrics: response stream: %w", err)
	}
	if !found {
		return Usage{}, ErrNoUsage
	}
	return last.usage()
}

// usageResponse is the part of a response, or of one streamed event,
// that ParseUsage reads.
type usageResponse struct {
	Model    string         `json:"model"`
	Usage    *usageJSON     `json:"usage"`
	Response *usageResponse `json:"response"` // Responses API events
}

type usageJSON struct {
	PromptTokens        *int          `json:"prompt_tokens"`
	InputTokens         *int          `json:"input_tokens"`
	PromptTokensDetails *usageDetails `json:"prompt_tokens_details"`
	InputTokensDetails  *usageDetails `json:"input_tokens_details"`
}

type usageDetails struct {
	CachedTokens *int `json:"cached_tokens"`
}

func (r *usageResponse) usage() (Usage, error) {
	if r.Usage == nil && r.Response != nil {
		r = r.Response
	}
	if r.Usage == nil {
		return Usage{}, ErrNoUsage
	}
	u := r.Usage
	prompt, details := u.PromptTokens, u.PromptTokensDetails
	if prompt == nil {
		prompt, details = u.InputTokens, u.InputTokensDetails
	}
	if prompt == nil || details == nil || details.CachedTokens == nil {
		return Usage{}, ErrNoUsage
	}
	return Usage{Model: r.Model, PromptTokens: *prompt, CachedTokens: *details.CachedTokens}, nil
}
