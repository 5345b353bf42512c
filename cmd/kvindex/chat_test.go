package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/tokenizer"
	"github.com/kvindex/kvindex/tokenizer/chattemplate"
)

// An agent's chat request, as it is sent to /v1/chat/completions: tools, a
// tool call and its result, content parts, template arguments, and fields
// that do not reach the template (sampling, tool_choice, stream).
const (
	chatTool = `{"type":"function","function":{"name":"get_weather","description":"Weather in <city>",` +
		`"parameters":{"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"integer"}},"required":["zeta"]}}}`
	chatMessages = `[{"role":"system","content":"Be brief."},` +
		`{"role":"user","content":[{"type":"text","text":"Weather?"},{"type":"image_url","image_url":{"url":"http://img/1.png"}}]},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]},` +
		`{"role":"tool","tool_call_id":"c1","content":"sunny"}]`
	chatRequest = `{
  "model": "` + e2eModel + `",
  "messages": ` + chatMessages + `,
  "tools": [` + chatTool + `],
  "tool_choice": "auto",
  "chat_template_kwargs": {"enable_thinking": false},
  "temperature": 0.2,
  "max_tokens": 64,
  "stream": true
}`
)

func TestReadMessagesFile(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		params     string // the prompt's chat_params_json
		plain      int    // messages sent as role and content
	}{
		{"array", `[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}]`, "", 2},
		{"request, messages only", `{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":1}`, "", 1},
		{"full request", chatRequest, `{"tools":[` + chatTool + `],"chat_template_kwargs":{"enable_thinking":false}}`, 1},
		{"array with parts", chatMessages, "", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := readMessagesFile(writeFile(t, "chat.json", tc.file), nil)
			if err != nil {
				t.Fatal(err)
			}
			c := p.GetMessages()
			if c.GetChatParamsJson() != tc.params {
				t.Errorf("chat_params_json %s\nwant %s", c.GetChatParamsJson(), tc.params)
			}
			plain := 0
			for _, m := range c.GetMessages() {
				if m.GetMessageJson() == "" {
					plain++
				} else if m.GetRole() != "" || m.GetContent() != "" {
					t.Errorf("message %v sets both forms", m)
				}
			}
			if plain != tc.plain {
				t.Errorf("%d plain messages, want %d: %v", plain, tc.plain, c.GetMessages())
			}
		})
	}
	for _, tc := range []struct{ file, want string }{
		{`{"messages":[]}`, "no messages"},
		{`{"messages":[["user","hi"]]}`, "a chat message must be a JSON object"},
		{`{"messages":[{"role":"user","content":"hi"}],"tools":[1,}`, "want a JSON array of messages"},
	} {
		_, err := readMessagesFile(writeFile(t, "bad.json", tc.file), nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.file, err, tc.want)
		}
	}
}

// recordingTokenize stands in for vLLM's /tokenize: it answers with ids
// and records the request bodies it was sent.
type recordingTokenize struct {
	ids []uint64

	mu     sync.Mutex
	bodies []map[string]json.RawMessage
}

func (e *recordingTokenize) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req map[string]json.RawMessage
	body, _ := io.ReadAll(r.Body)
	if r.URL.Path != "/tokenize" || json.Unmarshal(body, &req) != nil {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	e.mu.Lock()
	e.bodies = append(e.bodies, req)
	e.mu.Unlock()
	ids, _ := json.Marshal(e.ids)
	fmt.Fprintf(w, `{"count":%d,"max_model_len":32768,"tokens":%s}`, len(e.ids), ids)
}

func (e *recordingTokenize) last() map[string]json.RawMessage {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.bodies) == 0 {
		return nil
	}
	return e.bodies[len(e.bodies)-1]
}

// kvindex query --messages-file with a whole chat request: the engine's
// /tokenize gets the messages, tools and template arguments as the request
// has them, and the answer is that of the ids it returns.
func TestE2EChatRequestFile(t *testing.T) {
	t.Parallel() // its own service and engines on free ports
	tok := &recordingTokenize{ids: testutil.Seq(9000, 3*e2eBlockSize)}
	engine := httptest.NewServer(tok)
	t.Cleanup(engine.Close)
	x := startE2E(t, []string{"pod-a"}, "--tokenize-url", engine.URL)
	if _, err := x.engines["pod-a"].Process(tok.ids, nil); err != nil {
		t.Fatal(err)
	}
	x.awaitMatched(tok.ids, map[string]uint32{"pod-a": 3})

	out, errOut, code := runCLI(t, "query", "--server", x.svc.GRPCAddr(), "--messages-file", writeFile(t, "agent.json", chatRequest), "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var got client.LongestPrefixJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got.Pods) != 1 || got.Pods[0].MatchedBlocks != 3 || got.TokenSource != client.SourceEngine {
		t.Errorf("answer %s (%v)", out, err)
	}
	req := tok.last()
	for name, want := range map[string]string{
		"messages":             chatMessages,
		"tools":                "[" + chatTool + "]",
		"chat_template_kwargs": `{"enable_thinking":false}`,
		"model":                `"` + e2eModel + `"`,
	} {
		if string(req[name]) != want {
			t.Errorf("/tokenize got %s = %s, want %s", name, req[name], want)
		}
	}
	for _, name := range []string{"tool_choice", "temperature", "max_tokens", "stream"} {
		if v, ok := req[name]; ok {
			t.Errorf("/tokenize got %s = %s: it does not reach the template", name, v)
		}
	}
}

// With --tokenizer and --chat-template, serve tokenizes a chat request
// itself: no engine /tokenize is configured, and the answer's ids are the
// rendered template's, encoded locally.
func TestE2EChatLocalTemplate(t *testing.T) {
	t.Parallel() // its own service and engines on free ports
	const tokFile, tmplFile = "../../tokenizer/testdata/qwen2.5/tokenizer.json.gz", "../../tokenizer/chattemplate/testdata/templates/qwen2.5.json"
	x := startE2E(t, []string{"pod-a"}, "--tokenizer", tokFile, "--chat-template", tmplFile)
	local, err := tokenizer.LoadFile(tokFile)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := chattemplate.Load(tmplFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []tokenizer.Message{{Role: "system", Content: "You are terse."}, {Role: "user", Content: strings.Repeat("Tell me about prefix caches. ", 4)}}
	ids, err := (&tokenizer.ChatLocal{Local: local, Template: tmpl}).Tokenize(context.Background(), e2eModel, tokenizer.Input{Messages: msgs})
	if err != nil {
		t.Fatal(err)
	}
	blocks := uint32(len(ids) / e2eBlockSize)
	if blocks < 2 {
		t.Fatalf("prompt of %d tokens is too short for the test", len(ids))
	}
	if _, err := x.engines["pod-a"].Process(ids, nil); err != nil {
		t.Fatal(err)
	}
	x.awaitMatched(ids, map[string]uint32{"pod-a": blocks})

	req, _ := json.Marshal(map[string]any{"model": e2eModel, "messages": msgs})
	out, errOut, code := runCLI(t, "query", "--server", x.svc.GRPCAddr(), "--messages-file", writeFile(t, "chat.json", string(req)), "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var got client.LongestPrefixJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got.Pods) != 1 || got.Pods[0].MatchedBlocks != blocks || got.TokenSource != client.SourceLocal {
		t.Errorf("answer %s (%v), want pod-a matching %d blocks, tokens from %s", out, err, blocks, client.SourceLocal)
	}
}
