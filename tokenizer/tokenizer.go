package tokenizer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// Tokenizer turns request text into the token ids an engine will see.
//
// Implementations are safe for concurrent use. The returned slice belongs to
// the caller.
type Tokenizer interface {
	// Tokenize returns the token ids of in for the served model named model
	// (the "model" field of the inference request; backends that serve a
	// single tokenizer ignore it).
	Tokenize(ctx context.Context, model string, in Input) ([]uint64, error)
}

// Appender is implemented by tokenizers that can append the ids to a
// caller's buffer, which saves a large allocation per call on hot paths
// (64 KB for an 8k-token prompt). All tokenizers of this package implement
// it; AppendTokenize(ctx, dst, model, in) equals
// append(dst, Tokenize(ctx, model, in)...), and leaves dst's contents
// unchanged on error.
type Appender interface {
	AppendTokenize(ctx context.Context, dst []uint64, model string, in Input) ([]uint64, error)
}

// Input is the text of one inference request in one of the two forms the
// OpenAI-compatible APIs use. Exactly one form is set: Messages (the chat
// form, /v1/chat/completions) when len(Messages) > 0, otherwise Prompt (the
// completion form, /v1/completions; an empty prompt is valid).
type Input struct {
	// Prompt is the completion-form text.
	Prompt string

	// Messages is the chat-form conversation, rendered by the model's chat
	// template before tokenization.
	Messages []Message

	// AddSpecialTokens overrides the form's default: true for the
	// completion form (vLLM then adds BOS for models whose tokenizer has
	// one), false for the chat form (the template writes the special
	// tokens itself). Leave nil to match what the engine does for a
	// request that does not set add_special_tokens.
	AddSpecialTokens *bool

	// ChatParams optionally carries the top-level fields of a chat
	// request that change its rendering, as one JSON object of ChatFields'
	// fields: for example {"tools":[...],"chat_template_kwargs":
	// {"enable_thinking":false},"add_generation_prompt":false}. They are
	// forwarded to the engine's /tokenize verbatim; any other field is
	// refused with ErrInvalidInput. Ignored for the completion form.
	ChatParams json.RawMessage
}

// Message is one chat message. Its JSON form is the message object of the
// engine's /tokenize and of OpenAI chat requests, both ways (see
// UnmarshalJSON and MarshalJSON); kvindex's HTTP API decodes messages
// into it too.
//
// It is the only chat-message type outside the generated API
// (kvindexv1.ChatMessage, which the gRPC client sends): the tokenizer does
// not depend on the API, and the API's client does not depend on the
// tokenizer, so the server converts between the two at that one boundary.
// The client reads a chat request's messages into kvindexv1.ChatMessage
// as UnmarshalJSON reads them (api/client.ParseChatPrompt; its tests
// compare the two).
type Message struct {
	Role    string
	Content string

	// Raw, when set, is sent verbatim as the whole message object instead
	// of {"role":Role,"content":Content}. It carries what the plain form
	// cannot: content parts, a null content, tool calls, tool call ids,
	// names. Decoding JSON sets it for every message that is not plain.
	Raw json.RawMessage
}

// IsChat reports whether in is in the chat form.
func (in *Input) IsChat() bool { return len(in.Messages) > 0 }

// addSpecialTokens resolves the override against the form's default.
func (in *Input) addSpecialTokens() bool {
	if in.AddSpecialTokens != nil {
		return *in.AddSpecialTokens
	}
	return !in.IsChat()
}

// validate rejects inputs whose form is ambiguous.
func (in *Input) validate() error {
	if in.IsChat() && in.Prompt != "" {
		return fmt.Errorf("%w: both prompt and messages are set", ErrInvalidInput)
	}
	if !in.IsChat() && len(in.ChatParams) > 0 {
		return fmt.Errorf("%w: chat parameters without messages", ErrInvalidInput)
	}
	return nil
}

// Bool returns a pointer to v, for Input.AddSpecialTokens.
func Bool(v bool) *bool { return &v }

var (
	// ErrInvalidInput marks a request that no backend can tokenize as
	// given (both forms set, malformed raw JSON, ...). Fallback does not
	// try further backends after it.
	ErrInvalidInput = errors.New("tokenizer: invalid input")

	// ErrChatTemplate is returned by backends that cannot render chat
	// templates (the local tokenizer.json backend) for the chat form.
	ErrChatTemplate = errors.New("tokenizer: the local tokenizer encodes completion prompts only; it cannot render chat templates, " +
		"so chat messages, tools and chat_template_kwargs need the engine's /tokenize")

	// ErrUnsupported marks a tokenizer.json this package cannot reproduce
	// exactly. The wrapping error names the file and the feature.
	ErrUnsupported = errors.New("tokenizer: unsupported tokenizer")

	// ErrResponseTooLarge is returned when an engine's /tokenize response
	// exceeds HTTPConfig.MaxResponseBytes.
	ErrResponseTooLarge = errors.New("tokenizer: response too large")
)

// Fallback tries each Tokenizer in order and returns the first success.
//
// Typical use is Fallback{engineHTTP, local}: exact engine tokenization
// when the engine answers, local byte-level BPE (exact for completion
// prompts) when it does not. It stops early when ctx is done or the input
// is invalid, since no later backend can do better; otherwise it returns
// all the backends' errors joined.
type Fallback []Tokenizer

// Tokenize implements Tokenizer.
func (f Fallback) Tokenize(ctx context.Context, model string, in Input) ([]uint64, error) {
	return f.AppendTokenize(ctx, nil, model, in)
}

// AppendTokenize implements Appender.
func (f Fallback) AppendTokenize(ctx context.Context, dst []uint64, model string, in Input) ([]uint64, error) {
	if len(f) == 0 {
		return dst, errors.New("tokenizer: empty fallback chain")
	}
	var errs []error
	for _, t := range f {
		ids, err := AppendTokenize(ctx, t, dst, model, in)
		if err == nil {
			return ids, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil || errors.Is(err, ErrInvalidInput) {
			break
		}
	}
	if len(errs) == 1 {
		return dst, errs[0]
	}
	return dst, errors.Join(errs...)
}

// AppendTokenize appends t's ids for in to dst, through Appender when t
// implements it.
func AppendTokenize(ctx context.Context, t Tokenizer, dst []uint64, model string, in Input) ([]uint64, error) {
	if a, ok := t.(Appender); ok {
		return a.AppendTokenize(ctx, dst, model, in)
	}
	ids, err := t.Tokenize(ctx, model, in)
	if err != nil {
		return dst, err
	}
	if dst == nil {
		return ids, nil
	}
	return append(dst, ids...), nil
}
