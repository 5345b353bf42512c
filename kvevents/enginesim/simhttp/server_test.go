package simhttp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/enginesim/simhttp"
	"github.com/kvindex/kvindex/tokenizer"
)

const (
	testModel = "Qwen/Qwen2.5-7B-Instruct"
	bs        = 16
	// deadline bounds every wait, so that a missing event fails the test
	// instead of hanging it.
	deadline = 15 * time.Second
)

var loadTokenizer = sync.OnceValues(func() (*tokenizer.Local, error) {
	return tokenizer.LoadFile("../../../tokenizer/testdata/qwen2.5/tokenizer.json.gz")
})

func qwen(t testing.TB) *tokenizer.Local {
	t.Helper()
	tok, err := loadTokenizer()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func hasher(t testing.TB) *blockhash.Hasher {
	t.Helper()
	h, err := blockhash.New(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: bs})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// newEngines builds n ranks of one simulated engine, without sockets.
func newEngines(t testing.TB, n, capacity int) []*enginesim.Engine {
	t.Helper()
	var out []*enginesim.Engine
	for r := range n {
		e, err := enginesim.New(enginesim.Config{Pod: "pod-0", Model: testModel, DPRank: r, Hasher: hasher(t), CapacityBlocks: capacity})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

// front serves cfg on a loopback port and returns its base URL.
func front(t testing.TB, cfg simhttp.Config) (*simhttp.Server, string) {
	t.Helper()
	s, err := simhttp.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, "http://" + s.Addr().String()
}

// response is the part of the OpenAI responses the tests read.
type response struct {
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
		Message      struct {
			Role, Content string
		} `json:"message"`
	} `json:"choices"`
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	// /tokenize
	Count  int      `json:"count"`
	Tokens []uint64 `json:"tokens"`
	// errors
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    int    `json:"code"`
	} `json:"error"`
}

// post sends a JSON body and decodes the answer.
func post(t testing.TB, url, body string, header ...string) (int, response) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var r response
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatalf("POST %s: %d, undecodable body %q: %v", url, resp.StatusCode, data, err)
	}
	return resp.StatusCode, r
}

// mustPost is post expecting a 200.
func mustPost(t testing.TB, url, body string, header ...string) response {
	t.Helper()
	code, r := post(t, url, body, header...)
	if code != http.StatusOK {
		t.Fatalf("POST %s %s: %d %s", url, body, code, r.Error.Message)
	}
	return r
}

