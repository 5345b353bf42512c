package gateway

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
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
			if _, ok := scanBody([]byte(tt.body)); !ok {
				t.Error("the body was left to encoding/json, not read in one pass")
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

// scanBody leaves to encoding/json what it would not read the same way.
func TestScanBodyDefers(t *testing.T) {
	for _, body := range []string{
		`{"Prompt":[1]}`, `{"pr\u006fmpt":[1]}`, `{"prompt":[1],"prompt":[2]}`, `{"model":5,"prompt":[1]}`,
		`{"prompt":[1],"x":` + strings.Repeat("[", maxScanDepth+1) + strings.Repeat("]", maxScanDepth+1) + `}`,
		`{"prompt":[1]} x`, `{"prompt":[1],}`, `{"prompt":[1],"x":tru}`, `null`, `{"prompt":[1]`,
		// Messages that are not valid JSON, which the messages' one pass
		// (scanMessages) must see as well as json.Valid did.
		`{"messages":[{"role":"user","content":"a",}]}`, `{"messages":[{"role":"user","content":"a"},]}`,
		`{"messages":[{"role":"user","content":"a"} {"role":"user","content":"b"}]}`,
		`{"messages":[{"role":"user" "content":"a"}]}`, `{"messages":[{"role":"user","content":"a"}`,
		"{\"messages\":[{\"role\":\"user\",\"content\":\"a\tb\"}]}", `{"messages":[{"role":"user","content":"\q"}]}`,
		`{"messages":[{"role":"user","content":"a"]}`, `{"messages":[{"role":"user","content":"a"}}]}`,
	} {
		if _, ok := scanBody([]byte(body)); ok {
			t.Errorf("%.60s: read in one pass", body)
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

// FuzzParseRequest checks that the one-pass read of the body (scanBody)
// agrees with encoding/json's (decodeBody) on arbitrary bodies: the same
// request, or both refuse; and that ids read are the ids encoding/json
// decodes from the (first) prompt.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":[1,2,3]}`, `{"prompt":[[7,8],[9]]}`, `{"prompt":"x","model":"m"}`, `{"prompt":[1,2,3],"prompt":null}`,
		`{"Prompt":[1]}`, `{"pr\u006fmpt":[1]}`, `{"prompt":[01]}`, `{"prompt":[null]}`, `{"prompt":[1,]}`, `{"prompt":[1]} x`,
		`{"model":5,"prompt":[1]}`, `{"model":"\u00e9","prompt":[1],"temperature":0.5,"stop":["a\"]"]}`,
		`{"messages":[{"role":"user","content":"u"}],"tools":[{"type":"function"}],"TOOLS":1,"tools":[]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"chat_template_kwargs":{"a":{"b":[1]}}}`,
		`{"input":[{"type":"message","role":"user","content":"a"}],"instructions":"i","previous_response_id":"r"}`,
		`{"prompt":[1],"x":[[[{}]]],"y":{"z":"}"}}`, `{}`, `null`, `[]`, ` { "prompt" : [ 1 , 2 ] } `,
		`{"messages":[{"role":"system","content":"a\nb \"q\" \ud83d\ude00 \ud800 x"},{"content":"c","role":"user"}]}`,
		`{"messages":[{"role":"user","content":null},{"role":"user","content":"a","name":"n"},{"role":"","content":"x"}]}`,
		`{"messages":[{"role":"user","role":"assistant","content":"a"}, {"role":"user","content":"\u00e9\/"} ]}`,
		"{\"messages\":[{\"role\":\"user\",\"content\":\"bad \xff utf8\"}]}", `{"messages":[ ]}`, `{"messages":[{}]}`,
		`{"messages":[{"role":"user","content":"a",}]}`, `{"messages":[{"role":"user","content":"a"},]}`,
		`{"messages":[{"role":"user","content":"a"} {"role":"user","content":"b"}]}`, `{"messages":[{"role":"user","content":"a"}}]}`,
		"{\"messages\":[{\"role\":\"user\",\"content\":\"a\tb\"}]}", `{"messages":[{"role":"user","content":"long enough text\n"}, {"role":"a","content":"b","name":"c"} ]}`,
	} {
		f.Add(s)
	}
	none := headers()
	f.Fuzz(func(t *testing.T, s string) {
		got, err := parseRequest([]byte(s), none, true)
		want, refErr := parseRequest([]byte(s), none, false)
		if (err == nil) != (refErr == nil) {
			t.Fatalf("%q: one-pass error %v, encoding/json error %v", s, err, refErr)
		}
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("%q: %v is not ErrBadRequest", s, err)
			}
			return
		}
		if g, w := protojson.Format(got.Prompt), protojson.Format(want.Prompt); g != w || got.Model != want.Model ||
			got.Session != want.Session || !slices.Equal(got.Tokens, want.Tokens) {
			t.Fatalf("%q:\n one-pass %q %q %v %s\nencoding/json %q %q %v %s", s,
				got.Model, got.Session, got.Tokens, g, want.Model, want.Session, want.Tokens, w)
		}
		if got.Tokens != nil {
			var b struct{ Prompt json.RawMessage }
			if err := json.Unmarshal([]byte(s), &b); err != nil {
				t.Fatal(err)
			}
			var ids []uint64
			if json.Unmarshal(b.Prompt, &ids) != nil {
				var batch [][]uint64
				if err := json.Unmarshal(b.Prompt, &batch); err != nil {
					t.Fatalf("%q: read ids %v; encoding/json reads none: %v", s, got.Tokens, err)
				}
				ids = batch[0]
			}
			if !slices.Equal(ids, got.Tokens) {
				t.Fatalf("%q: read ids %v; encoding/json %v", s, got.Tokens, ids)
			}
		}
	})
}
