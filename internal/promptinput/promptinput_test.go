package promptinput_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/internal/promptinput"
	"github.com/kvindex/kvindex/tokenizer"
)

func TestOf(t *testing.T) {
	for _, tc := range []struct {
		name    string
		p       *kvindexv1.Prompt
		want    tokenizer.Input
		ok      bool
		wantErr string
	}{
		{"text", client.TextPrompt("hello"), tokenizer.Input{Prompt: "hello"}, true, ""},
		{"tokens", client.TokensPrompt([]uint64{1, 2}), tokenizer.Input{}, false, ""},
		{"nil", nil, tokenizer.Input{}, false, ""},
		{"chat", client.ChatPrompt(`{"add_generation_prompt":false}`,
			&kvindexv1.ChatMessage{Role: "user", Content: "hi"}, client.MessageJSON(`{"role":"assistant","content":null,"tool_calls":[]}`)),
			tokenizer.Input{Messages: []tokenizer.Message{{Role: "user", Content: "hi"}, {Role: "assistant", Raw: json.RawMessage(`{"role":"assistant","content":null,"tool_calls":[]}`)}},
				ChatParams: json.RawMessage(`{"add_generation_prompt":false}`)}, true, ""},
		{"empty chat", client.ChatPrompt(""), tokenizer.Input{}, true, "prompt.messages is empty"},
		{"no role", client.MessagesPrompt(&kvindexv1.ChatMessage{Content: "hi"}), tokenizer.Input{}, true, "prompt.messages[0] has no role"},
		{"both forms", client.MessagesPrompt(&kvindexv1.ChatMessage{Role: "user", MessageJson: `{"role":"user"}`}), tokenizer.Input{}, true, "sets message_json and role or content"},
		{"bad JSON", client.MessagesPrompt(client.MessageJSON(`{"role":`)), tokenizer.Input{}, true, "not valid JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in, ok, err := promptinput.Of(tc.p)
			if ok != tc.ok {
				t.Fatalf("ok %v; want %v", ok, tc.ok)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v; want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(in, tc.want) {
				t.Errorf("input %+v; want %+v", in, tc.want)
			}
		})
	}
}
