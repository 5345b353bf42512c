package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/tokenizer"
)

// matchRow is a PodMatch reduced to what tests compare.
type matchRow struct {
	pod    string
	rank   uint32
	blocks uint32
	tokens uint32
	gpu    uint32
}

func rows(r *kvindexv1.LongestPrefixResponse) []matchRow {
	var out []matchRow
	for _, p := range r.GetPods() {
		out = append(out, matchRow{p.GetPod(), p.GetDpRank(), p.GetMatchedBlocks(), p.GetMatchedTokens(), p.GetTiers()["GPU"]})
	}
	return out
}

// loadThree stores a prompt's leading blocks on three engines: a/0 holds
// 4 blocks, b/1 holds 3, b/0 holds 2.
func loadThree(t *testing.T, f *fixture, tokens []uint64) {
	t.Helper()
	f.hub.Apply(engine("a", 0), 0, []kvevents.Event{stored(t, tokens, 4)})
	f.hub.Apply(engine("b", 0), 0, []kvevents.Event{stored(t, tokens, 2)})
	f.hub.Apply(engine("b", 1), 0, []kvevents.Event{stored(t, tokens, 3)})
}

func TestLongestPrefix(t *testing.T) {
	f := newFixture(t, nil)
	tokens := testutil.Seq(1000, 5*testBlockSize+3)
	loadThree(t, f, tokens)
	ctx := context.Background()
	keys := chainKeys(t, tokens, nil)

	all := []matchRow{{"a", 0, 4, 64, 4}, {"b", 1, 3, 48, 3}, {"b", 0, 2, 32, 2}}
	tests := []struct {
		name         string
		prompt       *kvindexv1.Prompt
		opts         *client.QueryOptions
		want         []matchRow
		promptTokens uint32
		source       string
	}{
		{"tokens", client.TokensPrompt(tokens), nil, all, 83, client.SourceCaller},
		{"hashes", client.HashesPrompt(keys), nil, all, 0, client.SourceHashes},
		{"candidates", client.TokensPrompt(tokens), &client.QueryOptions{Candidates: []string{"b"}}, all[1:], 83, client.SourceCaller},
		{"other prefix", client.TokensPrompt(testutil.Seq(7, 80)), nil,
			[]matchRow{{"a", 0, 0, 0, 0}, {"b", 0, 0, 0, 0}, {"b", 1, 0, 0, 0}}, 80, client.SourceCaller},
		{"salted", client.TokensPrompt(tokens), &client.QueryOptions{CacheSalt: "s"},
			[]matchRow{{"a", 0, 0, 0, 0}, {"b", 0, 0, 0, 0}, {"b", 1, 0, 0, 0}}, 83, client.SourceCaller},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := f.client.LongestPrefix(ctx, testModel, tc.prompt, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if got := rows(r); !slices.Equal(got, tc.want) {
				t.Errorf("pods = %v, want %v", got, tc.want)
			}
			if r.GetBlocksTotal() != 5 || r.GetBlockSize() != testBlockSize {
				t.Errorf("blocks_total, block_size = %d, %d, want 5, %d", r.GetBlocksTotal(), r.GetBlockSize(), testBlockSize)
			}
			if r.GetPromptTokens() != tc.promptTokens || r.GetTokenSource() != tc.source {
				t.Errorf("prompt_tokens, token_source = %d, %q, want %d, %q", r.GetPromptTokens(), r.GetTokenSource(), tc.promptTokens, tc.source)
			}
		})
	}
}

