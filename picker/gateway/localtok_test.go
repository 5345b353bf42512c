package gateway_test

import (
	"bytes"
	"context"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/api/server"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/enginesim/simhttp"
	"github.com/kvindex/kvindex/picker/gateway"
	"github.com/kvindex/kvindex/tokenizer"
	"github.com/kvindex/kvindex/tokenizer/chattemplate"
)

// recordingIndex is kvindex (tokenizing text with tok) that records
// what each LongestPrefix query's prompt was sent as.
type recordingIndex struct {
	*server.Server
	mu  sync.Mutex
	got []*kvindexv1.Prompt
}

func (r *recordingIndex) LongestPrefix(ctx context.Context, req *kvindexv1.LongestPrefixRequest) (*kvindexv1.LongestPrefixResponse, error) {
	r.mu.Lock()
	r.got = append(r.got, req.GetPrompt())
	r.mu.Unlock()
	return r.Server.LongestPrefix(ctx, req)
}

// last is the prompt of the last query, and the kind it was sent as.
func (r *recordingIndex) last(t *testing.T) (*kvindexv1.Prompt, string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.got) == 0 {
		t.Fatal("the index was asked nothing")
	}
	p := r.got[len(r.got)-1]
	switch p.GetInput().(type) {
	case *kvindexv1.Prompt_BlockHashes:
		return p, "hashes"
	case *kvindexv1.Prompt_Tokens:
		return p, "tokens"
	case *kvindexv1.Prompt_Text:
		return p, "text"
	case *kvindexv1.Prompt_Messages:
		return p, "messages"
	}
	return p, "?"
}

// tokenizingSetup is a picker with a local tokenizer (local), asking a
// kvindex over gRPC, routing to simulated vLLM engines that tokenize with
// Qwen2.5's tokenizer.json and render chat as ChatML (kvindex sim's).
type tokenizingSetup struct {
	svc    *gateway.Service
	reg    *prometheus.Registry
	index  *recordingIndex
	engine string // an engine's base URL
	log    *bytes.Buffer
}

