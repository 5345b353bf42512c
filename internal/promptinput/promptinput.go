// Package promptinput turns the API's prompts (kvindexv1.Prompt) into the
// tokenizer's input (tokenizer.Input): the one place the API's
// ChatMessage and the tokenizer's Message meet (see tokenizer.Message),
// for the index server, which tokenizes the prompts it is sent, and the
// endpoint picker, which may tokenize them itself. It is a package of its
// own because the Go client (api/client) must not depend on the
// tokenizer, nor the tokenizer on the API.
package promptinput

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/tokenizer"
)

// Of is the tokenizer's input for a prompt given as text or as chat
// messages; ok is false for the other kinds (token ids, block hashes),
// which need no tokenizing.
func Of(p *kvindexv1.Prompt) (in tokenizer.Input, ok bool, err error) {
	switch x := p.GetInput().(type) {
	case *kvindexv1.Prompt_Text:
		return tokenizer.Input{Prompt: x.Text}, true, nil
	case *kvindexv1.Prompt_Messages:
		in, err = Chat(x.Messages)
		return in, true, err
	}
	return tokenizer.Input{}, false, nil
}

// Chat is the tokenizer's input for a conversation. Its errors name the
// offending field as prompt.messages[i]. The chat parameters are checked
// by the tokenizer, which owns their list.
func Chat(c *kvindexv1.ChatMessages) (tokenizer.Input, error) {
	msgs := c.GetMessages()
	if len(msgs) == 0 {
		return tokenizer.Input{}, errors.New("prompt.messages is empty")
	}
	tm := make([]tokenizer.Message, len(msgs))
	for i, m := range msgs {
		if raw := m.GetMessageJson(); raw != "" {
			if m.GetRole() != "" || m.GetContent() != "" {
				return tokenizer.Input{}, fmt.Errorf(
					"prompt.messages[%d] sets message_json and role or content: give the whole message in message_json, or role and content", i)
			}
			if !json.Valid([]byte(raw)) {
				return tokenizer.Input{}, fmt.Errorf("prompt.messages[%d].message_json is not valid JSON", i)
			}
			if err := json.Unmarshal([]byte(raw), &tm[i]); err != nil {
				return tokenizer.Input{}, fmt.Errorf("prompt.messages[%d].message_json: %v", i, err)
			}
		} else {
			tm[i] = tokenizer.Message{Role: m.GetRole(), Content: m.GetContent()}
		}
		if tm[i].Role == "" {
			return tokenizer.Input{}, fmt.Errorf("prompt.messages[%d] has no role", i)
		}
	}
	in := tokenizer.Input{Messages: tm}
	if p := c.GetChatParamsJson(); p != "" {
		in.ChatParams = json.RawMessage(p)
	}
	return in, nil
}