// The default model applies to requests without one.
func TestLongestPrefixDefaultModel(t *testing.T) {
	f := newFixture(t, nil)
	tokens := testutil.Seq(1, 32)
	f.hub.Apply(engine("a", 0), 0, []kvevents.Event{stored(t, tokens, 2)})
	r, err := f.client.LongestPrefixTokens(context.Background(), "", tokens, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := rows(r); !slices.Equal(got, []matchRow{{"a", 0, 2, 32, 2}}) {
		t.Errorf("pods = %v", got)
	}
	// A model kvindex does not know is NotFound, naming the known ones.
	r, err = f.client.LongestPrefixTokens(context.Background(), "other-model", tokens, nil)
	if st := status.Convert(err); st.Code() != codes.NotFound || st.Message() != `unknown model "other-model": kvindex follows "qwen"` {
		t.Errorf("another model's query: %v, %v", rows(r), err)
	}
}

func localTokenizer(t testing.TB) *tokenizer.Local {
	t.Helper()
	tk, err := tokenizer.LoadFile("../../tokenizer/testdata/qwen2.5/tokenizer.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

const longText = `The KV cache of a transformer holds the keys and values of every token
it has seen. A router that knows which replica already holds a prompt's prefix
can send the request there and skip recomputing it, which saves time to first
token. kvindex mirrors the engines' block hashing so that it can answer that
question for any prompt, block by block, without asking the engines.`

// A text prompt tokenized locally answers as its token ids do.
func TestTextMatchesTokens(t *testing.T) {
	tk := localTokenizer(t)
	f := newFixture(t, func(c *Config) { c.Tokenizers = []NamedTokenizer{{client.SourceLocal, tk}} })
	ids, err := tk.Tokenize(context.Background(), testModel, tokenizer.Input{Prompt: longText})
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) < 3*testBlockSize {
		t.Fatalf("text has %d tokens; the test needs 3 blocks", len(ids))
	}
	f.hub.Apply(engine("a", 0), 0, []kvevents.Event{stored(t, ids, 3)})
	f.hub.Apply(engine("b", 0), 0, []kvevents.Event{stored(t, ids, 1)})
	ctx := context.Background()
	byText, err := f.client.LongestPrefixText(ctx, testModel, longText, nil)
	if err != nil {
		t.Fatal(err)
	}
	byIDs, err := f.client.LongestPrefixTokens(ctx, testModel, ids, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := rows(byText), rows(byIDs); !slices.Equal(a, b) || len(a) != 2 || a[0].blocks != 3 {
		t.Errorf("by text %v, by ids %v; want equal, a with 3 blocks", a, b)
	}
	if byText.GetTokenSource() != client.SourceLocal || byText.GetPromptTokens() != uint32(len(ids)) {
		t.Errorf("token_source %q prompt_tokens %d", byText.GetTokenSource(), byText.GetPromptTokens())
	}

	scores, err := f.client.PodScores(ctx, testModel, longText, []string{"b", "a", "c"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range scores {
		got = append(got, fmt.Sprintf("%s=%g", s.GetPod(), s.GetScore()))
	}
	if want := []string{"a=3", "b=1", "c=0"}; !slices.Equal(got, want) {
		t.Errorf("GetPodScores = %v, want %v", got, want)
	}
}

// GetPodScores and LongestPrefix resolve a prompt through one path: for
// the same text, candidates and model, each pod's score is the most
// blocks any of its ranks matched in LongestPrefix, and both refuse the
// same bad requests with the same code.
func TestPodScoresAgreeWithLongestPrefix(t *testing.T) {
	tk := localTokenizer(t)
	f := newFixture(t, func(c *Config) { c.Tokenizers = []NamedTokenizer{{client.SourceLocal, tk}} })
	text := longText + "\n" + longText
	ids, err := tk.Tokenize(context.Background(), testModel, tokenizer.Input{Prompt: text})
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) < 5*testBlockSize {
		t.Fatalf("text has %d tokens; the test needs 5 blocks", len(ids))
	}
	loadThree(t, f, ids)
	ctx := context.Background()

	tests := []struct {
		name       string
		model      string
		text       string
		candidates []string
		code       codes.Code
		scores     string // both answers, as pod:blocks
		lpMsg      string // LongestPrefix's error contains it
		psMsg      string // GetPodScores's error contains it
	}{
		{"all pods", testModel, text, nil, codes.OK, "map[a:4 b:3]", "", ""},
		{"one candidate", testModel, text, []string{"b"}, codes.OK, "map[b:3]", "", ""},
		{"unknown candidate", testModel, text, []string{"c", "a"}, codes.OK, "map[a:4 c:0]", "", ""},
		{"other prompt", testModel, "an unrelated prompt that no engine holds", nil, codes.OK, "map[a:0 b:0]", "", ""},
		{"other model", "other-model", text, nil, codes.NotFound, "", `unknown model "other-model"`, `unknown model "other-model"`},
		{"default model", "", text, []string{"a", "b"}, codes.OK, "map[a:4 b:3]", "", ""},
		// Each names the field of its own request.
		{"empty candidate", testModel, text, []string{"a", ""}, codes.InvalidArgument, "", "candidate_pods[1]", "pod_identifiers[1]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lp, lpErr := f.client.Index.LongestPrefix(ctx, &kvindexv1.LongestPrefixRequest{
				Model: tc.model, Prompt: client.TextPrompt(tc.text), CandidatePods: tc.candidates,
			})
			scores, psErr := f.client.PodScores(ctx, tc.model, tc.text, tc.candidates)
			if c1, c2 := status.Code(lpErr), status.Code(psErr); c1 != tc.code || c2 != tc.code {
				t.Fatalf("LongestPrefix: %v; GetPodScores: %v; want code %v from both", lpErr, psErr, tc.code)
			}
			if tc.code != codes.OK {
				if !strings.Contains(lpErr.Error(), tc.lpMsg) || !strings.Contains(psErr.Error(), tc.psMsg) {
					t.Errorf("LongestPrefix: %v; GetPodScores: %v; want them to contain %q and %q", lpErr, psErr, tc.lpMsg, tc.psMsg)
				}
				return
			}
			want := map[string]float64{}
			for _, c := range tc.candidates {
				want[c] = 0
			}
			for _, p := range lp.GetPods() {
				want[p.GetPod()] = max(want[p.GetPod()], float64(p.GetMatchedBlocks()))
			}
			got := map[string]float64{}
			for _, s := range scores {
				if _, dup := got[s.GetPod()]; dup {
					t.Errorf("GetPodScores lists pod %q twice", s.GetPod())
				}
				got[s.GetPod()] = s.GetScore()
			}
			if fmt.Sprint(got) != fmt.Sprint(want) || fmt.Sprint(want) != tc.scores {
				t.Errorf("GetPodScores = %v, LongestPrefix matched blocks per pod = %v; want both %s", got, want, tc.scores)
			}
		})
	}
}

// vllmTokenize is a stand-in for an engine's /tokenize: it answers
// with fixed ids, or with an error status.
func vllmTokenize(t *testing.T, ids []uint64, code int) *httptest.Server {
	t.Helper()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/tokenize" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		if code != http.StatusOK {
			w.Write([]byte(`{"error":{"message":"The model 'nope' does not exist."}}`))
			return
		}
		fmt.Fprintf(w, `{"count":%d,"max_model_len":4096,"tokens":%s}`, len(ids), fmtIDs(ids))
	}))
	t.Cleanup(hs.Close)
	return hs
}

