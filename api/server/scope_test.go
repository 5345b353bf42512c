package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/tokenizer"
)

// LongestPrefix lists every engine in the query's scope, matched or not:
// every engine kvindex follows for the model (configured ones before
// their first event included) or, with candidates, every engine of the
// candidate pods, and each candidate pod kvindex does not know at all,
// once, with health "unknown". GetPodScores lists the same pods.
func TestLongestPrefixScope(t *testing.T) {
	tk := localTokenizer(t)
	streams := &fakeStreams{}
	streams.set(
		kvevents.StreamStats{Engine: engine("a", 0), Connected: true},
		kvevents.StreamStats{Engine: engine("c", 0)},                  // configured, never connected
		kvevents.StreamStats{Engine: engine("c", 1), Connected: true}, // connected, no event yet
		kvevents.StreamStats{Engine: kvevents.EngineID{Model: "other", Pod: "d"}, Connected: true},
	)
	f := newFixture(t, func(c *Config) {
		c.Streams = streams
		c.Tokenizers = []NamedTokenizer{{client.SourceLocal, tk}}
	})
	ids, err := tk.Tokenize(context.Background(), testModel, tokenizer.Input{Prompt: longText})
	if err != nil {
		t.Fatal(err)
	}
	loadThree(t, f, ids) // a/0: 4 blocks, b/1: 3, b/0: 2; b is not followed (known from the index only)

	tests := []struct {
		name       string
		candidates []string
		pods       []string // pod/rank:blocks:health
		scores     []string // GetPodScores: pod=score
	}{
		{"every engine of the model", nil,
			[]string{"a/0:4:ok", "b/1:3:unknown", "b/0:2:unknown", "c/0:0:disconnected", "c/1:0:ok"},
			[]string{"a=4", "b=3", "c=0"}},
		{"a followed pod without events", []string{"c"},
			[]string{"c/0:0:disconnected", "c/1:0:ok"},
			[]string{"c=0"}},
		{"a pod kvindex does not know", []string{"z", "a"},
			[]string{"a/0:4:ok", "z/0:0:unknown"},
			[]string{"a=4", "z=0"}},
		{"a pod of another model", []string{"d", "b"},
			[]string{"b/1:3:unknown", "b/0:2:unknown", "d/0:0:unknown"},
			[]string{"b=3", "d=0"}},
		{"repeated candidates", []string{"c", "z", "c", "z"},
			[]string{"c/0:0:disconnected", "c/1:0:ok", "z/0:0:unknown"},
			[]string{"c=0", "z=0"}},
	}
	ctx := context.Background()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := f.client.LongestPrefixText(ctx, testModel, longText, &client.QueryOptions{Candidates: tc.candidates})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range r.GetPods() {
				got = append(got, fmt.Sprintf("%s/%d:%d:%s", p.GetPod(), p.GetDpRank(), p.GetMatchedBlocks(), client.HealthName(p.GetHealth())))
			}
			if !slices.Equal(got, tc.pods) {
				t.Errorf("LongestPrefix pods %v, want %v", got, tc.pods)
			}
			scores, err := f.client.PodScores(ctx, testModel, longText, tc.candidates)
			if err != nil {
				t.Fatal(err)
			}
			got = got[:0]
			for _, s := range scores {
				got = append(got, fmt.Sprintf("%s=%g", s.GetPod(), s.GetScore()))
			}
			if !slices.Equal(got, tc.scores) {
				t.Errorf("GetPodScores %v, want %v", got, tc.scores)
			}
		})
	}

	// Over HTTP too.
	code, body := post(t, f.url+"/v1/longest-prefix", `{"model":"qwen","block_hashes":[1],"candidate_pods":["z","c"]}`)
	var lp client.LongestPrefixJSON
	if err := json.Unmarshal(body, &lp); err != nil || code != http.StatusOK || len(lp.Pods) != 3 ||
		lp.Pods[0].Pod != "c" || lp.Pods[0].Health != "disconnected" || lp.Pods[2].Pod != "z" || lp.Pods[2].Health != "unknown" || lp.Pods[2].MatchedBlocks != 0 {
		t.Errorf("HTTP: %d %s", code, body)
	}
}