func qwenTokenizer(t *testing.T) *tokenizer.Local {
	t.Helper()
	l, err := tokenizer.LoadFile("../../tokenizer/testdata/qwen2.5/tokenizer.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// chatLocal is the Qwen2.5 tokenizer with the chat template in
// tokenizer/chattemplate/testdata/templates/NAME.
func chatLocal(t *testing.T, l *tokenizer.Local, name string) *tokenizer.ChatLocal {
	t.Helper()
	tmpl, err := chattemplate.Load("../../tokenizer/chattemplate/testdata/templates/"+name, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &tokenizer.ChatLocal{Local: l, Template: tmpl}
}

func newTokenizingSetup(t *testing.T, local tokenizer.Tokenizer, model string) *tokenizingSetup {
	t.Helper()
	l := qwenTokenizer(t)
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: bs})
	ix, err := indexer.New(indexer.Options{Hasher: h})
	if err != nil {
		t.Fatal(err)
	}
	var eps []gateway.Endpoint
	for _, pod := range []string{"pod-a", "pod-b"} {
		eng, err := enginesim.New(enginesim.Config{Pod: pod, Model: testModel, Hasher: h, CapacityBlocks: 64})
		if err != nil {
			t.Fatal(err)
		}
		front, err := simhttp.New(simhttp.Config{Ranks: []*enginesim.Engine{eng}, Tokenizer: l})
		if err != nil {
			t.Fatal(err)
		}
		if err := front.Start("127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { front.Close() })
		eps = append(eps, gateway.Endpoint{Pod: pod, Addr: front.Addr().String()})
	}
	engine, err := tokenizer.NewHTTP(tokenizer.HTTPConfig{BaseURL: "http://" + eps[0].Addr})
	if err != nil {
		t.Fatal(err)
	}
	// kvindex serve --tokenize-url ENGINE --tokenizer qwen2.5 --chat-template qwen2.5
	srv, err := server.New(server.Config{Index: ix, BlockSize: bs, Hasher: h, DefaultModel: testModel, ReadyGrace: -1,
		Tokenizers: []server.NamedTokenizer{{Source: client.SourceEngine, Tokenizer: engine}, {Source: client.SourceLocal, Tokenizer: chatLocal(t, l, "qwen2.5.json")}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	st := &tokenizingSetup{index: &recordingIndex{Server: srv}, log: new(bytes.Buffer), engine: "http://" + eps[0].Addr}
	addr := serveGRPC(t, func(gs grpc.ServiceRegistrar) { kvindexv1.RegisterIndexServiceServer(gs, st.index) })
	st.reg = prometheus.NewRegistry()
	cfg := gateway.Config{Endpoints: eps, Scorer: noSpeculation(), IndexTimeout: waitFor, Registry: st.reg,
		Tokenizer: local, TokenizerModel: model, Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: st.log}, nil))}
	if st.svc, err = gateway.New(cfg, remote(t, addr)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := st.svc.Warm(ctx, waitFor); err != nil {
		t.Fatal(err)
	}
	return st
}

// pick routes body and returns what the index was sent.
func (st *tokenizingSetup) pick(t *testing.T, body string) (*kvindexv1.Prompt, string) {
	t.Helper()
	r, err := gateway.ParseRequest([]byte(body), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	d, done, err := st.svc.Pick(context.Background(), r, nil)
	if err != nil {
		t.Fatal(err)
	}
	done()
	if d.Fallback != "" {
		t.Fatalf("routed without the index: %s", d.Fallback)
	}
	return st.index.last(t)
}

// engineKeys are the block keys of the engine's own ids for in (its
// /tokenize), as the picker hashes them.
func (st *tokenizingSetup) engineKeys(t *testing.T, in tokenizer.Input) []uint64 {
	t.Helper()
	eng, err := tokenizer.NewHTTP(tokenizer.HTTPConfig{BaseURL: st.engine})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := eng.Tokenize(context.Background(), testModel, in)
	if err != nil {
		t.Fatal(err)
	}
	return st.svc.PromptKeys(&gateway.Request{Tokens: ids, Prompt: client.TokensPrompt(ids)})
}

func gauge(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if mf.GetName() == name && l.GetValue() == label {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{%s}", name, label)
	return 0
}

const (
	longText = "The quick brown fox jumps over the lazy dog. A kvindex picker routes each request to the engine that holds the longest prefix of its prompt, so that its prefill is short."
	chatBody = `{"model":"qwen","messages":[{"role":"system","content":"You are a helpful assistant who answers at length."},` +
		`{"role":"user","content":"` + longText + `"},{"role":"assistant","content":"Indeed."},{"role":"user","content":"Tell me more about prefixes."}]}`
	textBody  = `{"model":"qwen","prompt":"` + longText + `"}`
	partsBody = `{"model":"qwen","messages":[{"role":"user","content":[{"type":"text","text":"` + longText + `"}]}]}`
)

func chatInput() tokenizer.Input {
	return tokenizer.Input{Messages: []tokenizer.Message{
		{Role: "system", Content: "You are a helpful assistant who answers at length."}, {Role: "user", Content: longText},
		{Role: "assistant", Content: "Indeed."}, {Role: "user", Content: "Tell me more about prefixes."}}}
}

// A local tokenizer that gives the engines' ids is verified at start,
// and text and chat prompts then reach the index as the block keys of
// the engine's own ids; content parts, which the local template cannot
// render exactly, go to the index as messages.
func TestLocalTokenizerVerified(t *testing.T) {
	st := newTokenizingSetup(t, chatLocal(t, qwenTokenizer(t), "qwen2.5.json"), "")
	for _, f := range []string{"completion", "chat"} {
		if v := gauge(t, st.reg, "kvindex_picker_local_tokenizer_verified", f); v != -1 {
			t.Errorf("%s verified %v before the check; want -1", f, v)
		}
	}
	st.svc.CheckTokenizer(context.Background(), tokenizer.CheckConfig{})
	for _, f := range []string{"completion", "chat"} {
		if v := gauge(t, st.reg, "kvindex_picker_local_tokenizer_verified", f); v != 1 {
			t.Errorf("%s verified %v; want 1\n%s", f, v, st.log)
		}
	}
	for _, tc := range []struct {
		body string
		in   tokenizer.Input
	}{{textBody, tokenizer.Input{Prompt: longText}}, {chatBody, chatInput()}} {
		p, kind := st.pick(t, tc.body)
		want := st.engineKeys(t, tc.in)
		if kind != "hashes" || len(want) == 0 || !slices.Equal(p.GetBlockHashes().GetHashes(), want) {
			t.Errorf("%s: the index got %s %v; want the hashes %v", tc.body, kind, p.GetBlockHashes().GetHashes(), want)
		}
	}
	if _, kind := st.pick(t, partsBody); kind != "messages" {
		t.Errorf("content parts: the index got %s; want messages", kind)
	}
	for result, want := range map[string]float64{"ok": 2, "unsupported": 1, "disabled": 0, "error": 0} {
		if n := mustVec(t, st.reg, "kvindex_picker_local_tokenize_total", result); n != want {
			t.Errorf("local tokenize %s: %v; want %v", result, n, want)
		}
	}
}

// A chat template the engines do not render (here Phi-3.5's, where the
// engines write ChatML): the check warns, naming the sample and where
// the ids part, chat prompts go to the index as messages from then on,
// and completion prompts are still tokenized in the picker.
func TestLocalTokenizerChatDiffers(t *testing.T) {
	st := newTokenizingSetup(t, chatLocal(t, qwenTokenizer(t), "phi-3.5-mini.jinja"), "")
	st.svc.CheckTokenizer(context.Background(), tokenizer.CheckConfig{})
	if v := gauge(t, st.reg, "kvindex_picker_local_tokenizer_verified", "chat"); v != 0 {
		t.Errorf("chat verified %v; want 0", v)
	}
	if v := gauge(t, st.reg, "kvindex_picker_local_tokenizer_verified", "completion"); v != 1 {
		t.Errorf("completion verified %v; want 1", v)
	}
	log := st.log.String()
	if !strings.Contains(log, "level=WARN") || !strings.Contains(log, `sample \"chat\"`) || !strings.Contains(log, "first at position") {
		t.Errorf("no WARN naming the chat sample and the position:\n%s", log)
	}
	if _, kind := st.pick(t, chatBody); kind != "messages" {
		t.Errorf("chat: the index got %s; want messages", kind)
	}
	if _, kind := st.pick(t, textBody); kind != "hashes" {
		t.Errorf("text: the index got %s; want hashes", kind)
	}
	if n := mustVec(t, st.reg, "kvindex_picker_local_tokenize_total", "disabled"); n != 1 {
		t.Errorf("local tokenize disabled: %v; want 1", n)
	}
}

// A tokenizer without a chat template does completion prompts only, and
// one for another model than the request's does none.
func TestLocalTokenizerScope(t *testing.T) {
	st := newTokenizingSetup(t, qwenTokenizer(t), "")
	st.svc.CheckTokenizer(context.Background(), tokenizer.CheckConfig{})
	if v := gauge(t, st.reg, "kvindex_picker_local_tokenizer_verified", "chat"); v != 0 {
		t.Errorf("chat verified %v; want 0 (no template)", v)
	}
	if _, kind := st.pick(t, chatBody); kind != "messages" {
		t.Errorf("chat: the index got %s; want messages", kind)
	}
	if _, kind := st.pick(t, textBody); kind != "hashes" {
		t.Errorf("text: the index got %s; want hashes", kind)
	}

	other := newTokenizingSetup(t, qwenTokenizer(t), "another-model")
	for _, body := range []string{textBody, chatBody} {
		if _, kind := other.pick(t, body); kind == "hashes" {
			t.Errorf("%s for another model than the tokenizer's: the index got hashes", body)
		}
	}
	var n float64
	for _, r := range []string{"ok", "unsupported", "disabled", "error"} {
		n += mustVec(t, other.reg, "kvindex_picker_local_tokenize_total", r)
	}
	if n != 0 {
		t.Errorf("the tokenizer for another model was given %v prompts; want none", n)
	}
}

// The picker exports its tokenizer's segment cache under the names
// kvindex serve gives its own: a chat sent again is encoded from the
// cache, segment by segment.
func TestLocalTokenizerSegmentMetrics(t *testing.T) {
	cl := chatLocal(t, qwenTokenizer(t), "qwen2.5.json")
	cl.Local = cl.Local.WithSegmentCache(1 << 20)
	st := newTokenizingSetup(t, cl, "")
	st.pick(t, chatBody)
	misses := mustVec(t, st.reg, "kvindex_tokenizer_segments_total", "miss")
	hits := mustVec(t, st.reg, "kvindex_tokenizer_segments_total", "hit") // segments repeated within the chat
	if misses == 0 {
		t.Fatal("first chat: no segment encoded")
	}
	st.pick(t, chatBody)
	if h, m := mustVec(t, st.reg, "kvindex_tokenizer_segments_total", "hit"), mustVec(t, st.reg, "kvindex_tokenizer_segments_total", "miss"); h != 2*hits+misses || m != misses {
		t.Errorf("the same chat again: %v segments from the cache and %v encoded in all; want %v and %v", h, m, 2*hits+misses, misses)
	}
	if b := gauge(t, st.reg, "kvindex_tokenizer_cache_bytes", "local"); b <= 0 || b > 1<<20 {
		t.Errorf("segment cache bytes %v; want within (0, 1 MiB]", b)
	}
}

// concurrencyProbe is a tokenizer that records how many of its calls run
// at once, each call held until release is closed.
type concurrencyProbe struct {
	tokenizer.Tokenizer
	mu        sync.Mutex
	now, most int
	entered   chan struct{}
	release   chan struct{}
}

func (c *concurrencyProbe) Tokenize(ctx context.Context, model string, in tokenizer.Input) ([]uint64, error) {
	c.mu.Lock()
	c.now++
	c.most = max(c.most, c.now)
	c.mu.Unlock()
	c.entered <- struct{}{}
	<-c.release
	c.mu.Lock()
	c.now--
	c.mu.Unlock()
	return c.Tokenizer.Tokenize(ctx, model, in)
}

// Requests do their CPU work (here: tokenizing) at most one fewer at
// once than the cores Go runs on (at least one): picks beyond wait their
// turn, so that preparing requests never takes every core from the index
// queries under way.
func TestCPUSlots(t *testing.T) {
	probe := &concurrencyProbe{Tokenizer: qwenTokenizer(t), entered: make(chan struct{}, 64), release: make(chan struct{})}
	st := newTokenizingSetup(t, probe, "")
	slots := max(runtime.GOMAXPROCS(0)-1, 1)
	const picks = 8
	var wg sync.WaitGroup
	for range picks {
		wg.Go(func() { st.pick(t, textBody) })
	}
	for range slots {
		<-probe.entered
	}
	// The slots are taken; no further call may enter while they are held.
	select {
	case <-probe.entered:
		t.Fatalf("a tokenization beyond the %d slots started", slots)
	case <-time.After(50 * time.Millisecond): // a bounded look for what must not happen
	}
	close(probe.release)
	for range picks - slots {
		<-probe.entered
	}
	wg.Wait()
	if probe.most != slots {
		t.Errorf("at most %d tokenizations ran at once, want %d", probe.most, slots)
	}
}
