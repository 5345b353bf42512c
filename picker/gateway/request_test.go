package gateway

import (
	"errors"
	"testing"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/picker"
	"google.golang.org/protobuf/encoding/protojson"
)

func headers(kv ...string) func(string) string {
	return func(k string) string {
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i] == k {
				return kv[i+1]
			}
		}
		return ""
	}
}

func TestParseRequest(t *testing.T) {
	tests := []struct {
		name     string
		body     string
		hdr      []string
		prompt   string // protojson of the expected prompt
		model    string
		session  string
		priority picker.Priority
		tokens   int
	}{
		{name: "completion text", body: `{"model":"m","prompt":"hello"}`, model: "m", prompt: `{"text":"hello"}`},
		{name: "completion ids", body: `{"model":"m","prompt":[1,2,3]}`, model: "m", prompt: `{"tokens":{"ids":["1","2","3"]}}`, tokens: 3},
		{name: "completion batch", body: `{"prompt":["a","b"]}`, prompt: `{"text":"a"}`},
		{name: "completion id batch", body: `{"prompt":[[7,8],[9]]}`, prompt: `{"tokens":{"ids":["7","8"]}}`, tokens: 2},
		{
			name:   "chat plain",
			body:   `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"u"}]}`,
			model:  "m",
			prompt: `{"messages":{"messages":[{"role":"system","content":"s"},{"role":"user","content":"u"}]}}`,
		},
		{
			name:    "chat parts, tools and session",
			body:    `{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"tools":[{"type":"function"}],"temperature":0}`,
			hdr:     []string{HeaderSession, "s1", HeaderPriority, "Background"},
			prompt:  `{"messages":{"messages":[{"messageJson":"{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\"}]}"}],"chatParamsJson":"{\"tools\":[{\"type\":\"function\"}]}"}}`,
			session: "s1", priority: picker.Background,
		},
		{
			name:    "responses string",
			body:    `{"model":"m","input":"hi","instructions":"be brief","previous_response_id":"resp_1"}`,
			model:   "m",
			prompt:  `{"messages":{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}}`,
			session: "resp_1",
		},
		{
			name:    "responses items, header session wins",
			body:    `{"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]},{"type":"function_call","name":"f"},{"role":"assistant","content":"c"}],"previous_response_id":"resp_1"}`,
			hdr:     []string{HeaderSession, "s2"},
			prompt:  `{"messages":{"messages":[{"role":"user","content":"ab"},{"role":"assistant","content":"c"}]}}`,
			session: "s2",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ParseRequest([]byte(tt.body), headers(tt.hdr...))
			if err != nil {
				t.Fatal(err)
			}
			want := new(kvindexv1.Prompt)
			if err := protojson.Unmarshal([]byte(tt.prompt), want); err != nil {
				t.Fatal(err)
			}
			if got, w := protojson.Format(r.Prompt), protojson.Format(want); got != w {
				t.Errorf("prompt\n got %s\nwant %s", got, w)
			}
			if r.Model != tt.model || r.Session != tt.session || r.Priority != tt.priority || len(r.Tokens) != tt.tokens {
				t.Errorf("got model %q session %q priority %v tokens %d, want %q %q %v %d",
					r.Model, r.Session, r.Priority, len(r.Tokens), tt.model, tt.session, tt.priority, tt.tokens)
			}
		})
	}
}

func TestParseRequestBad(t *testing.T) {
	for _, body := range []string{
		``, `[]`, `{"model":"m"}`, `{"prompt":[]}`, `{"prompt":{}}`, `{"prompt":[{}]}`, `{"messages":[]}`,
		`{"messages":"x"}`, `{"messages":[{"content":"x"}]}`, `{"messages":[1]}`, `{"input":5}`,
		`{"input":[{"type":"function_call"}]}`, `{"input":[{"role":"user","content":5}]}`, `{"prompt":"x"`,
	} {
		if _, err := ParseRequest([]byte(body), headers()); !errors.Is(err, ErrBadRequest) {
			t.Errorf("%s: got %v, want ErrBadRequest", body, err)
		}
	}
}

func TestBlockKeys(t *testing.T) {
	a := blockKeys([]uint64{1, 2, 3, 4, 5}, 2)
	b := blockKeys([]uint64{1, 2, 3, 9}, 2)
	c := blockKeys([]uint64{0, 2, 3, 4}, 2)
	if len(a) != 2 || len(b) != 2 || a[0] != b[0] || a[1] == b[1] || c[1] == a[1] || c[0] == a[0] {
		t.Errorf("keys are not prefix-chained: %v %v %v", a, b, c)
	}
	if blockKeys([]uint64{1}, 2) != nil {
		t.Error("a partial block has a key")
	}
}