// A request sent twice is served from the cache the second time, for
// the engine's true cache state: the blocks the engine held of the prompt
// just before it, times the block size. Chat messages are rendered as
// ChatML and tokenized by the configured tokenizer, as /tokenize shows.
func TestCachedTokens(t *testing.T) {
	tok := qwen(t)
	const system = "You are a careful assistant. Answer in one short paragraph and cite the file you read. "
	chatml := "<|im_start|>system\n" + strings.Repeat(system, 4) + "<|im_end|>\n<|im_start|>user\nWhich engine holds my prefix?<|im_end|>\n<|im_start|>assistant\n"
	msgs := fmt.Sprintf(`[{"role":"system","content":%q},{"role":"user","content":[{"type":"text","text":"Which engine holds my prefix?"}]}]`, strings.Repeat(system, 4))
	ids := make([]uint64, 100)
	for i := range ids {
		ids[i] = uint64(1000 + i)
	}
	idsJSON, _ := json.Marshal(ids)
	text := strings.Repeat("The index follows the engines' KV events. ", 10)
	for _, tc := range []struct {
		name, path, body, tokenize string
		want                       []uint64 // the prompt's ids
		object                     string
	}{
		{"chat", "/v1/chat/completions", `{"model":"` + testModel + `","messages":` + msgs + `,"temperature":0.2,"max_tokens":5}`,
			`{"model":"` + testModel + `","messages":` + msgs + `}`, tok.Encode(chatml, false), "chat.completion"},
		{"completion, text", "/v1/completions", `{"prompt":` + string(must(json.Marshal(text))) + `,"max_tokens":5}`,
			`{"prompt":` + string(must(json.Marshal(text))) + `}`, tok.Encode(text, true), "text_completion"},
		{"completion, token ids", "/v1/completions", `{"model":"` + testModel + `","prompt":` + string(idsJSON) + `,"max_tokens":5}`,
			"", ids, "text_completion"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			engines := newEngines(t, 1, 64)
			_, url := front(t, simhttp.Config{Ranks: engines, Tokenizer: tok})
			if tc.tokenize != "" {
				if got := mustPost(t, url+"/tokenize", tc.tokenize); !equal(got.Tokens, tc.want) || got.Count != len(tc.want) {
					t.Fatalf("/tokenize: %d tokens %v\nwant %d: %v", got.Count, got.Tokens, len(tc.want), tc.want)
				}
			}
			for turn := range 2 {
				held, err := engines[0].Lookup(tc.want, nil)
				if err != nil {
					t.Fatal(err)
				}
				r := mustPost(t, url+tc.path, tc.body)
				u := r.Usage
				if u.PromptTokens != len(tc.want) || u.CompletionTokens != 5 || u.TotalTokens != len(tc.want)+5 {
					t.Errorf("turn %d: usage %+v for a %d-token prompt and max_tokens 5", turn, u, len(tc.want))
				}
				if u.PromptTokensDetails.CachedTokens != held*bs {
					t.Errorf("turn %d: cached_tokens %d; the engine held %d blocks of %d tokens", turn, u.PromptTokensDetails.CachedTokens, held, bs)
				}
				if turn == 1 && (held == 0 || held != len(tc.want)/bs) {
					t.Errorf("turn 2: the engine held %d blocks of the %d-token prompt it had just served", held, len(tc.want))
				}
				if r.Object != tc.object || r.Model != testModel || len(r.Choices) != 1 || r.Choices[0].FinishReason != "length" ||
					len(strings.Fields(r.Choices[0].Text+r.Choices[0].Message.Content)) != 5 {
					t.Errorf("turn %d: response %+v", turn, r)
				}
			}
		})
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func equal(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// scrape reads /metrics with Prometheus' own text parser.
func scrape(t testing.TB, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	return fams
}

// value returns the sample of family name for engine rank (model_name
// must be the served model), failing when its type is not typ.
func value(t testing.TB, fams map[string]*dto.MetricFamily, name string, typ dto.MetricType, rank string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("/metrics has no %s", name)
	}
	if f.GetType() != typ {
		t.Fatalf("%s is a %v, want a %v", name, f.GetType(), typ)
	}
	for _, m := range f.GetMetric() {
		l := map[string]string{}
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		if l["engine"] != rank {
			continue
		}
		if len(l) != 2 || l["model_name"] != testModel {
			t.Fatalf("%s labels %v, want model_name and engine", name, l)
		}
		if typ == dto.MetricType_COUNTER {
			return m.GetCounter().GetValue()
		}
		return m.GetGauge().GetValue()
	}
	t.Fatalf("%s has no sample for engine %s", name, rank)
	return 0
}

// The prefix-cache counters are the engine's, in tokens: queries grow by
// every prompt's tokens, hits by its cached tokens, whether the request
// came over HTTP or straight to the engine; the gauges rest at 0 when
// nothing runs.
func TestMetrics(t *testing.T) {
	engines := newEngines(t, 1, 64)
	_, url := front(t, simhttp.Config{Ranks: engines})
	var queries, hits int
	for i, body := range []string{
		`{"prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33]}`,
		`{"prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33]}`,
		`{"prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,99,98,97]}`,
	} {
		u := mustPost(t, url+"/v1/completions", body).Usage
		queries += u.PromptTokens
		hits += u.PromptTokensDetails.CachedTokens
		fams := scrape(t, url)
		if q, h := value(t, fams, "vllm:prefix_cache_queries_total", dto.MetricType_COUNTER, "0"), value(t, fams, "vllm:prefix_cache_hits_total", dto.MetricType_COUNTER, "0"); q != float64(queries) || h != float64(hits) {
			t.Errorf("after request %d: queries %v, hits %v; the responses add up to %d and %d", i, q, h, queries, hits)
		}
		for _, g := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"} {
			if v := value(t, fams, g, dto.MetricType_GAUGE, "0"); v != 0 {
				t.Errorf("after request %d: %s = %v with nothing running", i, g, v)
			}
		}
	}
	if hits != 32+16 {
		t.Errorf("%d tokens hit, want 48 (two blocks, then one)", hits)
	}
	// The workload's requests reach the engine without HTTP; they count.
	if _, err := engines[0].Process([]uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, nil); err != nil {
		t.Fatal(err)
	}
	if h := value(t, scrape(t, url), "vllm:prefix_cache_hits_total", dto.MetricType_COUNTER, "0"); h != float64(hits+16) {
		t.Errorf("hits %v after a request straight to the engine, want %d", h, hits+16)
	}
	// Responses are counted by handler and status class.
	post(t, url+"/v1/completions", `{"prompt":"no tokenizer"}`)
	codes := map[string]float64{}
	for _, m := range scrape(t, url)["http_requests_total"].GetMetric() {
		l := map[string]string{}
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		codes[l["handler"]+" "+l["method"]+" "+l["status"]] = m.GetCounter().GetValue()
	}
	if codes["/v1/completions POST 2xx"] != 3 || codes["/v1/completions POST 4xx"] != 1 || codes["/metrics GET 2xx"] < 4 {
		t.Errorf("http_requests_total %v", codes)
	}
}

