package loadgen

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/demo"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func TestLoadgenParseRoute(t *testing.T) {
	eps := []Endpoint{{Pod: "pod-0", Addr: "127.0.0.1:8000"}}
	for _, tc := range []struct {
		in, want, err string
		eps           []Endpoint
	}{
		{in: "round-robin", eps: eps, want: "round-robin"},
		{in: "pick=127.0.0.1:9003", want: "pick=http://127.0.0.1:9003/v1/pick"},
		{in: "pick=http://picker:9003/", want: "pick=http://picker:9003/v1/pick"},
		{in: "pick=https://picker/route/pick", want: "pick=https://picker/route/pick"},
		{in: "gateway=127.0.0.1:8080", want: "gateway=http://127.0.0.1:8080"},
		{in: "gateway=http://gw:8080/prefix/", want: "gateway=http://gw:8080/prefix"},
		{in: "round-robin", err: "route round-robin needs the engines"},
		{in: "least-loaded", err: `unknown route "least-loaded"`},
		{in: "pick", err: `route "pick": want pick=URL`},
		{in: "gateway=", err: `route "gateway=": want gateway=URL`},
		{in: "gateway=unix:///sock", err: `URL scheme "unix": want http or https`},
		{in: "pick=http://", err: `URL "http://" names no host`},
		{in: "gateway=http://gw#x", err: "want no query or fragment"},
	} {
		r, err := ParseRoute(tc.in, tc.eps)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: %v, want an error with %q", tc.in, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", tc.in, err)
		case tc.err == "" && r.String() != tc.want:
			t.Errorf("%q: %s, want %s", tc.in, r, tc.want)
		}
	}
}

func TestLoadgenParseEndpoint(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Endpoint
		err  string
	}{
		{in: "pod-0=127.0.0.1:8000", want: Endpoint{"pod-0", "127.0.0.1:8000"}},
		{in: "a=[::1]:8000", want: Endpoint{"a", "[::1]:8000"}},
		{in: "=h:1", err: "want POD=HOST:PORT"},
		{in: "h:1", err: "want POD=HOST:PORT"},
		{in: "a=:8000", err: `the address ":8000" is not HOST:PORT`},
		{in: "a=h:0", err: `port "0" is not a number from 1 to 65535`},
		{in: "a=h:http", err: `port "http" is not a number`},
	} {
		e, err := ParseEndpoint(tc.in)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: %v, want an error with %q", tc.in, err, tc.err)
		case tc.err == "" && (err != nil || e != tc.want):
			t.Errorf("%q: %v, %v; want %v", tc.in, e, err, tc.want)
		}
	}
}

func TestLoadgenReadStream(t *testing.T) {
	const usage = `data: {"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":16,"prompt_tokens_details":{"cached_tokens":32}}}` + "\n\n"
	for _, tc := range []struct {
		name, body string
		prompt     int
		cached     int
		err        string
	}{
		{name: "vLLM's", body: "data: {\"choices\":[{\"text\":\"hi\"}]}\n\n" + usage + "data: [DONE]\n\n", prompt: 40, cached: 32},
		{name: "comments and other fields", body: ": ping\nevent: x\ndata:{\"choices\":[]}\n\n" + usage + "data:[DONE]\n", prompt: 40, cached: 32},
		{name: "no usage", body: "data: {\"choices\":[]}\n\ndata: [DONE]\n\n", err: "without a usage chunk"},
		{name: "cut short", body: "data: {\"choices\":[]}\n\n" + usage, err: "ended before [DONE]"},
		{name: "not JSON", body: "data: {oops\n\n", err: "not JSON"},
		{name: "error chunk", body: "data: {\"error\":{\"message\":\"overloaded\"}}\n\n", err: "reports an error: overloaded"},
		{name: "empty", body: "", err: "ended before [DONE]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, u, err := readStream(strings.NewReader(tc.body), time.Now())
			switch {
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("%v, want an error with %q", err, tc.err)
			case tc.err == "" && err != nil:
				t.Error(err)
			case tc.err == "" && (u.PromptTokens != tc.prompt || u.PromptTokensDetails.CachedTokens != tc.cached):
				t.Errorf("usage %+v, want %d prompt, %d cached", u, tc.prompt, tc.cached)
			}
		})
	}
}

func FuzzReadStream(f *testing.F) {
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens\":1}}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: {\"error\":{}}\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		readStream(bytes.NewReader(b), time.Now()) // any input: an answer or an error, never a panic
	})
}

