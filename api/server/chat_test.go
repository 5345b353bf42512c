package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
)

// chatEngine stands in for vLLM's /tokenize: it records every request body
// and answers with the ids its table gives for the request's tools (the
// template renders the tools first, so they change the prompt from its
// first tokens on).
type chatEngine struct {
	byTools map[string][]uint64 // tools JSON -> ids; "" for no tools

	mu     sync.Mutex
	bodies []map[string]json.RawMessage
}

func newChatEngine(t *testing.T, byTools map[string][]uint64) (*chatEngine, string) {
	t.Helper()
	e := &chatEngine{byTools: byTools}
	hs := httptest.NewServer(e)
	t.Cleanup(hs.Close)
	return e, hs.URL
}

func (e *chatEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req map[string]json.RawMessage
	if r.URL.Path != "/tokenize" || json.Unmarshal(body, &req) != nil {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	e.mu.Lock()
	e.bodies = append(e.bodies, req)
	e.mu.Unlock()
	ids, ok := e.byTools[string(req["tools"])]
	if !ok {
		http.Error(w, `{"error":{"message":"unexpected tools"}}`, http.StatusBadRequest)
		return
	}
	fmt.Fprintf(w, `{"count":%d,"max_model_len":4096,"tokens":%s}`, len(ids), fmtIDs(ids))
}

// requests returns the bodies received so far.
func (e *chatEngine) requests() []map[string]json.RawMessage {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.bodies)
}

// matchedPods returns the pods holding at least one block, best first.
func matchedPods(r *kvindexv1.LongestPrefixResponse) []string {
	var out []string
	for _, p := range r.GetPods() {
		if p.GetMatchedBlocks() > 0 {
			out = append(out, fmt.Sprintf("%s:%d", p.GetPod(), p.GetMatchedBlocks()))
		}
	}
	return out
}

// An agent's conversation: content parts, a tool call and its result.
const (
	agentMessages = `[{"role":"system","content":"Be brief."},` +
		`{"role":"user","content":[{"type":"text","text":"Weather in <Paris>?"},{"type":"image_url","image_url":{"url":"http://img/1.png"}}]},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Paris\"}"}}]},` +
		`{"role":"tool","tool_call_id":"c1","content":"sunny"}]`
	toolsA = `[{"type":"function","function":{"name":"weather","description":"Weather in <city> & region",` +
		`"parameters":{"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"integer"}},"required":["zeta"]}}}]`
	toolsB    = `[{"type":"function","function":{"name":"weather","description":"Weather in <city>"}}]`
	kwargs    = `{"enable_thinking":false,"z":1,"a":[1,2]}`
	chatExtra = `"chat_template":"{{ messages }}","add_generation_prompt":false,"continue_final_message":true`
)

