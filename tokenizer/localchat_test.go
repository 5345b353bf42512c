package tokenizer

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/tokenizer/chattemplate"
)

func qwenChat(t *testing.T) *ChatLocal {
	t.Helper()
	l, err := LoadFile("testdata/qwen2.5/tokenizer.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := chattemplate.Load("chattemplate/testdata/templates/qwen2.5.json", nil)
	if err != nil {
		t.Fatal(err)
	}
	return &ChatLocal{Local: l, Template: tmpl}
}

// TestChatLocal: the chat form is rendered by the template, then encoded
// without special tokens (unless asked), its special tokens (<|im_start|>)
// read as single ids; requests it cannot vouch for are refused so that a
// Fallback asks the engine; completion prompts are the Local's.
func TestChatLocal(t *testing.T) {
	c := qwenChat(t)
	const want = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
	user := []Message{{Role: "user", Content: "hi"}}
	cases := []struct {
		name   string
		in     Input
		text   string
		err    error
		withID uint64 // an id the result must hold
	}{
		{"plain", Input{Messages: user}, want, nil, 151644},
		{"no_generation_prompt", Input{Messages: user, ChatParams: json.RawMessage(`{"add_generation_prompt": false}`)}, want[:len(want)-len("<|im_start|>assistant\n")], nil, 151645},
		{"tool_call_arguments_string", Input{Messages: []Message{{Role: "user", Content: "hi"}, {Raw: json.RawMessage(`{"role":"assistant","content":null,"tool_calls":[{"type":"function","function":{"name":"f","arguments":"{\"b\":1,\"a\":2}"}}]}`)}}, ChatParams: json.RawMessage(`{"add_generation_prompt": false}`)},
			"<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"b\": 1, \"a\": 2}}\n</tool_call><|im_end|>\n", nil, 151657},
		{"own_template", Input{Messages: user, ChatParams: json.RawMessage(`{"chat_template": "x"}`)}, "", ErrChatUnsupported, 0},
		{"continue_final", Input{Messages: user, ChatParams: json.RawMessage(`{"continue_final_message": true}`)}, "", ErrChatUnsupported, 0},
		{"content_parts", Input{Messages: []Message{{Raw: json.RawMessage(`{"role":"user","content":[{"type":"text","text":"hi"}]}`)}}}, "", ErrChatUnsupported, 0},
		{"bad_bool", Input{Messages: user, ChatParams: json.RawMessage(`{"add_generation_prompt": "yes"}`)}, "", ErrInvalidInput, 0},
		{"bad_arguments", Input{Messages: []Message{{Raw: json.RawMessage(`{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{"}}]}`)}}}, "", ErrInvalidInput, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ids, err := c.Tokenize(context.Background(), "", tc.in)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			text, special, err := c.Render(tc.in)
			if err != nil || text != tc.text || special {
				t.Fatalf("Render: %q, %v, %v; want %q, false", text, special, err, tc.text)
			}
			if w := c.Encode(tc.text, false); !slices.Equal(ids, w) {
				t.Fatalf("ids %v, want Encode(text) %v", ids, w)
			}
			if !slices.Contains(ids, tc.withID) {
				t.Fatalf("ids %v lack special token id %d", ids, tc.withID)
			}
		})
	}
	prompt := Input{Prompt: "hello world"}
	if ids, err := c.Tokenize(context.Background(), "", prompt); err != nil || !slices.Equal(ids, c.Encode("hello world", true)) {
		t.Fatalf("completion form: %v, %v", ids, err)
	}
}

// TestChatLocalFallback: what the local template refuses goes on to the
// next backend.
func TestChatLocalFallback(t *testing.T) {
	c := qwenChat(t)
	next := tokenizerFunc(func(context.Context, string, Input) ([]uint64, error) { return []uint64{7}, nil })
	ids, err := Fallback{c, next}.Tokenize(context.Background(), "", Input{Messages: []Message{{Role: "user", Content: "hi"}}, ChatParams: json.RawMessage(`{"chat_template": "x"}`)})
	if err != nil || !slices.Equal(ids, []uint64{7}) {
		t.Fatalf("got %v, %v; want the next backend's [7]", ids, err)
	}
}

type tokenizerFunc func(context.Context, string, Input) ([]uint64, error)

func (f tokenizerFunc) Tokenize(ctx context.Context, model string, in Input) ([]uint64, error) {
	return f(ctx, model, in)
}