// A model is known if it is the default (--model), the model of an
// engine kvindex follows (even before its first event), or one the index
// holds. Any other is NotFound (HTTP 404) for LongestPrefix, Lookup and
// GetPodScores, with a message naming the known models.
func TestUnknownModel(t *testing.T) {
	streams := &fakeStreams{}
	streams.set(kvevents.StreamStats{Engine: kvevents.EngineID{Model: "configured", Pod: "c"}})
	f := newFixture(t, func(c *Config) {
		c.Streams = streams
		c.Tokenizers = []NamedTokenizer{{client.SourceLocal, localTokenizer(t)}}
	})
	f.hub.Apply(kvevents.EngineID{Model: "indexed", Pod: "i"}, 0, []kvevents.Event{stored(t, testutil.Seq(1, 16), 1)})
	none := newFixture(t, func(c *Config) { c.DefaultModel = "" })
	const known = `kvindex follows "configured", "indexed", "qwen"`

	ctx := context.Background()
	tests := []struct {
		name  string
		f     *fixture
		model string
		code  codes.Code
		msg   string
		pods  []string // LongestPrefix's pods, when OK
	}{
		{"default model", f, testModel, codes.OK, "", nil},
		{"configured engine, no event yet", f, "configured", codes.OK, "", []string{"c/0:0:disconnected"}},
		{"indexed", f, "indexed", codes.OK, "", []string{"i/0:1:unknown"}},
		{"unknown", f, "Qwen/Qwen2.5-7B", codes.NotFound, `unknown model "Qwen/Qwen2.5-7B": ` + known, nil},
		{"nothing known", none, "x", codes.NotFound, `unknown model "x": kvindex follows no model yet`, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := tc.f.client.LongestPrefixTokens(ctx, tc.model, testutil.Seq(1, 32), nil)
			_, lkErr := tc.f.client.LookupTokens(ctx, tc.model, testutil.Seq(1, 32), nil)
			_, psErr := tc.f.client.PodScores(ctx, tc.model, "hello", nil)
			for what, e := range map[string]error{"LongestPrefix": err, "Lookup": lkErr, "GetPodScores": psErr} {
				if st := status.Convert(e); st.Code() != tc.code || !strings.HasPrefix(st.Message(), tc.msg) {
					t.Errorf("%s: %v, want %v %q", what, e, tc.code, tc.msg)
				}
			}
			var got []string
			for _, p := range r.GetPods() {
				got = append(got, fmt.Sprintf("%s/%d:%d:%s", p.GetPod(), p.GetDpRank(), p.GetMatchedBlocks(), client.HealthName(p.GetHealth())))
			}
			if !slices.Equal(got, tc.pods) {
				t.Errorf("pods %v, want %v", got, tc.pods)
			}
		})
	}

	// HTTP answers 404 with the same message.
	for _, path := range []string{"/v1/longest-prefix", "/v1/lookup"} {
		code, body := post(t, f.url+path, `{"model":"Qwen/Qwen2.5-7B","tokens":[1,2,3]}`)
		var e struct{ Error string }
		json.Unmarshal(body, &e)
		if code != http.StatusNotFound || e.Error != `unknown model "Qwen/Qwen2.5-7B": `+known {
			t.Errorf("%s: %d %s", path, code, body)
		}
	}

	// A model whose first event has just arrived is known at once, even
	// while the cached view of the engines predates it.
	if _, err := f.client.LongestPrefixTokens(ctx, "late", testutil.Seq(1, 32), nil); status.Code(err) != codes.NotFound {
		t.Fatalf("before its first event: %v", err)
	}
	f.hub.Apply(kvevents.EngineID{Model: "late", Pod: "l"}, 0, nil)
	if r, err := f.client.LongestPrefixTokens(ctx, "late", testutil.Seq(1, 32), nil); err != nil || len(r.GetPods()) != 1 {
		t.Errorf("after its first event: %v, %v", r, err)
	}
}

// A tokenizer backend that cannot be reached is Unavailable, like an
// unreachable kvindex, but says so in an ErrorInfo (client.TokenizerUnavailable)
// naming the backend's URL, so that callers can tell the two apart.
func TestTokenizerUnavailableDetail(t *testing.T) {
	downURL := "http://" + testutil.FreeAddr(t)
	f := newFixture(t, func(c *Config) {
		c.Tokenizers = []NamedTokenizer{{client.SourceEngine, engineTokenizer(t, downURL)}}
	})
	ctx := context.Background()
	want := "the engine's /tokenize at " + downURL + " is unreachable: dial tcp " + strings.TrimPrefix(downURL, "http://") + ": connect: connection refused"
	_, err := f.client.LongestPrefixText(ctx, testModel, "hello", nil)
	problem, ok := client.TokenizerUnavailable(err)
	if st := status.Convert(err); !ok || problem != want || st.Code() != codes.Unavailable || st.Message() != "cannot tokenize the prompt: "+want {
		t.Errorf("got %v (tokenizer unavailable %v: %q), want Unavailable with problem %q", err, ok, problem, want)
	}
	_, err = f.client.PodScores(ctx, testModel, "hello", nil)
	if p, ok := client.TokenizerUnavailable(err); !ok || p != want {
		t.Errorf("GetPodScores: %v", err)
	}
	// Other failures carry no such detail.
	for _, e := range []error{
		status.Error(codes.Unavailable, "connection refused"),
		fmt.Errorf("not a status"),
		nil,
	} {
		if p, ok := client.TokenizerUnavailable(e); ok {
			t.Errorf("%v: tokenizer unavailable %q", e, p)
		}
	}
	_, err = f.client.LongestPrefix(ctx, testModel, client.MessagesPrompt(&kvindexv1.ChatMessage{Role: "user", Content: "hi"}), nil)
	if p, ok := client.TokenizerUnavailable(err); !ok || p != want {
		t.Errorf("chat: %v", err)
	}
	// HTTP: 503 with the same message.
	code, body := post(t, f.url+"/v1/longest-prefix", `{"prompt":"hello"}`)
	if code != http.StatusServiceUnavailable || !strings.Contains(string(body), "is unreachable: dial tcp") {
		t.Errorf("HTTP: %d %s", code, body)
	}
}