// Chat prompts carry everything that changes their rendering, over HTTP
// and gRPC: the engine's /tokenize receives the messages (content parts,
// tool calls), tools and template arguments as the caller wrote them, and
// prompts that differ only in their tools are different prompts.
func TestChatRenderingFields(t *testing.T) {
	idsA, idsB := testutil.Seq(1000, 3*testBlockSize), testutil.Seq(5000, 2*testBlockSize)
	eng, url := newChatEngine(t, map[string][]uint64{toolsA: idsA, toolsB: idsB})
	f := newFixture(t, func(c *Config) {
		c.Tokenizers = []NamedTokenizer{{client.SourceEngine, engineTokenizer(t, url)}, {client.SourceLocal, localTokenizer(t)}}
	})
	f.hub.Apply(engine("a", 0), 0, []kvevents.Event{stored(t, idsA, 3)})
	f.hub.Apply(engine("b", 0), 0, []kvevents.Event{stored(t, idsB, 2)})

	// checkLast holds the last /tokenize request to what the prompt gave.
	checkLast := func(t *testing.T, tools string, calls int) {
		t.Helper()
		reqs := eng.requests()
		if len(reqs) != calls {
			t.Fatalf("%d /tokenize requests, want %d", len(reqs), calls)
		}
		req := reqs[len(reqs)-1]
		for name, want := range map[string]string{
			"model":                  `"` + testModel + `"`,
			"messages":               agentMessages,
			"tools":                  tools,
			"chat_template_kwargs":   kwargs,
			"chat_template":          `"{{ messages }}"`,
			"add_generation_prompt":  "false",
			"continue_final_message": "true",
			"add_special_tokens":     "false",
		} {
			if got := string(req[name]); got != want {
				t.Errorf("/tokenize got %s = %s, want %s", name, got, want)
			}
		}
	}

	httpBody := func(tools string) string {
		return `{"model":"` + testModel + `","messages":` + agentMessages + `,"tools":` + tools +
			`,"chat_template_kwargs":` + kwargs + `,` + chatExtra + `}`
	}
	for i, tc := range []struct {
		tools string
		want  []string
	}{{toolsA, []string{"a:3"}}, {toolsB, []string{"b:2"}}} {
		code, body := post(t, f.url+"/v1/longest-prefix", httpBody(tc.tools))
		var r client.LongestPrefixJSON
		if err := json.Unmarshal(body, &r); err != nil || code != http.StatusOK {
			t.Fatalf("HTTP %d %s", code, body)
		}
		var got []string
		for _, p := range r.Pods {
			if p.MatchedBlocks > 0 {
				got = append(got, fmt.Sprintf("%s:%d", p.Pod, p.MatchedBlocks))
			}
		}
		if !slices.Equal(got, tc.want) || r.TokenSource != client.SourceEngine {
			t.Errorf("HTTP, tools %d: pods %v source %q, want %v", i, got, r.TokenSource, tc.want)
		}
		checkLast(t, tc.tools, i+1) // other tools: not answered from the cache
	}

	// gRPC: the same conversation, whole messages as message_json, the
	// fields as chat_params_json (other key order and spacing: a request
	// of its own for the cache, the same one for the engine).
	var raw []json.RawMessage
	if err := json.Unmarshal([]byte(agentMessages), &raw); err != nil {
		t.Fatal(err)
	}
	msgs := []*kvindexv1.ChatMessage{{Role: "system", Content: "Be brief."}}
	for _, m := range raw[1:] {
		msgs = append(msgs, client.MessageJSON(string(m)))
	}
	params := `{ "continue_final_message": true, "add_generation_prompt": false, "chat_template_kwargs": ` + kwargs +
		`, "tools": ` + toolsA + `, "chat_template": "{{ messages }}" }`
	r, err := f.client.LongestPrefix(context.Background(), testModel, client.ChatPrompt(params, msgs...), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := matchedPods(r); !slices.Equal(got, []string{"a:3"}) || r.GetTokenSource() != client.SourceEngine {
		t.Errorf("gRPC: pods %v source %q", got, r.GetTokenSource())
	}
	checkLast(t, toolsA, 3)

	// The same prompt again is answered from the cache; with other tools
	// it is not.
	if _, err := f.client.LongestPrefix(context.Background(), testModel, client.ChatPrompt(params, msgs...), nil); err != nil {
		t.Fatal(err)
	}
	r, err = f.client.LongestPrefix(context.Background(), testModel, client.ChatPrompt(strings.Replace(params, toolsA, toolsB, 1), msgs...), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := matchedPods(r); !slices.Equal(got, []string{"b:2"}) {
		t.Errorf("gRPC, other tools: pods %v", got)
	}
	checkLast(t, toolsB, 4)
}

// Chat fields that cannot be honoured are refused, naming the problem.
func TestChatErrors(t *testing.T) {
	_, url := newChatEngine(t, map[string][]uint64{"": testutil.Seq(0, 16)})
	f := newFixture(t, func(c *Config) {
		c.Tokenizers = []NamedTokenizer{{client.SourceEngine, engineTokenizer(t, url)}}
	})
	local := newFixture(t, func(c *Config) { c.Tokenizers = []NamedTokenizer{{client.SourceLocal, localTokenizer(t)}} })

	for _, tc := range []struct {
		name, body string
		msg        string
	}{
		{"tools without messages", `{"model":"qwen","prompt":"hi","tools":[]}`, "tools apply to chat prompts only: send them with messages"},
		{"not a chat field", `{"model":"qwen","messages":[{"role":"user","content":"hi"}],"tool_choice":"auto"}`,
			`unknown field "tool_choice" (known: model, tokens, prompt, messages, block_hashes, lora_name, cache_salt, mm_items, tools, chat_template, chat_template_kwargs, add_generation_prompt,`},
		{"message not an object", `{"model":"qwen","messages":["hi"]}`, `a chat message must be a JSON object such as {"role":"user","content":"hi"}, not a string`},
		{"message without role", `{"model":"qwen","messages":[{"content":[{"type":"text","text":"hi"}]}]}`, "prompt.messages[0] has no role"},
	} {
		t.Run("HTTP "+tc.name, func(t *testing.T) {
			code, body := post(t, f.url+"/v1/longest-prefix", tc.body)
			var e struct{ Error string }
			json.Unmarshal(body, &e)
			if code != http.StatusBadRequest || !strings.Contains(e.Error, tc.msg) {
				t.Errorf("got %d %q, want 400 containing %q", code, e.Error, tc.msg)
			}
		})
	}

	user := &kvindexv1.ChatMessage{Role: "user", Content: "hi"}
	for _, tc := range []struct {
		name string
		f    *fixture
		p    *kvindexv1.Prompt
		code codes.Code
		msg  string
	}{
		{"both message forms", f, client.ChatPrompt("", &kvindexv1.ChatMessage{Role: "user", MessageJson: `{"role":"user","content":"hi"}`}),
			codes.InvalidArgument, "prompt.messages[0] sets message_json and role or content"},
		{"message_json not JSON", f, client.ChatPrompt("", client.MessageJSON(`{"role":`)), codes.InvalidArgument, "prompt.messages[0].message_json is not valid JSON"},
		{"message_json not an object", f, client.ChatPrompt("", user, client.MessageJSON(`[1]`)), codes.InvalidArgument,
			"prompt.messages[1].message_json: a chat message must be a JSON object"},
		{"message_json without role", f, client.ChatPrompt("", client.MessageJSON(`{"content":"hi"}`)), codes.InvalidArgument, "prompt.messages[0] has no role"},
		{"unknown chat parameter", f, client.ChatPrompt(`{"tool_choice":"auto"}`, user), codes.InvalidArgument,
			`chat parameters: unknown field "tool_choice" (accepted: tools, chat_template,`},
		{"chat parameters not an object", f, client.ChatPrompt(`[]`, user), codes.InvalidArgument, "chat parameters are not a JSON object"},
		{"tools with the local tokenizer", local, client.ChatPrompt(`{"tools":[]}`, user), codes.FailedPrecondition,
			"the local tokenizer encodes completion prompts only; it cannot render chat templates, so chat messages, tools and chat_template_kwargs need the engine's /tokenize"},
	} {
		t.Run("gRPC "+tc.name, func(t *testing.T) {
			_, err := tc.f.client.LongestPrefix(context.Background(), testModel, tc.p, nil)
			if st := status.Convert(err); st.Code() != tc.code || !strings.Contains(st.Message(), tc.msg) {
				t.Errorf("got %v %q, want %v containing %q", st.Code(), st.Message(), tc.code, tc.msg)
			}
		})
	}
}
