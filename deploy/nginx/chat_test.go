package nginx

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/service"
	"github.com/kvindex/kvindex/internal/sim"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/testutil/simtest"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
	"github.com/kvindex/kvindex/picker/enginemetrics"
	"github.com/kvindex/kvindex/picker/gateway"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The committed Qwen2.5 tokenizer and chat template, which render and
// tokenize the simulated engines' ChatML exactly for conversations that
// open with a system message.
const (
	qwenTokenizer = "../../tokenizer/testdata/qwen2.5/tokenizer.json.gz"
	qwenTemplate  = "../../tokenizer/chattemplate/testdata/templates/qwen2.5.json"
)

// TestNginxChat is the gateway path for the requests gateways carry: chat
// conversations as text, through a real nginx, with kvindex picker
// started before the kvindex it asks. While the index is away the picker
// routes by load and says it is not ready; once kvindex serve (local
// tokenizer and chat template) is up, 32 conversations of ~8k tokens run
// their two turns concurrently, and every second turn reaches the pod
// that served the first, is served from its cache, and was picked with
// the index's answer: no request fell back.
func TestNginxChat(t *testing.T) {
	if raceEnabled {
		// Tokenizing 32 chats of 8k tokens takes the race detector past
		// nginx's one-second pick timeout, whose fallback the test forbids.
		t.Skip("runs without the race detector (make test runs this package again without it)")
	}
	nginxBin := nginxBinary(t)
	dir := t.TempDir()
	const conversations, userTokens = 32, 8000

	evPorts, httpPorts := testutil.FreePorts(t, 2*engines), testutil.FreePorts(t, engines)
	addrs := make([]string, engines)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("127.0.0.1:%d", httpPorts+i)
	}
	// The picker first, asking an index that is not there yet.
	grpcAddr := testutil.FreeAddr(t)
	// The index deadline is far above the path's latency: this test
	// checks where requests go and that the picker asked the index for
	// each, not how fast (BenchmarkPickerChatTurn measures that, with the
	// default deadline), on cores it shares with the engines, nginx and
	// the race detector.
	// A /v1/pick counts as in flight for the pick hold; nginx never says
	// when the request ended. Here the engines answer at once: a hold of
	// a nanosecond keeps 32 turns picked within milliseconds of each other
	// from counting as load on each other's pods, which would move some
	// off their prefix (as it should under real load; the scorer's tests
	// and TestNginxRoutesByPrefix cover that).
	po := &service.PickerServiceOptions{
		Picker: service.PickerOptions{Gateway: gateway.Config{PickHold: time.Nanosecond, IndexTimeout: awaitBound, IndexTimeoutPer1K: -1},
			ExtProcAddr: "127.0.0.1:0"},
		Index:    grpcAddr,
		Dial:     []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		HTTPAddr: "127.0.0.1:0",
		// The picker renders and tokenizes the chats itself, checked
		// against an engine's /tokenize, and asks the index by block keys.
		TokenizerFile: qwenTokenizer, ChatTemplateFile: qwenTemplate,
	}
	for i, a := range addrs {
		po.Picker.Gateway.Endpoints = append(po.Picker.Gateway.Endpoints, gateway.Endpoint{Pod: fmt.Sprintf("pod-%d", i), Addr: a})
	}
	pickerLog := simtest.Log(t, "picker")
	pk, err := service.NewPicker(po, slog.New(slog.NewTextHandler(pickerLog, nil)))
	if err != nil {
		t.Fatal(err)
	}
	simtest.Run(t, pk.Start, pk.Wait)
	pickerURL := "http://" + pk.HTTPAddr()
	if code := getStatus(t, pickerURL+"/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("picker /readyz without its index: %d, want 503", code)
	}

	so := sim.DefaultOptions()
	so.Engines, so.Rate, so.Port, so.HTTPPort, so.Tokenizer = engines, 0, evPorts, httpPorts, qwenTokenizer
	so.PrefillPerToken, so.Capacity = 0, 16384 // room for every conversation: 32 x ~8k tokens over 3 engines
	follow := simtest.Start(t, so)
	routed := startNginx(t, nginxBin, filepath.Join(dir, "routed"), pk.HTTPAddr(), addrs)
	// A request through nginx while the index is away is routed all the
	// same, by load.
	rng := rand.New(rand.NewPCG(7, 7))
	probe := []chatMessage{{"system", "You are a helpful assistant."}, {"user", words(rng, 50)}}
	if r := chat(t, routed, probe, "probe"); r.upstream == "" {
		t.Fatal("no upstream for a request while the index is away")
	}

	o := service.DefaultOptions()
	o.GRPCAddr, o.HTTPAddr, o.Model = grpcAddr, "127.0.0.1:0", follow.Model
	o.Index.Hasher = blockhash.MustNew(follow.Hash)
	o.TokenizerFile, o.ChatTemplateFile = qwenTokenizer, qwenTemplate
	for _, e := range follow.Engines {
		o.Engines = append(o.Engines, zmqtransport.EngineConfig{Name: e.Pod, Model: follow.Model, Endpoint: e.Endpoint, ReplayEndpoint: e.Replay, Ranks: e.Ranks})
	}
	serve, err := service.New(o, slog.New(slog.NewTextHandler(simtest.Log(t, "serve"), nil)))
	if err != nil {
		t.Fatal(err)
	}
	simtest.Run(t, serve.Start, serve.Wait)
	ctx, cancel := context.WithTimeout(context.Background(), 5*awaitBound)
	defer cancel()
	idx, err := client.Dial(ctx, grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer idx.Close()
	testutil.Await(t, awaitBound, "the picker ready once its index answers", func() bool {
		return getStatus(t, pickerURL+"/readyz") == http.StatusOK
	})
	fallbacksBefore := pickerFallbacks(t, pickerURL)

	// Each conversation: a shared system prompt, then its own ~8k-token
	// user message; turn 2 adds the assistant's answer and ~300 tokens.
	system := chatMessage{"system", "You are a careful assistant for a platform team. " + words(rng, 200)}
	convs := make([][]chatMessage, conversations)
	for c := range convs {
		convs[c] = []chatMessage{system, {"user", fmt.Sprintf("Conversation %d. ", c) + words(rng, userTokens*3/4)}}
	}
	first := make([]chatReply, conversations)
	concurrently(t, conversations, func(c int) {
		first[c] = chat(t, routed, convs[c], "c"+strconv.Itoa(c))
	})
	for c := range convs {
		// The next turn is asked only once the index knows where this
		// one's blocks are, so that routing does not race the events.
		pod := podOf(t, addrs, first[c].upstream)
		testutil.Await(t, awaitBound, pod+" holding conversation "+strconv.Itoa(c), func() bool {
			r, err := idx.LongestPrefixMessages(ctx, model, protoMessages(convs[c]), nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range r.GetPods() {
				if m.GetPod() == pod && m.GetMatchedBlocks() == r.GetBlocksTotal() {
					return true
				}
			}
			return false
		})
		convs[c] = append(convs[c], chatMessage{"assistant", first[c].content}, chatMessage{"user", words(rng, 220)})
	}
	afterFirst := pickerFallbacks(t, pickerURL)
	second := make([]chatReply, conversations)
	concurrently(t, conversations, func(c int) {
		second[c] = chat(t, routed, convs[c], "c"+strconv.Itoa(c))
	})
	for c := range convs {
		// Turn 1's prompt, its full blocks, is turn 2's cached prefix.
		want := first[c].prompt / 16 * 16
		if second[c].upstream != first[c].upstream || second[c].cached < want {
			t.Errorf("conversation %d turn 2 (%d tokens): reached %s with %d cached tokens, want %s (turn 1's pod) with >= %d",
				c, second[c].prompt, second[c].upstream, second[c].cached, first[c].upstream, want)
		}
	}
	// The picker rendered and tokenized every chat itself: it asked the
	// index by block keys only.
	if n := pickerMetric(t, pickerURL, `kvindex_picker_index_queries_total{input="hashes"}`); n != 2*conversations {
		t.Errorf("%v index queries by block keys, want %d (one per turn)", n, 2*conversations)
	}
	if n := pickerFallbacks(t, pickerURL) - fallbacksBefore; n != 0 {
		t.Errorf("%v picks fell back to load-only routing once the index was up (%v in turn 1), want 0", n, afterFirst-fallbacksBefore)
	}
	t.Logf("%d conversations, turn 1 %d-%d tokens, turn 2 %d tokens (first)", conversations, first[0].prompt, first[conversations-1].prompt, second[0].prompt)
}

type chatMessage struct{ Role, Content string }

func protoMessages(msgs []chatMessage) []*kvindexv1.ChatMessage {
	out := make([]*kvindexv1.ChatMessage, len(msgs))
	for i, m := range msgs {
		out[i] = &kvindexv1.ChatMessage{Role: m.Role, Content: m.Content}
	}
	return out
}

// chatReply is what a chat request through nginx came back with.
type chatReply struct {
	reply
	prompt  int    // usage.prompt_tokens
	content string // the assistant's answer
}

// chat sends a /v1/chat/completions request through nginx.
func chat(t *testing.T, base string, msgs []chatMessage, session string) chatReply {
	t.Helper()
	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	ms := make([]message, len(msgs))
	for i, m := range msgs {
		ms[i] = message(m)
	}
	body, _ := json.Marshal(map[string]any{"model": model, "messages": ms, "max_tokens": 8})
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-session-id", session)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return chatReply{}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("POST %s/v1/chat/completions: %d %v\n%s", base, resp.StatusCode, err, b)
		return chatReply{}
	}
	u, err := enginemetrics.ParseUsage(b)
	if err != nil {
		t.Errorf("%v\n%s", err, b)
		return chatReply{}
	}
	var out struct {
		Choices []struct {
			Message message `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &out); err != nil || len(out.Choices) != 1 {
		t.Errorf("chat answer without one choice (%v):\n%s", err, b)
		return chatReply{}
	}
	return chatReply{reply{upstream: resp.Header.Get("x-kvindex-upstream"), cached: u.CachedTokens}, u.PromptTokens, out.Choices[0].Message.Content}
}

// concurrently runs do(0..n-1) at once and waits for all.
func concurrently(t *testing.T, n int, do func(i int)) {
	t.Helper()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { do(i) })
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
}

func podOf(t *testing.T, addrs []string, upstream string) string {
	t.Helper()
	for i, a := range addrs {
		if a == upstream {
			return fmt.Sprintf("pod-%d", i)
		}
	}
	t.Fatalf("upstream %q is none of the engines %v", upstream, addrs)
	return ""
}

func getStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// pickerFallbacks reads the picks the picker made without the index's
// answer, over all reasons, from its /metrics.
func pickerFallbacks(t *testing.T, base string) float64 {
	return pickerMetric(t, base, "kvindex_picker_index_fallbacks_total{")
}

// pickerMetric sums the picker's /metrics samples whose line starts with
// prefix.
func pickerMetric(t *testing.T, base, prefix string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var n float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("picker /metrics: %q: %v", line, err)
		}
		n += v
	}
	return n
}

// words returns about n tokens of English-like text: random words of a
// small vocabulary, with sentences and newlines.
func words(rng *rand.Rand, n int) string {
	vocab := strings.Fields("the index routes each request to the pod whose cache holds its prefix " +
		"so that long conversations are not prefilled again every turn while the fleet keeps " +
		"its memory busy with blocks that matter gateway engine token block hash event replay " +
		"budget health verified partial conversation agent tool result system user assistant")
	var sb strings.Builder
	for i := range n {
		if i > 0 {
			switch {
			case i%97 == 0:
				sb.WriteString(".\n")
			case i%13 == 0:
				sb.WriteString(". ")
			default:
				sb.WriteByte(' ')
			}
		}
		sb.WriteString(vocab[rng.IntN(len(vocab))])
	}
	return sb.String()
}