// held is a prefill that Wait holds until the test releases it.
type held struct {
	d       time.Duration
	release chan struct{}
}

// Requests beyond MaxRunning wait, and the metrics show it: one runs
// (holding its prompt's blocks), the others wait; as each finishes the
// next runs. A request's prefill time is PrefillPerToken per uncached
// token.
func TestLoad(t *testing.T) {
	engines := newEngines(t, 1, 64)
	prefills := make(chan held)
	_, url := front(t, simhttp.Config{
		Ranks: engines, MaxRunning: 1, PrefillPerToken: time.Millisecond,
		Wait: func(ctx context.Context, d time.Duration) error {
			h := held{d, make(chan struct{})}
			prefills <- h
			<-h.release
			return nil
		},
	})
	// 40 tokens: 2 full blocks cached, 3 blocks held while running.
	prompt := `{"prompt":[` + strings.TrimSuffix(strings.Repeat("7,", 39), ",") + `,8]}`
	const n = 3
	results := make(chan response, n)
	for range n {
		go func() {
			_, r := post(t, url+"/v1/completions", prompt)
			results <- r
		}()
	}
	for i := range n {
		var h held
		select {
		case h = <-prefills:
		case <-time.After(deadline):
			t.Fatalf("request %d never started its prefill", i)
		}
		// The first prefills all 40 tokens; the others find 32 cached.
		if want := map[bool]time.Duration{true: 40 * time.Millisecond, false: 8 * time.Millisecond}[i == 0]; h.d != want {
			t.Errorf("request %d: prefill %v, want %v", i, h.d, want)
		}
		waitMetrics(t, url, func(f map[string]*dto.MetricFamily) bool {
			return value(t, f, "vllm:num_requests_running", dto.MetricType_GAUGE, "0") == 1 &&
				value(t, f, "vllm:num_requests_waiting", dto.MetricType_GAUGE, "0") == float64(n-1-i) &&
				value(t, f, "vllm:kv_cache_usage_perc", dto.MetricType_GAUGE, "0") == 3.0/64
		}, fmt.Sprintf("1 running, %d waiting, 3 of 64 blocks used", n-1-i))
		close(h.release)
	}
	cached := 0
	for range n {
		cached += (<-results).Usage.PromptTokensDetails.CachedTokens
	}
	if cached != 2*32 {
		t.Errorf("%d tokens cached over the three requests, want 64", cached)
	}
	waitMetrics(t, url, func(f map[string]*dto.MetricFamily) bool {
		return value(t, f, "vllm:num_requests_running", dto.MetricType_GAUGE, "0") == 0 &&
			value(t, f, "vllm:kv_cache_usage_perc", dto.MetricType_GAUGE, "0") == 0
	}, "nothing running")
}

// waitMetrics scrapes until ok holds.
func waitMetrics(t *testing.T, url string, ok func(map[string]*dto.MetricFamily) bool, what string) {
	t.Helper()
	testutil.Await(t, deadline, "/metrics to show "+what, func() bool { return ok(scrape(t, url)) })
}

