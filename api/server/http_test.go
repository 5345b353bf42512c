package server

import (
	"bytes"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
)

func post(t *testing.T, url, body string) (int, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	return resp.StatusCode, b
}

func TestHTTPLongestPrefix(t *testing.T) {
	f := newFixture(t, nil)
	tokens := testutil.Seq(1000, 5*testBlockSize+3)
	loadThree(t, f, tokens)
	ids, _ := json.Marshal(tokens)
	code, body := post(t, f.url+"/v1/longest-prefix", `{"model":"qwen","tokens":`+string(ids)+`,"candidate_pods":["a","b"]}`)
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, body)
	}
	var got client.LongestPrefixJSON
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatal(err)
	}
	if got.BlocksTotal != 5 || got.BlockSize != 16 || got.PromptTokens != 83 || got.TokenSource != "caller" || len(got.Pods) != 3 {
		t.Fatalf("answer %s", body)
	}
	a := got.Pods[0]
	if a.Pod != "a" || a.DPRank != 0 || a.MatchedBlocks != 4 || a.MatchedTokens != 64 || a.Tiers["GPU"] != 4 || a.HashCheck != "verified" || a.Health != "unknown" {
		t.Errorf("first pod %+v", a)
	}
	// The documented key set.
	var raw map[string]any
	json.Unmarshal(body, &raw)
	pod := raw["pods"].([]any)[0].(map[string]any)
	keys := slices.Sorted(maps.Keys(pod))
	if want := []string{"dp_rank", "hash_check", "health", "matched_blocks", "matched_tokens", "pod", "tiers"}; !slices.Equal(keys, want) {
		t.Errorf("pod keys %v, want %v", keys, want)
	}

	// The same answer by block hashes.
	keysJSON, _ := json.Marshal(chainKeys(t, tokens, nil))
	code, body = post(t, f.url+"/v1/longest-prefix", `{"block_hashes":`+string(keysJSON)+`}`)
	var byHash client.LongestPrefixJSON
	json.Unmarshal(body, &byHash)
	if code != http.StatusOK || len(byHash.Pods) != 3 || byHash.Pods[0].MatchedBlocks != 4 || byHash.TokenSource != "hashes" {
		t.Errorf("by hashes: %d %s", code, body)
	}
}

func TestHTTPLookupAndPods(t *testing.T) {
	streams := &fakeStreams{}
	streams.set(kvevents.StreamStats{Engine: engine("a", 0), Endpoint: "tcp://a:5557", Connected: true, LastSeq: 3})
	f := newFixture(t, func(c *Config) { c.Streams = streams })
	tokens := testutil.Seq(1, 40)
	loadThree(t, f, testutil.Seq(1, 64))
	ids, _ := json.Marshal(tokens)
	code, body := post(t, f.url+"/v1/lookup", `{"model":"qwen","tokens":`+string(ids)+`}`)
	if code != http.StatusOK {
		t.Fatalf("lookup: %d %s", code, body)
	}
	var lk client.LookupJSON
	if err := json.Unmarshal(body, &lk); err != nil {
		t.Fatal(err)
	}
	keys := chainKeys(t, tokens, nil)
	if len(lk.Blocks) != 2 || lk.Blocks[1].Hash != keys[1] || len(lk.Blocks[1].Holders) != 3 {
		t.Errorf("lookup %s", body)
	}

	resp, err := http.Get(f.url + "/v1/pods?model=qwen")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	var pods client.PodsJSON
	if err := json.Unmarshal(body, &pods); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("pods: %d %v %s", resp.StatusCode, err, body)
	}
	if len(pods.Pods) != 3 || pods.Pods[0].Pod != "a" || pods.Pods[0].Endpoint != "tcp://a:5557" || pods.Pods[0].LastSeq != 3 || pods.Pods[0].Blocks != 4 || !pods.Pods[0].Connected {
		t.Errorf("pods %s", body)
	}
}

