package enginemetrics_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/enginesim/simhttp"
	"github.com/kvindex/kvindex/tokenizer"
)

const (
	testModel = "Qwen/Qwen2.5-7B-Instruct"
	bs        = 16
)

// clock is a settable time source: the window and the samples' ages
// follow it, not the wall clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

var loadTokenizer = sync.OnceValues(func() (*tokenizer.Local, error) {
	return tokenizer.LoadFile("../../tokenizer/testdata/qwen2.5/tokenizer.json.gz")
})

// engine is a simulated vLLM engine of some data-parallel ranks behind
// a real HTTP server, whose process can be restarted (a fresh engine
// with empty caches and counters behind the same URL).
type engine struct {
	t     testing.TB
	pod   string
	ranks int
	cur   atomic.Pointer[engineProc]
	srv   *httptest.Server
}

// engineProc is one process of an engine.
type engineProc struct {
	front *simhttp.Server
	ranks []*enginesim.Engine
}

func newEngine(t testing.TB, pod string, ranks int) *engine {
	t.Helper()
	e := &engine{t: t, pod: pod, ranks: ranks}
	e.Restart()
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.cur.Load().front.ServeHTTP(w, r)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// Restart replaces the engine's process with a fresh one.
func (e *engine) Restart() {
	e.t.Helper()
	tok, err := loadTokenizer()
	if err != nil {
		e.t.Fatal(err)
	}
	h, err := blockhash.New(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: bs})
	if err != nil {
		e.t.Fatal(err)
	}
	p := &engineProc{}
	for r := range e.ranks {
		en, err := enginesim.New(enginesim.Config{Pod: e.pod, Model: testModel, DPRank: r, Hasher: h, CapacityBlocks: 512})
		if err != nil {
			e.t.Fatal(err)
		}
		p.ranks = append(p.ranks, en)
	}
	p.front, err = simhttp.New(simhttp.Config{Ranks: p.ranks, Tokenizer: tok})
	if err != nil {
		e.t.Fatal(err)
	}
	e.cur.Store(p)
}

// Counters returns the current process's own prefix-cache counters,
// summed over its ranks.
func (e *engine) Counters() (queries, hits float64) {
	for _, r := range e.cur.Load().ranks {
		queries += float64(r.Queries())
		hits += float64(r.Hits())
	}
	return queries, hits
}

func (e *engine) MetricsURL() string { return e.srv.URL + "/metrics" }

// usage is a chat response's usage.
type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// chat sends a chat completion of the conversation's turns so far and
// returns its usage.
func (e *engine) Chat(turns ...string) usage {
	e.t.Helper()
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []msg{{"system", "You are a careful assistant who answers questions about the kvindex fleet, its engines and their caches, in plain words."}}
	for i, tu := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, msg{role, tu})
	}
	body, err := json.Marshal(map[string]any{"model": testModel, "messages": msgs, "max_tokens": 4})
	if err != nil {
		e.t.Fatal(err)
	}
	resp, err := http.Post(e.srv.URL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Usage usage `json:"usage"`
	}
	if resp.StatusCode != http.StatusOK {
		e.t.Fatalf("chat on %s: %s", e.pod, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		e.t.Fatal(err)
	}
	return out.Usage
}

// conversation returns n turns of a conversation about topic.
func conversation(topic string, n int) []string {
	var turns []string
	for i := range n {
		turns = append(turns, fmt.Sprintf("Turn %d about %s: tell me more about how %s behaves when the fleet is busy and many sessions share long prompts.", i, topic, topic))
	}
	return turns
}

// gather collects a collector's metrics through a pedantic registry,
// which also checks them against their descriptions, as name ->
// label value -> value.
func gather(t testing.TB, c prometheus.Collector) map[string]map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]float64{}
	for _, f := range fams {
		out[f.GetName()] = map[string]float64{}
		for _, m := range f.Metric {
			lv := ""
			for _, l := range m.Label {
				lv = l.GetValue()
			}
			out[f.GetName()][lv] = value(m)
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	if m.Gauge != nil {
		return m.Gauge.GetValue()
	}
	return m.Counter.GetValue()
}
