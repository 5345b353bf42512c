package tokenizer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kvindex/kvindex/tokenizer/chattemplate"
)

// ErrChatUnsupported is returned by ChatLocal for a chat request whose
// rendering it cannot vouch for: a request carrying its own chat_template,
// continue_final_message, multimodal settings, or content given as a list
// of parts (which vLLM reshapes according to the template before
// rendering). Fallback then tries the next backend, typically the engine.
var ErrChatUnsupported = errors.New("tokenizer: the local chat template cannot render this request exactly")

// ChatLocal is a Local that also tokenizes the chat form: it renders the
// messages with a model's chat template (package chattemplate), as vLLM
// does before tokenizing, then encodes the text with the chat form's
// special-token default (none: the template writes them).
type ChatLocal struct {
	*Local
	Template *chattemplate.Template
}

// Tokenize implements Tokenizer.
func (c *ChatLocal) Tokenize(ctx context.Context, model string, in Input) ([]uint64, error) {
	return c.AppendTokenize(ctx, nil, model, in)
}

// AppendTokenize implements Appender.
func (c *ChatLocal) AppendTokenize(ctx context.Context, dst []uint64, model string, in Input) ([]uint64, error) {
	if !in.IsChat() {
		return c.Local.AppendTokenize(ctx, dst, model, in)
	}
	if err := in.validate(); err != nil {
		return dst, err
	}
	text, special, err := c.Render(in)
	if err != nil {
		return dst, err
	}
	n := len(dst)
	if dst == nil {
		// One allocation for the ids rather than a dozen as they grow
		// (about 600 KB of garbage for a 16k-token chat): no vocabulary
		// this package reads averages fewer than 3 bytes a token on
		// chat text.
		dst = make([]uint64, 0, len(text)/3+16)
	}
	ids, err := c.encode(ctx, dst, text, special)
	if err != nil {
		return dst[:n], err
	}
	return ids, nil
}

// Render returns the prompt text of a chat-form input and whether special
// tokens are to be added when encoding it.
func (c *ChatLocal) Render(in Input) (string, bool, error) {
	var f ChatFields
	if len(in.ChatParams) > 0 {
		var err error
		if f, err = parseChatParams(in.ChatParams); err != nil {
			return "", false, err
		}
		if err := f.foldTemplateArgs(); err != nil {
			return "", false, err
		}
	}
	for _, unsupported := range []struct {
		name string
		v    json.RawMessage
	}{{"chat_template", f.ChatTemplate}, {"mm_processor_kwargs", f.MMProcessorKwargs}, {"media_io_kwargs", f.MediaIOKwargs}} {
		if isSet(unsupported.v) {
			return "", false, fmt.Errorf("%w: the request sets %s", ErrChatUnsupported, unsupported.name)
		}
	}
	if b, err := optBool(f.ContinueFinalMessage, "continue_final_message", false); err != nil || b {
		return "", false, cmpErr(err, fmt.Errorf("%w: the request sets continue_final_message", ErrChatUnsupported))
	}
	agp, err := optBool(f.AddGenerationPrompt, "add_generation_prompt", true)
	if err != nil {
		return "", false, err
	}
	special, err := optBool(f.AddSpecialTokens, "add_special_tokens", in.addSpecialTokens())
	if err != nil {
		return "", false, err
	}
	if in.AddSpecialTokens != nil {
		special = *in.AddSpecialTokens
	}
	msgs, err := templateMessages(in.Messages)
	if err != nil {
		return "", false, err
	}
	text, err := c.Template.Render(chattemplate.Request{
		MessageList: msgs, Tools: f.Tools, AddGenerationPrompt: agp,
		Kwargs: f.ChatTemplateKwargs, DecodeToolArguments: true,
	})
	if errors.Is(err, chattemplate.ErrInput) {
		return "", false, fmt.Errorf("%w: %v", ErrInvalidInput, err)
	}
	return text, special, err
}

// templateMessages hands the messages to the template as they are, plain
// ones as strings (no JSON written for them), refusing content given as
// parts (see ErrChatUnsupported).
func templateMessages(msgs []Message) ([]chattemplate.Message, error) {
	out := make([]chattemplate.Message, len(msgs))
	for i, m := range msgs {
		if m.Raw == nil {
			out[i] = chattemplate.Message{Role: m.Role, Content: m.Content}
			continue
		}
		var probe struct {
			Content json.RawMessage `json:"content"`
		}
		if err := json.Unmarshal(m.Raw, &probe); err != nil {
			return nil, fmt.Errorf("%w: message %d: %v", ErrInvalidInput, i, err)
		}
		if c := bytes.TrimSpace(probe.Content); len(c) > 0 && c[0] == '[' {
			return nil, fmt.Errorf("%w: message %d has content parts", ErrChatUnsupported, i)
		}
		out[i] = chattemplate.Message{Raw: m.Raw}
	}
	return out, nil
}

func isSet(v json.RawMessage) bool {
	v = bytes.TrimSpace(v)
	return len(v) > 0 && string(v) != "null"
}

// optBool reads an optional JSON boolean field, def when absent or null.
func optBool(v json.RawMessage, name string, def bool) (bool, error) {
	if !isSet(v) {
		return def, nil
	}
	var b bool
	if err := json.Unmarshal(v, &b); err != nil {
		return false, fmt.Errorf("%w: %s must be a boolean", ErrInvalidInput, name)
	}
	return b, nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
