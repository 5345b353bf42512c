package enginemetrics_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/picker/enginemetrics"
)

// TestParseUsageFromEngine reads the usage of a simulated engine's real
// responses, plain and streamed, and checks it against the engine's own
// counters.
func TestParseUsageFromEngine(t *testing.T) {
	e := newEngine(t, "pod-a", 1)
	turns := conversation("usage", 3)
	msgs := []map[string]string{{"role": "user", "content": turns[0]}, {"role": "assistant", "content": turns[1]}}
	tests := []struct {
		name    string
		path    string
		req     map[string]any
		wantErr error
	}{
		{"chat", "/v1/chat/completions", map[string]any{"messages": msgs}, nil},
		{"chat stream with usage", "/v1/chat/completions",
			map[string]any{"messages": msgs, "stream": true, "stream_options": map[string]any{"include_usage": true}}, nil},
		{"chat stream without usage", "/v1/chat/completions", map[string]any{"messages": msgs, "stream": true}, enginemetrics.ErrNoUsage},
		{"completion", "/v1/completions", map[string]any{"prompt": strings.Join(turns, "\n")}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.req["model"] = testModel
			tt.req["max_tokens"] = 4
			b, err := json.Marshal(tt.req)
			if err != nil {
				t.Fatal(err)
			}
			post := func() []byte {
				resp, err := http.Post(e.srv.URL+tt.path, "application/json", bytes.NewReader(b))
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				body, err := io.ReadAll(resp.Body)
				if err != nil || resp.StatusCode != http.StatusOK {
					t.Fatalf("%s: %v %s", resp.Status, err, body)
				}
				return body
			}
			post() // the second one finds the prompt cached
			q0, h0 := e.Counters()
			body := post()
			q1, h1 := e.Counters()
			u, err := enginemetrics.ParseUsage(body)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("ParseUsage: error %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := enginemetrics.Usage{Model: testModel, PromptTokens: int(q1 - q0), CachedTokens: int(h1 - h0)}
			if u != want || u.CachedTokens == 0 {
				t.Fatalf("ParseUsage = %+v, want the engine's counts %+v, some cached", u, want)
			}
		})
	}
}

func TestParseUsage(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    enginemetrics.Usage
		wantErr error // nil: no error; errAny: some error
	}{
		{"responses api", `{"model":"m","usage":{"input_tokens":100,"input_tokens_details":{"cached_tokens":64}}}`,
			enginemetrics.Usage{Model: "m", PromptTokens: 100, CachedTokens: 64}, nil},
		{"responses api stream", "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"model\":\"m\"}}\n\n" +
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"model\":\"m\",\"usage\":{\"input_tokens\":50,\"input_tokens_details\":{\"cached_tokens\":16}}}}\n\n",
			enginemetrics.Usage{Model: "m", PromptTokens: 50, CachedTokens: 16}, nil},
		{"no cached tokens reported", `{"model":"m","usage":{"prompt_tokens":100,"prompt_tokens_details":null}}`,
			enginemetrics.Usage{}, enginemetrics.ErrNoUsage},
		{"no usage", `{"model":"m","choices":[]}`, enginemetrics.Usage{}, enginemetrics.ErrNoUsage},
		{"zero cached is a miss", `{"model":"m","usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":0}}}`,
			enginemetrics.Usage{Model: "m", PromptTokens: 10}, nil},
		{"not json", `<html>`, enginemetrics.Usage{}, errAny},
		{"bad event", "data: {\"usage\":\n\n", enginemetrics.Usage{}, errAny},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, err := enginemetrics.ParseUsage([]byte(tt.body))
			switch {
			case tt.wantErr == errAny:
				if err == nil {
					t.Fatalf("ParseUsage = %+v, want an error", u)
				}
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("ParseUsage: error %v, want %v", err, tt.wantErr)
				}
			case err != nil:
				t.Fatal(err)
			case u != tt.want:
				t.Fatalf("ParseUsage = %+v, want %+v", u, tt.want)
			}
		})
	}
}

var errAny = errors.New("any error")