// The built-in workload is the demo's agent conversations: a turn extends
// its conversation's previous prompt, the conversations share a system
// prompt, and the ceiling counts what an unlimited cache serves of them.
func TestLoadgenAgentInput(t *testing.T) {
	o := DefaultInput()
	o.Sessions, o.Turns = 2, 3
	in, err := Load(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(in.Requests) != 6 || in.Text || in.Trace != nil {
		t.Fatalf("%d requests, text %v, trace %v; want 6 of token ids", len(in.Requests), in.Text, in.Trace)
	}
	for _, r := range in.Requests {
		if r.Prev < 0 {
			continue
		}
		prev := in.Requests[r.Prev].PromptTokens()
		if p := r.PromptTokens(); len(p) < len(prev) || !slices.Equal(p[:len(prev)], prev) {
			t.Errorf("request %d does not extend its previous turn %d", r.ID, r.Prev)
		}
	}
	if c := in.Ceiling(len(in.Requests)); !(c > 0.5 && c < 1) {
		t.Errorf("ceiling %.3f: conversations resending their context should reach well over half", c)
	}
	if in.Ceiling(1) != 0 {
		t.Errorf("ceiling of the first request alone %v, want 0", in.Ceiling(1))
	}
}

// A trace is read as the demo reads it: the same requests and ceiling,
// and text prompts kept as text.
func TestLoadgenTraceInput(t *testing.T) {
	const file = "../trace/testdata/conversations.jsonl"
	o := DefaultInput()
	o.Trace, o.Requests = file, 200
	in, err := Load(o)
	if err != nil {
		t.Fatal(err)
	}
	c := demo.Defaults()
	c.Trace, c.TraceRequests = file, 200
	_, info, err := demo.LoadTrace(c, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(in.Requests) != 200 || in.Ceiling(200) != info.Ceiling || in.PromptTokens(200) != info.PromptTokens {
		t.Errorf("%d requests, ceiling %v, %d prompt tokens; the demo reads %d, %v, %d",
			len(in.Requests), in.Ceiling(200), in.PromptTokens(200), info.Requests, info.Ceiling, info.PromptTokens)
	}
	if got := len(in.Requests[0].PromptTokens()); got != in.Requests[0].PromptLen() {
		t.Errorf("first prompt: %d token ids for %d tokens", got, in.Requests[0].PromptLen())
	}

	text := filepath.Join(t.TempDir(), "text.jsonl")
	os.WriteFile(text, []byte(`{"timestamp": 0, "session_id": "a", "text": "You are a helpful assistant.", "output_length": 4}`+"\n"+
		`{"timestamp": 10, "session_id": "a", "text": "You are a helpful assistant. Hi!", "output_length": 4}`+"\n"), 0o644)
	o = DefaultInput()
	o.Trace = text
	if _, err := Load(o); err == nil || !strings.Contains(err.Error(), "a text prompt needs a tokenizer (--tokenizer)") {
		t.Errorf("a text trace without a tokenizer: %v", err)
	}
	o.Tokenizer = "../../tokenizer/testdata/qwen2.5/tokenizer.json.gz"
	in, err = Load(o)
	if err != nil {
		t.Fatal(err)
	}
	if !in.Text || in.Requests[1].Text() != "You are a helpful assistant. Hi!" || in.Requests[1].Prev != 0 {
		t.Errorf("text %v, second prompt %q after %d; want the text kept and the session chained", in.Text, in.Requests[1].Text(), in.Requests[1].Prev)
	}
}

func TestLoadgenTableGolden(t *testing.T) {
	rep := &Report{Input: "agents", Requests: 64, PromptTokens: 177344, Ceiling: 0.8353, API: APICompletions, Results: []*Result{
		{Route: "round-robin", Requests: 64, TTFT: Percentiles{27.2, 73.9, 909}, Seconds: 16.8, RequestsPerSecond: 3.8, PromptTokensPerSecond: 10595,
			PromptTokens: 177344, CachedTokens: 105520, CachedFraction: 0.595, Ceiling: 0.8353, Pods: map[string]int{"pod-0": 16, "pod-1": 16, "pod-2": 16, "pod-3": 16}},
		{Route: "pick=http://127.0.0.1:9003/v1/pick", Requests: 64, Errors: 1, TTFT: Percentiles{27.5, 93.5, 2665.1}, Seconds: 17.6, RequestsPerSecond: 3.6, PromptTokensPerSecond: 10103,
			PromptTokens: 174000, CachedTokens: 122496, CachedFraction: 0.704, Ceiling: 0.8353, Pods: map[string]int{"pod-1": 30, "pod-2": 34},
			FirstError: "http://127.0.0.1:8002/v1/completions: 503 Service Unavailable: busy"},
	}}
	for _, g := range []struct {
		file  string
		write func(*bytes.Buffer) error
	}{
		{"testdata/table.txt", func(b *bytes.Buffer) error { return WriteTable(b, rep) }},
		{"testdata/report.json", func(b *bytes.Buffer) error { return WriteJSON(b, rep) }},
	} {
		var b bytes.Buffer
		if err := g.write(&b); err != nil {
			t.Fatal(err)
		}
		if *update {
			os.MkdirAll("testdata", 0o755)
			if err := os.WriteFile(g.file, b.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(g.file)
		if err != nil {
			t.Fatalf("%v (go test -run TestLoadgenTableGolden -update writes it)", err)
		}
		if b.String() != string(want) {
			t.Errorf("%s differs (go test -run TestLoadgenTableGolden -update rewrites it):\n%s", g.file, b.String())
		}
	}
}