func engineTokenizer(t *testing.T, url string) *tokenizer.HTTP {
	t.Helper()
	tk, err := tokenizer.NewHTTP(tokenizer.HTTPConfig{BaseURL: url, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func TestChatThroughEngineTokenizer(t *testing.T) {
	ids := testutil.Seq(50, 32)
	hs := vllmTokenize(t, ids, http.StatusOK)
	f := newFixture(t, func(c *Config) {
		c.Tokenizers = []NamedTokenizer{{client.SourceEngine, engineTokenizer(t, hs.URL)}, {client.SourceLocal, localTokenizer(t)}}
	})
	f.hub.Apply(engine("a", 0), 0, []kvevents.Event{stored(t, ids, 2)})
	r, err := f.client.LongestPrefixMessages(context.Background(), testModel, []*kvindexv1.ChatMessage{{Role: "user", Content: "hi"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := rows(r); !slices.Equal(got, []matchRow{{"a", 0, 2, 32, 2}}) || r.GetTokenSource() != client.SourceEngine {
		t.Errorf("pods %v source %q", got, r.GetTokenSource())
	}
}

func fmtIDs(ids []uint64) string {
	b, _ := json.Marshal(ids)
	return string(b)
}

func uitoa(v uint64) string { return strconv.FormatUint(v, 10) }

func TestErrorCodes(t *testing.T) {
	tk := localTokenizer(t)
	downURL := "http://" + testutil.FreeAddr(t)
	down := engineTokenizer(t, downURL)
	refusing := engineTokenizer(t, vllmTokenize(t, nil, http.StatusNotFound).URL)
	f := newFixture(t, func(c *Config) { c.MaxTokens = 64; c.DefaultModel = "" })
	local := newFixture(t, func(c *Config) { c.Tokenizers = []NamedTokenizer{{client.SourceLocal, tk}} })
	unreachable := newFixture(t, func(c *Config) {
		c.Tokenizers = []NamedTokenizer{{client.SourceEngine, down}, {client.SourceLocal, tk}}
	})
	refused := newFixture(t, func(c *Config) { c.Tokenizers = []NamedTokenizer{{client.SourceEngine, refusing}} })
	// The requests are for model "m", which each kvindex knows from an
	// engine's (empty) batch.
	for _, x := range []*fixture{f, local, unreachable, refused} {
		x.hub.Apply(kvevents.EngineID{Model: "m", Pod: "p"}, 0, nil)
	}

	req := func(model string, p *kvindexv1.Prompt, cands ...string) *kvindexv1.LongestPrefixRequest {
		return &kvindexv1.LongestPrefixRequest{Model: model, Prompt: p, CandidatePods: cands}
	}
	withSalt := client.HashesPrompt([]uint64{1})
	withSalt.CacheSalt = "x"
	mmBeyond := client.TokensPrompt(testutil.Seq(0, 16))
	mmBeyond.MmItems = []*kvindexv1.MultimodalItem{{Identifier: "img", Offset: 10, Length: 10}}
	mmUnsorted := client.TokensPrompt(testutil.Seq(0, 48))
	mmUnsorted.MmItems = []*kvindexv1.MultimodalItem{{Identifier: "a", Offset: 20, Length: 4}, {Identifier: "b", Offset: 2, Length: 4}}

	tests := []struct {
		name string
		f    *fixture
		req  *kvindexv1.LongestPrefixRequest
		code codes.Code
		msg  string
	}{
		{"no prompt", f, req("m", nil), codes.InvalidArgument, "prompt is required"},
		{"empty prompt", f, req("m", &kvindexv1.Prompt{}), codes.InvalidArgument, "prompt is required"},
		{"no model", f, req("", client.TokensPrompt([]uint64{1})), codes.InvalidArgument, "model is required"},
		{"too many tokens", f, req("m", client.TokensPrompt(testutil.Seq(0, 65))), codes.InvalidArgument, "65 tokens; the limit is 64"},
		{"too many hashes", f, req("m", client.HashesPrompt(testutil.Seq(0, 5))), codes.InvalidArgument, "5 block hashes; the limit is 4"},
		{"hashes with salt", f, req("m", withSalt), codes.InvalidArgument, "do not apply to block_hashes"},
		{"empty candidate", f, req("m", client.TokensPrompt([]uint64{1}), "a", ""), codes.InvalidArgument, "candidate_pods[1] is empty"},
		{"mm beyond prompt", f, req("m", mmBeyond), codes.InvalidArgument, "beyond the prompt's 16 tokens"},
		{"mm unsorted", f, req("m", mmUnsorted), codes.InvalidArgument, "must be sorted by offset"},
		{"empty messages", local, req("m", client.MessagesPrompt()), codes.InvalidArgument, "prompt.messages is empty"},
		{"message without role", local, req("m", client.MessagesPrompt(&kvindexv1.ChatMessage{Role: "", Content: "hi"})), codes.InvalidArgument, "has no role"},
		{"text without tokenizer", f, req("m", client.TextPrompt("hello")), codes.FailedPrecondition, "need a tokenizer"},
		{"chat with local tokenizer", local, req("m", client.MessagesPrompt(&kvindexv1.ChatMessage{Role: "user", Content: "hi"})), codes.FailedPrecondition, "chat templates"},
		{"engine down, chat", unreachable, req("m", client.MessagesPrompt(&kvindexv1.ChatMessage{Role: "user", Content: "hi"})), codes.Unavailable,
			"cannot tokenize the prompt: the engine's /tokenize at " + downURL + " is unreachable: dial tcp "},
		{"engine refuses", refused, req("m", client.TextPrompt("hi")), codes.InvalidArgument, "the engine's /tokenize at " + refusing.URL()[:len(refusing.URL())-len("/tokenize")] + " answered HTTP 404: The model 'nope' does not exist."},
		{"unknown model", f, req("x", client.TokensPrompt([]uint64{1})), codes.NotFound, `unknown model "x": kvindex follows "m"`},
		{"unknown model, none known", refused, req("x", client.TokensPrompt([]uint64{1})), codes.NotFound, `unknown model "x": kvindex follows "m", "qwen"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.f.client.Index.LongestPrefix(context.Background(), tc.req)
			st := status.Convert(err)
			if st.Code() != tc.code || !strings.Contains(st.Message(), tc.msg) {
				t.Errorf("got %v %q, want %v containing %q", st.Code(), st.Message(), tc.code, tc.msg)
			}
		})
	}

	// A text prompt survives the engine being down: the local tokenizer
	// answers.
	r, err := unreachable.client.LongestPrefixText(context.Background(), testModel, "hello world", nil)
	if err != nil || r.GetTokenSource() != client.SourceLocal {
		t.Errorf("fallback to the local tokenizer: %v, source %q", err, r.GetTokenSource())
	}
}

// A request beyond the gRPC message limit is refused by the transport
// with ResourceExhausted, before any decoding.
func TestMessageSizeLimit(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.MaxTokens = 1000 })
	big := make([]uint64, 300_000)
	for i := range big {
		big[i] = 1 << 40 // 6-byte varints: 1.8 MB
	}
	_, err := f.client.LongestPrefixTokens(context.Background(), testModel, big, nil)
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("got %v, want ResourceExhausted", err)
	}
}

func TestLookup(t *testing.T) {
	f := newFixture(t, nil)
	loadThree(t, f, testutil.Seq(1000, 4*testBlockSize))
	tokens := testutil.Seq(1000, 3*testBlockSize)
	r, err := f.client.LookupTokens(context.Background(), testModel, tokens, nil)
	if err != nil {
		t.Fatal(err)
	}
	keys := chainKeys(t, tokens, nil)
	want := [][]string{{"a/0", "b/0", "b/1"}, {"a/0", "b/0", "b/1"}, {"a/0", "b/1"}}
	if len(r.GetBlocks()) != 3 {
		t.Fatalf("%d blocks, want 3", len(r.GetBlocks()))
	}
	for i, b := range r.GetBlocks() {
		var holders []string
		for _, h := range b.GetHolders() {
			holders = append(holders, h.GetPod()+"/"+uitoa(uint64(h.GetDpRank())))
			if h.GetMedium() != "GPU" {
				t.Errorf("block %d holder %v medium %q", i, h, h.GetMedium())
			}
		}
		slices.Sort(holders)
		if b.GetIndex() != uint32(i) || b.GetHash() != keys[i] || !slices.Equal(holders, want[i]) {
			t.Errorf("block %d = index %d hash %d holders %v, want hash %d holders %v", i, b.GetIndex(), b.GetHash(), holders, keys[i], want[i])
		}
	}
}

func TestListPods(t *testing.T) {
	streams := &fakeStreams{}
	f := newFixture(t, func(c *Config) { c.Streams = streams })
	tokens := testutil.Seq(1000, 4*testBlockSize)
	loadThree(t, f, tokens)
	offloaded := stored(t, tokens, 2)
	offloaded.Medium = "CPU"
	f.hub.Apply(engine("b", 1), 1, []kvevents.Event{offloaded})
	last := time.UnixMilli(1_700_000_000_123)
	streams.set(
		kvevents.StreamStats{Engine: engine("a", 0), Endpoint: "tcp://a:5557", Connected: true, LastSeq: 9, Batches: 10, Events: 20, Gaps: 1, ReplaysOK: 1, LastEventUnixNano: last.UnixNano(),
			LastBatchStampUnixNano: last.Add(-30 * time.Second).UnixNano(), LastBatchLag: 30 * time.Second},
		kvevents.StreamStats{Engine: engine("b", 0), Endpoint: "tcp://b:5557", Connected: true, Health: kvevents.HealthDegraded, ReplaysFailed: 2},
		kvevents.StreamStats{Engine: engine("c", 0), Endpoint: "tcp://c:5557"},
		kvevents.StreamStats{Engine: kvevents.EngineID{Model: "other", Pod: "d"}, Connected: true},
	)
	pods, err := f.client.ListPods(context.Background(), testModel)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		name     string
		endpoint string
		health   string
		blocks   uint64
		media    string
		check    string
	}
	var got []row
	for _, p := range pods {
		got = append(got, row{p.GetPod() + "/" + uitoa(uint64(p.GetDpRank())), p.GetEndpoint(), client.HealthName(p.GetHealth()), p.GetBlocks(), fmt.Sprint(p.GetBlocksByMedium()), client.HashCheckName(p.GetHashCheck())})
	}
	want := []row{
		{"a/0", "tcp://a:5557", "ok", 4, "map[GPU:4]", "verified"},
		{"b/0", "tcp://b:5557", "degraded", 2, "map[GPU:2]", "verified"},
		{"b/1", "", "unknown", 5, "map[CPU:2 GPU:3]", "verified"},
		{"c/0", "tcp://c:5557", "disconnected", 0, "map[]", "unknown"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("pods:\n got %v\nwant %v", got, want)
	}
	// The JSON form carries the split too, as an object even when empty.
	var pj client.PodsJSON
	resp, err := http.Get(f.url + "/v1/pods?model=" + testModel)
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&pj)
	resp.Body.Close()
	if err != nil || len(pj.Pods) != 4 {
		t.Fatalf("/v1/pods: %v, %+v", err, pj)
	}
	if m := pj.Pods[2].BlocksByMedium; pj.Pods[2].Pod != "b" || m["CPU"] != 2 || m["GPU"] != 3 || len(m) != 2 || pj.Pods[3].BlocksByMedium == nil {
		t.Errorf("/v1/pods: %+v", pj.Pods)
	}
	a := pods[0]
	if a.GetLastSeq() != 9 || a.GetBatches() != 10 || a.GetEvents() != 20 || a.GetGaps() != 1 || a.GetReplaysOk() != 1 || a.GetLastEventUnixMs() != last.UnixMilli() {
		t.Errorf("a's counters: %v", a)
	}
	if a.LastBatchLagSeconds == nil || a.GetLastBatchLagSeconds() != 30 {
		t.Errorf("a's lag = %v, want 30 s", a.LastBatchLagSeconds)
	}
	if b := pods[1]; b.LastBatchLagSeconds != nil {
		t.Errorf("b sent no stamped batch, yet its lag is %v", b.GetLastBatchLagSeconds())
	}
	all, err := f.client.ListPods(context.Background(), "")
	if err != nil || len(all) != 5 {
		t.Errorf("all models: %d pods, %v; want 5", len(all), err)
	}
}

// Query answers carry each engine's stream health.
func TestLongestPrefixHealth(t *testing.T) {
	streams := &fakeStreams{}
	streams.set(
		kvevents.StreamStats{Engine: engine("a", 0), Connected: true},
		kvevents.StreamStats{Engine: engine("b", 0), Connected: true, Health: kvevents.HealthDegraded},
	)
	f := newFixture(t, func(c *Config) { c.Streams = streams })
	tokens := testutil.Seq(1, 64)
	loadThree(t, f, tokens)
	r, err := f.client.LongestPrefixTokens(context.Background(), testModel, tokens, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range r.GetPods() {
		got = append(got, p.GetPod()+"/"+uitoa(uint64(p.GetDpRank()))+":"+client.HealthName(p.GetHealth())+":"+client.HashCheckName(p.GetHashCheck()))
	}
	if want := []string{"a/0:ok:verified", "b/1:unknown:verified", "b/0:degraded:verified"}; !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestWatch(t *testing.T) {
	f := newFixture(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := f.client.Index.Watch(ctx, &kvindexv1.WatchRequest{Pods: []string{"b"}})
	if err != nil {
		t.Fatal(err)
	}
	// The subscription is registered once the server handler runs; wait
	// for it through the hub's own count.
	testutil.Await(t, awaitBound, "the watch registered", func() bool { return f.hub.Watchers() == 1 })
	tokens := testutil.Seq(1, 64)
	loadThree(t, f, tokens)
	f.hub.Apply(engine("b", 0), 1, []kvevents.Event{{Kind: kvevents.BlockRemoved, Hashes: chainKeys(t, tokens, nil)[1:2]}})
	f.hub.Reset(engine("b", 1), kvevents.ResetRestart)

	var got []string
	for range 4 {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev.GetPod()+"/"+uitoa(uint64(ev.GetDpRank()))+" "+ev.GetKind().String()+" seq="+uitoa(ev.GetSeq())+
			" n="+uitoa(uint64(len(ev.GetBlockHashes())))+" "+ev.GetMedium()+ev.GetResetReason())
	}
	want := []string{
		"b/0 EVENT_KIND_BLOCK_STORED seq=0 n=2 GPU",
		"b/1 EVENT_KIND_BLOCK_STORED seq=0 n=3 GPU",
		"b/0 EVENT_KIND_BLOCK_REMOVED seq=1 n=1 GPU",
		"b/1 EVENT_KIND_RESET seq=0 n=0 restart",
	}
	if !slices.Equal(got, want) {
		t.Errorf("events:\n got %q\nwant %q", got, want)
	}
	// Shutdown ends the stream cleanly (io.EOF: status OK).
	f.srv.Shutdown()
	if _, err := stream.Recv(); err != io.EOF {
		t.Errorf("after Shutdown: %v, want io.EOF", err)
	}
}

// awaitBound bounds every wait for a condition.
const awaitBound = 10 * time.Second

func TestReadiness(t *testing.T) {
	t.Run("bind mode: first event", func(t *testing.T) {
		f := newFixture(t, nil)
		if f.srv.Ready() {
			t.Fatal("ready before any event")
		}
		checkHealth(t, f, healthpb.HealthCheckResponse_NOT_SERVING)
		f.hub.Apply(engine("a", 0), 0, nil)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go f.srv.Run(ctx)
		<-f.srv.ReadyC()
		checkHealth(t, f, healthpb.HealthCheckResponse_SERVING)
	})
	t.Run("connect mode: every stream", func(t *testing.T) {
		streams := &fakeStreams{}
		f := newFixture(t, func(c *Config) { c.Streams = streams; c.ExpectStreams = 2 })
		streams.set(kvevents.StreamStats{Engine: engine("a", 0), Connected: true}, kvevents.StreamStats{Engine: engine("b", 0)})
		f.hub.Apply(engine("a", 0), 0, nil)
		if f.srv.Ready() {
			t.Fatal("ready with one of two streams connected")
		}
		resp, err := http.Get(f.url + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("/readyz = %d, want 503", resp.StatusCode)
		}
		streams.set(kvevents.StreamStats{Engine: engine("a", 0), Connected: true}, kvevents.StreamStats{Engine: engine("b", 0), Connected: true})
		if !f.srv.Ready() {
			t.Fatal("not ready with every stream connected")
		}
		streams.set()
		if !f.srv.Ready() {
			t.Fatal("readiness did not latch")
		}
	})
	t.Run("caught up: ReadyWhen", func(t *testing.T) {
		caughtUp := make(chan struct{})
		streams := &fakeStreams{}
		f := newFixture(t, func(c *Config) { c.Streams = streams; c.ReadyWhen = caughtUp; c.ReadyGrace = -1 })
		// Events and connected streams do not make a replica ready
		// before it has caught up with its event log.
		streams.set(kvevents.StreamStats{Engine: engine("a", 0), Connected: true})
		f.hub.Apply(engine("a", 0), 0, nil)
		if f.srv.Ready() {
			t.Fatal("ready before catching up")
		}
		resp, err := http.Get(f.url + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "not caught up") {
			t.Errorf("/readyz = %d %s, want 503 saying it has not caught up", resp.StatusCode, body)
		}
		close(caughtUp)
		if !f.srv.Ready() {
			t.Fatal("not ready once caught up")
		}
	})
	t.Run("grace", func(t *testing.T) {
		now := time.Unix(1000, 0)
		clock := func() time.Time { return now }
		f := newFixture(t, func(c *Config) { c.ReadyGrace = time.Minute; c.ExpectStreams = 1; c.Now = clock })
		if f.srv.Ready() {
			t.Fatal("ready before the grace period")
		}
		now = now.Add(time.Minute)
		if !f.srv.Ready() {
			t.Fatal("not ready after the grace period")
		}
	})
}

func checkHealth(t *testing.T, f *fixture, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	r, err := healthpb.NewHealthClient(f.client.Conn()).Check(context.Background(), &healthpb.HealthCheckRequest{Service: kvindexv1.IndexService_ServiceDesc.ServiceName})
	if err != nil {
		t.Fatal(err)
	}
	if r.GetStatus() != want {
		t.Errorf("health = %v, want %v", r.GetStatus(), want)
	}
}