// An engine of several data-parallel ranks sends a request to the rank
// its X-data-parallel-rank header names, else to the least loaded, lowest
// first; each rank has its own cache and metrics.
func TestRanks(t *testing.T) {
	engines := newEngines(t, 2, 64)
	var mu sync.Mutex
	var seen []simhttp.Request
	_, url := front(t, simhttp.Config{Ranks: engines, Observe: func(r simhttp.Request) {
		mu.Lock()
		seen = append(seen, r)
		mu.Unlock()
	}})
	body := `{"prompt":[` + strings.TrimSuffix(strings.Repeat("5,", 32), ",") + `]}`
	mustPost(t, url+"/v1/completions", body, "X-data-parallel-rank", "1")
	if got := mustPost(t, url+"/v1/completions", body); got.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("rank 0 (idle, lowest) answered from a cache only rank 1 holds: %+v", got.Usage)
	}
	if got := mustPost(t, url+"/v1/completions", body, "X-data-parallel-rank", "1"); got.Usage.PromptTokensDetails.CachedTokens != 32 {
		t.Errorf("rank 1: %+v", got.Usage)
	}
	code, r := post(t, url+"/v1/completions", body, "X-data-parallel-rank", "2")
	if code != http.StatusBadRequest || !strings.Contains(r.Error.Message, "want a rank from 0 to 1") {
		t.Errorf("rank 2 of 2: %d %q", code, r.Error.Message)
	}
	fams := scrape(t, url)
	for rank, want := range map[string]float64{"0": 32, "1": 64} {
		if q := value(t, fams, "vllm:prefix_cache_queries_total", dto.MetricType_COUNTER, rank); q != want {
			t.Errorf("engine %s: %v tokens queried, want %v", rank, q, want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	var ranks []int
	for _, r := range seen {
		ranks = append(ranks, r.Rank)
	}
	if fmt.Sprint(ranks) != "[1 0 1 -1]" || seen[2].CachedTokens != 32 || seen[3].Status != http.StatusBadRequest {
		t.Errorf("observed %+v", seen)
	}
}

// Bad requests get a 4xx with vLLM's error object and a message that
// says what to send instead; nothing reaches the engine.
func TestBadRequests(t *testing.T) {
	engines := newEngines(t, 1, 8)
	_, url := front(t, simhttp.Config{Ranks: engines, Tokenizer: qwen(t), MaxBodyBytes: 1 << 10})
	_, noTok := front(t, simhttp.Config{Ranks: engines})
	for _, tc := range []struct {
		url, path, body string
		code            int
		want            string
	}{
		{url, "/v1/completions", `not json`, 400, "the request body must be a JSON object"},
		{url, "/v1/completions", `{"prompt":"a",}`, 400, "malformed request"},
		{url, "/v1/completions", `{"prompt":"a","max_tokens":"5"}`, 400, "field max_tokens: want an integer, not a JSON string"},
		{url, "/v1/completions", `{}`, 400, "prompt is required"},
		{url, "/v1/completions", `{"prompt":["a","b"]}`, 400, "one prompt per request"},
		{url, "/v1/completions", `{"prompt":[[1,2]]}`, 400, "one prompt per request"},
		{url, "/v1/completions", `{"prompt":[1,-2]}`, 400, "token 1 is -2; token ids are integers from 0 to 4294967295"},
		{url, "/v1/completions", `{"prompt":[1.5]}`, 400, "token 0 is 1.5"},
		{url, "/v1/completions", `{"prompt":{"a":1}}`, 400, "prompt must be a string or an array of token ids"},
		{url, "/v1/completions", `{"prompt":[]}`, 400, "the prompt is empty"},
		{url, "/v1/completions", `{"prompt":"hi","model":"other"}`, 404, "The model `other` does not exist"},
		{url, "/v1/completions", `{"prompt":"hi","n":2}`, 400, "n = 2"},
		{url, "/v1/completions", `{"prompt":"hi","stream_options":{"include_usage":true}}`, 400, "stream_options can only be given with stream true"},
		{url, "/v1/completions", `{"prompt":"hi","max_tokens":0}`, 400, "max_tokens must be at least 1"},
		{url, "/v1/completions", `{"prompt":"hi","cache_salt":""}`, 400, "cache_salt must be a non-empty string"},
		{url, "/v1/completions", `{"prompt":[` + strings.TrimSuffix(strings.Repeat("1,", 120), ",") + `],"max_tokens":16}`, 400, "maximum context length is 128 tokens. However, you requested 136 tokens"},
		{url, "/v1/completions", `{"prompt":"` + strings.Repeat("x", 2000) + `"}`, 413, "request body larger than 1024 bytes"},
		{noTok, "/v1/completions", `{"prompt":"hi"}`, 400, "this engine has no tokenizer"},
		{noTok, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, 400, "this engine has no tokenizer"},
		{url, "/v1/chat/completions", `{"messages":[]}`, 400, "messages is required"},
		{url, "/v1/chat/completions", `{"messages":"hi"}`, 400, "field messages: want an array"},
		{url, "/v1/chat/completions", `{"messages":[{"content":"hi"}]}`, 400, "messages[0]: role is required"},
		{url, "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, `content part 0 is of type "image_url"`},
		{url, "/v1/chat/completions", `{"messages":[{"role":"user","content":7}]}`, 400, "content must be a string, null or an array of text parts"},
		{url, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}]}`, 400, "without tools"},
		{url, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"chat_template":"{{x}}"}`, 400, "plain ChatML only"},
		{url, "/tokenize", `{"prompt":"a","messages":[{"role":"user","content":"hi"}]}`, 400, "give prompt or messages, not both"},
		{url, "/tokenize", `{"prompt":"a","model":"m"}`, 404, "The model `m` does not exist"},
	} {
		code, r := post(t, tc.url+tc.path, tc.body)
		if code != tc.code || r.Error.Code != tc.code || !strings.Contains(r.Error.Message, tc.want) || r.Error.Type == "" {
			t.Errorf("%s %.60s: %d %+v; want %d %q", tc.path, tc.body, code, r.Error, tc.code, tc.want)
		}
	}
	if q := engines[0].Queries(); q != 0 {
		t.Errorf("bad requests reached the engine: %d tokens queried", q)
	}
	// Unknown paths and methods.
	for _, tc := range []struct {
		method, path string
		code         int
	}{{"GET", "/v1/completions", 405}, {"POST", "/metrics", 405}, {"GET", "/v2/nothing", 404}, {"GET", "/health", 200}} {
		req, _ := http.NewRequest(tc.method, url+tc.path, bytes.NewReader(nil))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.code {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.path, resp.StatusCode, tc.code)
		}
	}
}

