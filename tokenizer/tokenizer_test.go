package tokenizer

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// funcTokenizer adapts a function to Tokenizer, to test composition.
type funcTokenizer func(ctx context.Context, model string, in Input) ([]uint64, error)

func (f funcTokenizer) Tokenize(ctx context.Context, model string, in Input) ([]uint64, error) {
	return f(ctx, model, in)
}

func TestFallback(t *testing.T) {
	errDown := errors.New("engine down")
	ok := func(ids ...uint64) funcTokenizer {
		return func(context.Context, string, Input) ([]uint64, error) { return ids, nil }
	}
	fail := func(err error) funcTokenizer {
		return func(context.Context, string, Input) ([]uint64, error) { return nil, err }
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		chain   Fallback
		want    []uint64
		errs    []error // each must be in the returned error
		notErrs []error // none may be (later backends not tried)
	}{
		{name: "first wins", chain: Fallback{ok(1), ok(2)}, want: []uint64{1}},
		{name: "falls back", chain: Fallback{fail(errDown), ok(2)}, want: []uint64{2}},
		{name: "all fail", chain: Fallback{fail(errDown), fail(ErrChatTemplate)}, errs: []error{errDown, ErrChatTemplate}},
		{name: "invalid input stops", chain: Fallback{fail(ErrInvalidInput), fail(errDown)}, errs: []error{ErrInvalidInput}, notErrs: []error{errDown}},
		{name: "cancelled context stops", ctx: cancelled, chain: Fallback{fail(context.Canceled), fail(errDown)},
			errs: []error{context.Canceled}, notErrs: []error{errDown}},
		{name: "empty chain", chain: Fallback{}, errs: []error{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := tc.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			ids, err := tc.chain.Tokenize(ctx, "m", Input{Prompt: "x"})
			if tc.errs == nil {
				if err != nil || !slices.Equal(ids, tc.want) {
					t.Fatalf("ids %v err %v, want %v", ids, err, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, ids %v", ids)
			}
			for _, e := range tc.errs {
				if !errors.Is(err, e) {
					t.Errorf("error %v does not wrap %v", err, e)
				}
			}
			for _, e := range tc.notErrs {
				if errors.Is(err, e) {
					t.Errorf("error %v wraps %v: a later backend was tried", err, e)
				}
			}
		})
	}
}

// TestFallbackHTTPToLocal runs the intended deployment: the engine's
// /tokenize first, the local tokenizer.json when the engine fails.
func TestFallbackHTTPToLocal(t *testing.T) {
	e := newEngine(t, func(w http.ResponseWriter, r *http.Request) {
		vllmError(w, http.StatusServiceUnavailable, "ServiceUnavailable", "engine is starting")
	})
	local, _ := qwen(t)
	chain := Fallback{newHTTPFor(t, e, HTTPConfig{}), local}
	ids, err := chain.Tokenize(context.Background(), engineModel, Input{Prompt: "Hello world"})
	if err != nil || !slices.Equal(ids, []uint64{9707, 1879}) {
		t.Fatalf("prompt: ids %v err %v", ids, err)
	}
	_, err = chain.Tokenize(context.Background(), engineModel, Input{Messages: []Message{{Role: "user", Content: "hi"}}})
	var se *StatusError
	if !errors.As(err, &se) || se.StatusCode != 503 || !errors.Is(err, ErrChatTemplate) {
		t.Fatalf("chat: err %v, want the engine's 503 and ErrChatTemplate", err)
	}
	if !strings.Contains(err.Error(), "engine is starting") {
		t.Errorf("error %q lacks the engine's message", err)
	}
}

func TestInputForms(t *testing.T) {
	msgs := []Message{{Role: "user", Content: "x"}}
	for _, tc := range []struct {
		in      Input
		chat    bool
		special bool
	}{
		{Input{Prompt: "x"}, false, true},
		{Input{}, false, true},
		{Input{Prompt: "x", AddSpecialTokens: Bool(false)}, false, false},
		{Input{Messages: msgs}, true, false},
		{Input{Messages: msgs, AddSpecialTokens: Bool(true)}, true, true},
		{Input{Messages: []Message{}}, false, true}, // empty messages: completion form
	} {
		if tc.in.IsChat() != tc.chat || tc.in.addSpecialTokens() != tc.special {
			t.Errorf("%+v: chat %v special %v, want %v %v", tc.in, tc.in.IsChat(), tc.in.addSpecialTokens(), tc.chat, tc.special)
		}
	}
}

func TestAppendTokenize(t *testing.T) {
	local, _ := qwen(t)
	e := newEngine(t, nil)
	h := newHTTPFor(t, e, HTTPConfig{})
	ctx := context.Background()
	prefix := []uint64{1, 2, 3}
	for name, a := range map[string]Appender{
		"local":    local,
		"http":     h,
		"fallback": Fallback{h, local},
	} {
		t.Run(name, func(t *testing.T) {
			for range 2 { // the second HTTP call is a cache hit
				dst := append(make([]uint64, 0, 64), prefix...)
				got, err := a.AppendTokenize(ctx, dst, "", Input{Prompt: "Hello world", AddSpecialTokens: Bool(false)})
				if err != nil || !slices.Equal(got, []uint64{1, 2, 3, 9707, 1879}) {
					t.Fatalf("got %v err %v", got, err)
				}
			}
			dst := append(make([]uint64, 0, 64), prefix...)
			got, err := a.AppendTokenize(ctx, dst, "", Input{Prompt: "x", Messages: []Message{{Role: "user"}}})
			if !errors.Is(err, ErrInvalidInput) || !slices.Equal(got, prefix) {
				t.Fatalf("on error: got %v err %v, want dst unchanged", got, err)
			}
		})
	}
}

// Message's JSON form is the /tokenize message object, both ways: a plain
// message is role and content (an empty content included); anything more
// is kept whole in Raw and written back verbatim.
func TestMessageJSON(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  Message
		want string
	}{
		{"plain", Message{Role: "user", Content: "hi"}, `{"role":"user","content":"hi"}`},
		{"empty content", Message{Role: "assistant"}, `{"role":"assistant","content":""}`},
		{"raw wins", Message{Role: "user", Content: "x", Raw: json.RawMessage(`{"name":"bob"}`)}, `{"name":"bob"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := json.Marshal(&tc.msg)
			if err != nil || string(got) != tc.want {
				t.Fatalf("Marshal = %s, %v; want %s", got, err, tc.want)
			}
		})
	}

	for _, tc := range []struct {
		name          string
		in            string
		role, content string
		raw           bool // kept whole in Raw
	}{
		{"plain", `{"role":"user","content":"x"}`, "user", "x", false},
		{"plain, other order", `{"content":"x","role":"user"}`, "user", "x", false},
		{"unknown key", `{"role":"user","content":"x","Raw":{"a":1}}`, "user", "x", true},
		{"content parts", `{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"http://x/y.png"}}]}`, "user", "", true},
		{"null content with tool calls", `{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]}`, "assistant", "", true},
		{"no content", `{"role":"assistant"}`, "assistant", "", true},
		{"tool result", `{"role":"tool","tool_call_id":"c1","content":"42"}`, "tool", "42", true},
		{"name", `{"role":"user","name":"bob","content":"hi"}`, "user", "hi", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var m Message
			if err := json.Unmarshal([]byte(tc.in), &m); err != nil {
				t.Fatal(err)
			}
			if m.Role != tc.role || m.Content != tc.content || (m.Raw != nil) != tc.raw {
				t.Fatalf("Unmarshal = %+v; want role %q content %q raw %v", m, tc.role, tc.content, tc.raw)
			}
			if tc.raw && string(m.Raw) != tc.in {
				t.Errorf("Raw = %s, want the object verbatim", m.Raw)
			}
			back, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			if tc.raw && string(back) != tc.in || !tc.raw && !jsonEqual(back, []byte(tc.in)) {
				t.Errorf("Marshal after Unmarshal = %s, want %s", back, tc.in)
			}
		})
	}

	for _, tc := range []struct{ in, want string }{
		{`["user","hi"]`, `must be a JSON object such as {"role":"user","content":"hi"}, not an array`},
		{`"hi"`, "not a string"},
		{`{"role":1,"content":"x"}`, "role must be a string, not a number"},
	} {
		var m Message
		if err := json.Unmarshal([]byte(tc.in), &m); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Unmarshal(%s): err %v, want %q", tc.in, err, tc.want)
		}
	}
}

// jsonEqual reports whether a and b are the same JSON value.
func jsonEqual(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}