// Client mistakes get a 4xx with a JSON error naming the problem.
func TestHTTPBadRequests(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.MaxTokens = 100 })
	f.hub.Apply(kvevents.EngineID{Model: "m", Pod: "p"}, 0, nil) // kvindex knows model "m"
	huge := `{"model":"m","tokens":[` + strings.Repeat("1,", 2<<20) + `1]}`
	tests := []struct {
		name string
		path string
		body string
		code int
		msg  string
	}{
		{"malformed", "/v1/longest-prefix", `{"model":`, 400, "malformed JSON"},
		{"syntax", "/v1/longest-prefix", `{"model" "m"}`, 400, "malformed JSON at byte"},
		{"empty body", "/v1/longest-prefix", ``, 400, "empty request body"},
		{"not an object", "/v1/longest-prefix", `[1,2]`, 400, "must be a JSON object"},
		{"unknown field", "/v1/longest-prefix", `{"model":"m","token":[1]}`, 400, `unknown field "token"`},
		{"two inputs", "/v1/longest-prefix", `{"model":"m","tokens":[1],"prompt":"x"}`, 400, "only one of tokens, prompt, messages or block_hashes (got tokens and prompt)"},
		{"no input", "/v1/longest-prefix", `{"model":"m"}`, 400, "needs one of tokens"},
		{"negative id", "/v1/longest-prefix", `{"model":"m","tokens":[1,-5]}`, 400, "tokens[1]: -5 is negative"},
		{"float id", "/v1/longest-prefix", `{"model":"m","tokens":[1.5]}`, 400, "tokens[0]: 1.5 is not an integer"},
		{"string id", "/v1/longest-prefix", `{"model":"m","block_hashes":["1"]}`, 400, "block_hashes[0]: a string"},
		{"wrong type", "/v1/longest-prefix", `{"model":5,"tokens":[1]}`, 400, "field model: got number, want a string"},
		{"trailing data", "/v1/longest-prefix", `{"model":"m","tokens":[1]} {}`, 400, "unexpected data after the JSON object"},
		{"too many tokens", "/v1/longest-prefix", `{"model":"m","tokens":[` + strings.Repeat("1,", 100) + `1]}`, 400, "101 tokens; the limit is 100"},
		{"too large", "/v1/longest-prefix", huge, 413, "request body exceeds"},
		{"text without tokenizer", "/v1/longest-prefix", `{"model":"m","prompt":"hello"}`, 400, "need a tokenizer"},
		{"lookup unknown field", "/v1/lookup", `{"model":"m","tokens":[1],"candidate_pods":["a"]}`, 400, `unknown field "candidate_pods"`},
		{"no such path", "/v2/longest-prefix", `{}`, 404, "no such endpoint"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, body := post(t, f.url+tc.path, tc.body)
			var e struct{ Error string }
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("body %q is not a JSON error: %v", body, err)
			}
			if code != tc.code || !strings.Contains(e.Error, tc.msg) {
				t.Errorf("got %d %q, want %d containing %q", code, e.Error, tc.code, tc.msg)
			}
		})
	}

	resp, err := http.Get(f.url + "/v1/longest-prefix")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET /v1/longest-prefix: %d Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
}

func TestHTTPHealthAndPprof(t *testing.T) {
	f := newFixture(t, nil)
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 503, "/debug/pprof/": 404} {
		resp, err := http.Get(f.url + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s = %d, want %d", path, resp.StatusCode, want)
		}
	}
	f.hub.Apply(engine("a", 0), 0, nil) // bind mode: the first event makes it ready
	resp, err := http.Get(f.url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("/readyz after the first event = %d", resp.StatusCode)
	}
	// Profiles are on the admin handler only, next to the probes and
	// metrics.
	for path, want := range map[string]int{"/debug/pprof/": 200, "/debug/pprof/cmdline": 200, "/healthz": 200, "/readyz": 200, "/metrics": 200, "/v1/pods": 404} {
		rec := &responseRecorder{header: http.Header{}}
		req, _ := http.NewRequest(http.MethodGet, path, nil)
		f.srv.AdminHandler().ServeHTTP(rec, req)
		if rec.code == 0 {
			rec.code = 200
		}
		if rec.code != want {
			t.Errorf("admin %s = %d, want %d", path, rec.code, want)
		}
	}
}

type responseRecorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (r *responseRecorder) Header() http.Header         { return r.header }
func (r *responseRecorder) Write(b []byte) (int, error) { return r.body.Write(b) }
func (r *responseRecorder) WriteHeader(code int)        { r.code = code }

// An unknown key is refused with the list of the keys that request
// accepts: exactly those, so the list never names a key that would be
// refused (lookup has no candidate_pods) nor misses one that is accepted.
func TestHTTPUnknownFieldListsAcceptedKeys(t *testing.T) {
	f := newFixture(t, nil)
	tests := []struct {
		path     string
		has, not string
	}{
		{"/v1/longest-prefix", "candidate_pods", ""},
		{"/v1/lookup", "tokens", "candidate_pods"},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			code, body := post(t, f.url+tc.path, `{"model":"qwen","tokens":[1],"bogus":1}`)
			var e struct{ Error string }
			json.Unmarshal(body, &e)
			prefix := `unknown field "bogus" (known: `
			if code != http.StatusBadRequest || !strings.HasPrefix(e.Error, prefix) || !strings.HasSuffix(e.Error, ")") {
				t.Fatalf("%d %q", code, e.Error)
			}
			keys := strings.Split(strings.TrimSuffix(strings.TrimPrefix(e.Error, prefix), ")"), ", ")
			if !slices.Contains(keys, tc.has) || (tc.not != "" && slices.Contains(keys, tc.not)) || !slices.Contains(keys, "model") {
				t.Errorf("known keys %v: want %q, not %q", keys, tc.has, tc.not)
			}
			for _, k := range keys {
				_, body := post(t, f.url+tc.path, `{"`+k+`":null}`)
				if strings.Contains(string(body), "unknown field") {
					t.Errorf("listed key %q is refused: %s", k, body)
				}
			}
			if tc.not != "" {
				_, body := post(t, f.url+tc.path, `{"`+tc.not+`":null}`)
				json.Unmarshal(body, &e)
				if !strings.HasPrefix(e.Error, `unknown field "`+tc.not+`" (known: `) {
					t.Errorf("unlisted key %q: %s", tc.not, body)
				}
			}
		})
	}
}

// Bodies are refused before they are buffered: one announced larger than
// the limit at once, and any whose reading would take the bodies being
// read past Limits.MaxBodyBytesInFlight (HTTP 429), however many arrive.
func TestBodyBytesInFlight(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.MaxTokens, c.Limits.MaxBodyBytesInFlight = 100, 4096 })
	// A body that keeps coming holds what it sent so far.
	pr, pw := io.Pipe()
	held := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, f.url+"/v1/longest-prefix", pr)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			close(held)
			return
		}
		held <- resp
	}()
	if _, err := pw.Write([]byte(`{"model":"qwen","tokens":[` + strings.Repeat(" ", 3500))); err != nil {
		t.Fatal(err)
	}
	testutil.Await(t, 10*time.Second, "the first body's bytes in flight", func() bool { return f.srv.bodies.InFlight() >= 3500 })
	code, body := post(t, f.url+"/v1/longest-prefix", `{"model":"qwen","tokens":[`+strings.Repeat(" ", 1000)+`1]}`)
	if code != http.StatusTooManyRequests || !strings.Contains(string(body), "request bodies being read exceed its limit of 4096 bytes") {
		t.Errorf("a second body while the first holds 3500 bytes: %d %s, want 429", code, body)
	}
	pw.Write([]byte(`1]}`))
	pw.Close()
	if resp := <-held; resp != nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("the first body, once complete: %d, want 200", resp.StatusCode)
		}
	}
	if n := f.srv.bodies.InFlight(); n != 0 {
		t.Errorf("%d body bytes still in flight after both answers", n)
	}
	// Once the first is answered, the same body passes.
	if code, body := post(t, f.url+"/v1/longest-prefix", `{"model":"qwen","tokens":[`+strings.Repeat(" ", 1000)+`1]}`); code != http.StatusOK {
		t.Errorf("the second body alone: %d %s", code, body)
	}
}