// /v1/models names the served model, as vLLM does.
func TestModels(t *testing.T) {
	_, url := front(t, simhttp.Config{Ranks: newEngines(t, 1, 8), Model: "served-name"})
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || len(m.Data) != 1 || m.Data[0].ID != "served-name" || m.Data[0].MaxModelLen != 8*bs {
		t.Errorf("/v1/models: %+v, %v", m, err)
	}
}

// With stream true the answer comes as vLLM's server-sent events: the
// text in chunks, the usage (cached tokens included) in a last chunk of
// its own when stream_options.include_usage asks for it, then [DONE].
func TestStream(t *testing.T) {
	_, url := front(t, simhttp.Config{Ranks: newEngines(t, 1, 64), Tokenizer: qwen(t)})
	msgs := `[{"role":"user","content":"` + strings.Repeat("Stream me the answer, chunk by chunk. ", 6) + `"}]`
	for _, tc := range []struct {
		name, path, body string
		usage            bool
	}{
		{"chat with usage", "/v1/chat/completions", `{"messages":` + msgs + `,"stream":true,"stream_options":{"include_usage":true},"max_tokens":3}`, true},
		{"chat", "/v1/chat/completions", `{"messages":` + msgs + `,"stream":true,"max_tokens":3}`, false},
		{"completion with usage", "/v1/completions", `{"prompt":[` + strings.TrimSuffix(strings.Repeat("9,", 40), ",") + `],"stream":true,"stream_options":{"include_usage":true},"max_tokens":3}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for turn := range 2 {
				resp, err := http.Post(url+tc.path, "application/json", strings.NewReader(tc.body))
				if err != nil {
					t.Fatal(err)
				}
				data, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
					t.Fatalf("%d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), data)
				}
				events := strings.Split(strings.TrimSuffix(string(data), "\n\n"), "\n\n")
				if events[len(events)-1] != "data: [DONE]" {
					t.Fatalf("the stream does not end with [DONE]: %q", data)
				}
				var text, finish string
				var usages []response
				for _, ev := range events[:len(events)-1] {
					var chunk struct {
						Choices []struct {
							Text         string `json:"text"`
							Delta        struct{ Content string }
							FinishReason *string `json:"finish_reason"`
						} `json:"choices"`
						Usage *json.RawMessage `json:"usage"`
					}
					payload, ok := strings.CutPrefix(ev, "data: ")
					if !ok || json.Unmarshal([]byte(payload), &chunk) != nil {
						t.Fatalf("not a data event: %q", ev)
					}
					for _, c := range chunk.Choices {
						text += c.Text + c.Delta.Content
						if c.FinishReason != nil {
							finish = *c.FinishReason
						}
					}
					if chunk.Usage != nil {
						var r response
						json.Unmarshal([]byte(payload), &r)
						usages = append(usages, r)
					}
				}
				if text != "This is a" || finish != "length" {
					t.Errorf("turn %d: text %q, finish %q", turn, text, finish)
				}
				switch {
				case !tc.usage && len(usages) != 0:
					t.Errorf("turn %d: usage sent unasked", turn)
				case tc.usage && len(usages) != 1:
					t.Errorf("turn %d: %d usage chunks, want 1", turn, len(usages))
				case tc.usage && (turn == 1) != (usages[0].Usage.PromptTokensDetails.CachedTokens > 0):
					t.Errorf("turn %d: usage %+v", turn, usages[0].Usage)
				}
			}
		})
	}
}
