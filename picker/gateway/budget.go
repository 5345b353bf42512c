package gateway

import (
	"time"

	"github.com/kvindex/kvindex/api/kvindexv1"
)

// BytesPerToken is how the index deadline counts a prompt sent as text or
// chat messages, whose tokens the picker does not know: one token per
// this many bytes of text (about what BPE tokenizers give for English
// and code).
const BytesPerToken = 4

// IndexBudget is the deadline of one index query, the one home of its
// rule: base plus per1K for every 1,000 tokens of the prompt,
//
//	deadline = base + per1K * tokens / 1000
//
// (kvindex picker's --index-timeout and --index-timeout-per-1k; 2 ms +
// 0.25 ms per 1,000 tokens by default: 2.5 ms for 2k tokens, 6 ms for
// 16k). tokens are the prompt's token ids (the caller's, or the
// picker's tokenizer's), or for text and chat, its bytes of text /
// BytesPerToken. A long prompt is worth waiting for: its
// prefill on a pod without its prefix costs far more than the wait, and
// the index's own work grows with it.
func IndexBudget(base, per1K time.Duration, tokens int) time.Duration {
	return base + time.Duration(int64(per1K)*int64(tokens)/1000)
}

// tokenCount is the prompt's length for IndexBudget.
func (r *Request) tokenCount() int {
	if r.Tokens != nil {
		return len(r.Tokens)
	}
	return promptBytes(r.Prompt) / BytesPerToken
}

// promptBytes is the text of a prompt sent as text or messages, in bytes.
func promptBytes(p *kvindexv1.Prompt) int {
	switch in := p.GetInput().(type) {
	case *kvindexv1.Prompt_Text:
		return len(in.Text)
	case *kvindexv1.Prompt_Messages:
		n := len(in.Messages.GetChatParamsJson())
		for _, m := range in.Messages.GetMessages() {
			n += len(m.GetContent()) + len(m.GetMessageJson())
		}
		return n
	case *kvindexv1.Prompt_Tokens:
		return len(in.Tokens.GetIds()) * BytesPerToken
	}
	return 0
}
