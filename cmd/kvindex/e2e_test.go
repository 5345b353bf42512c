package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/buildinfo"
	"github.com/kvindex/kvindex/internal/service"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/enginesim/simzmq"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
	"github.com/kvindex/kvindex/tokenizer"
)

// End-to-end: simulated vLLM engines publish real ZMQ events; the serve
// wiring (startService, as kvindex serve runs it) follows them; answers
// come through the Go client, the HTTP API and the CLI commands.

const (
	e2eModel     = "Qwen/Qwen2.5-7B-Instruct"
	e2eBlockSize = 16
	e2eDeadline  = 20 * time.Second
)

var e2eHasher = blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: e2eBlockSize})

type e2e struct {
	t       *testing.T
	svc     *service.Service
	client  *client.Client
	engines map[string]*simzmq.Engine
	logs    *testutil.SyncBuffer
	salt    uint64 // makes warm-up prompts unique
}

// startE2E starts one simulated engine per pod name and a kvindex
// following them, with extra serve flags appended.
func startE2E(t *testing.T, pods []string, extra ...string) *e2e {
	t.Helper()
	return startE2EDial(t, nil, pods, extra...)
}

// startE2EDial is startE2E whose client dials with opts (TLS, tokens).
func startE2EDial(t *testing.T, opts []grpc.DialOption, pods []string, extra ...string) *e2e {
	t.Helper()
	x := &e2e{t: t, engines: map[string]*simzmq.Engine{}, logs: &testutil.SyncBuffer{}}
	args := []string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--model", e2eModel,
		"--hash-algo", "sha256_cbor", "--hash-seed", "0", "--block-size", "16", "--ready-grace", "1m"}
	for _, pod := range pods {
		e, err := simzmq.New(enginesim.Config{
			Pod: pod, Model: e2eModel, Hasher: e2eHasher, CapacityBlocks: 4096,
		}, zmqtransport.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		x.engines[pod] = e
		args = append(args, "--engine", pod+"="+e.PubEndpoint()+",replay="+e.ReplayEndpoint())
	}
	o, f, err := parseServe(t, append(args, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	x.start(o, f.log.format, opts...)
	// Ready once every engine's socket is connected.
	x.await("ready", func() bool {
		ok, err := x.client.Ready(context.Background())
		return err == nil && ok
	})
	for _, pod := range pods {
		x.warmUp(pod)
	}
	return x
}

// start runs the serve wiring with o (stopped when the test ends, its
// logs shown if it failed) and dials it with opts.
func (x *e2e) start(o *service.Options, logFormat string, opts ...grpc.DialOption) {
	x.t.Helper()
	log, err := newLogger(x.logs, "debug", logFormat)
	if err != nil {
		x.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	svc, err := startService(ctx, o, log)
	if err != nil {
		cancel()
		x.t.Fatal(err)
	}
	x.svc = svc
	x.t.Cleanup(func() {
		cancel()
		if err := svc.Wait(); err != nil {
			x.t.Errorf("shutdown: %v", err)
		}
		if x.t.Failed() {
			x.t.Logf("kvindex logs:\n%s", x.logs.String())
		}
	})
	dctx, dcancel := context.WithTimeout(context.Background(), e2eDeadline)
	defer dcancel()
	if x.client, err = client.Dial(dctx, svc.GRPCAddr(), opts...); err != nil {
		x.t.Fatal(err)
	}
	x.t.Cleanup(func() { x.client.Close() })
}

// await polls cond until it holds, failing the test after e2eDeadline.
func (x *e2e) await(what string, cond func() bool) {
	x.t.Helper()
	deadline := time.Now().Add(e2eDeadline)
	for !cond() {
		if time.Now().After(deadline) {
			x.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// warmUp makes the engine publish until kvindex has applied one of its
// batches: a SUB socket misses what is published before its subscription
// reaches the publisher, and only a later batch reveals the gap.
func (x *e2e) warmUp(pod string) {
	x.t.Helper()
	e := x.engines[pod]
	x.await(pod+"'s first batch", func() bool {
		x.salt++
		if _, err := e.Process(testutil.Seq(1_000_000+int(x.salt)*100, e2eBlockSize), nil); err != nil {
			x.t.Fatal(err)
		}
		p := x.pod(pod, 0)
		return p != nil && p.GetBatches() > 0
	})
}

// pod returns ListPods' entry for the engine, or nil.
func (x *e2e) pod(name string, rank uint32) *kvindexv1.PodInfo {
	pods, err := x.client.ListPods(context.Background(), "")
	if err != nil {
		x.t.Fatal(err)
	}
	for _, p := range pods {
		if p.GetPod() == name && p.GetDpRank() == rank {
			return p
		}
	}
	return nil
}

// matched returns each pod's matched blocks for the prompt.
func (x *e2e) matched(tokens []uint64) map[string]uint32 {
	r, err := x.client.LongestPrefixTokens(context.Background(), e2eModel, tokens, nil)
	if err != nil {
		x.t.Fatal(err)
	}
	out := map[string]uint32{}
	for _, p := range r.GetPods() {
		out[p.GetPod()] = p.GetMatchedBlocks()
	}
	return out
}

// awaitMatched waits until the index answers want for the prompt.
func (x *e2e) awaitMatched(tokens []uint64, want map[string]uint32) {
	x.t.Helper()
	var got map[string]uint32
	deadline := time.Now().Add(e2eDeadline)
	for {
		got = x.matched(tokens)
		if mapsEqual(got, want) {
			return
		}
		if time.Now().After(deadline) {
			x.t.Fatalf("index answers %v, want %v", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func mapsEqual(a, b map[string]uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func idsArg(ids []uint64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = fmt.Sprint(id)
	}
	return strings.Join(s, ",")
}

func TestE2E(t *testing.T) {
	t.Parallel() // its own service and engines on free ports
	x := startE2E(t, []string{"pod-a", "pod-b"})
	a, b := x.engines["pod-a"], x.engines["pod-b"]

	// pod-a caches a 5-block prompt; pod-b its first 3 blocks and more.
	prompt := testutil.Seq(5000, 5*e2eBlockSize+7)
	if _, err := a.Process(prompt, nil); err != nil {
		t.Fatal(err)
	}
	other := append(slices.Clone(prompt[:3*e2eBlockSize]), testutil.Seq(9000, 2*e2eBlockSize)...)
	if _, err := b.Process(other, nil); err != nil {
		t.Fatal(err)
	}
	x.awaitMatched(prompt, map[string]uint32{"pod-a": 5, "pod-b": 3})
	// What the index says is what the engines hold.
	if n, _ := a.Lookup(prompt, nil); n != 5 {
		t.Fatalf("pod-a caches %d blocks of the prompt", n)
	}

	t.Run("grpc", func(t *testing.T) {
		r, err := x.client.LongestPrefixTokens(context.Background(), e2eModel, prompt, &client.QueryOptions{Candidates: []string{"pod-b"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.GetPods()) != 1 || r.GetPods()[0].GetMatchedTokens() != 48 || r.GetPods()[0].GetHealth() != kvindexv1.EngineHealth_ENGINE_HEALTH_OK ||
			r.GetPods()[0].GetHashCheck() != kvindexv1.HashCheck_HASH_CHECK_VERIFIED || r.GetPods()[0].GetTiers()["GPU"] != 3 {
			t.Errorf("candidate pod-b: %v", r)
		}
		scores, err := x.client.PodScores(context.Background(), e2eModel, "", []string{"pod-a"})
		if err == nil || !strings.Contains(err.Error(), "need a tokenizer") {
			t.Errorf("GetPodScores without a tokenizer: %v, %v", scores, err)
		}
	})

	t.Run("http", func(t *testing.T) {
		body := fmt.Sprintf(`{"model":%q,"tokens":[%s]}`, e2eModel, idsArg(prompt))
		resp, err := http.Post("http://"+x.svc.HTTPAddr()+"/v1/longest-prefix", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var got client.LongestPrefixJSON
		if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%d %v", resp.StatusCode, err)
		}
		if got.BlocksTotal != 5 || len(got.Pods) != 2 || got.Pods[0].Pod != "pod-a" || got.Pods[0].MatchedBlocks != 5 || got.Pods[1].MatchedTokens != 48 {
			t.Errorf("HTTP answer %+v", got)
		}
		for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
			resp, err := http.Get("http://" + x.svc.HTTPAddr() + path)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("%s: %d", path, resp.StatusCode)
			}
			if path == "/metrics" && !strings.Contains(string(b), `kvindex_ingest_connected{dp_rank="0",model="Qwen/Qwen2.5-7B-Instruct",pod="pod-a"} 1`) {
				t.Errorf("metrics lack pod-a's connection")
			}
			if in := buildinfo.Read(); path == "/metrics" && !strings.Contains(string(b), fmt.Sprintf(`kvindex_build_info{commit=%q,goversion=%q,version=%q} 1`, in.ShortCommit(), in.GoVersion, in.Version)) {
				t.Errorf("metrics lack kvindex_build_info")
			}
		}
	})

	t.Run("cli query", func(t *testing.T) {
		out, errOut, code := runCLI(t, "query", "--server", x.svc.GRPCAddr(), "--model", e2eModel, "--tokens", idsArg(prompt), "--json")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var got struct {
			BlocksTotal int `json:"blocks_total"`
			BlockSize   int `json:"block_size"`
			Pods        []struct {
				Pod           string            `json:"pod"`
				DPRank        int               `json:"dp_rank"`
				MatchedBlocks int               `json:"matched_blocks"`
				MatchedTokens int               `json:"matched_tokens"`
				Tiers         map[string]uint32 `json:"tiers"`
			} `json:"pods"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if got.BlocksTotal != 5 || got.BlockSize != 16 || len(got.Pods) != 2 ||
			got.Pods[0].Pod != "pod-a" || got.Pods[0].MatchedBlocks != 5 || got.Pods[0].MatchedTokens != 80 || got.Pods[0].Tiers["GPU"] != 5 ||
			got.Pods[1].Pod != "pod-b" || got.Pods[1].MatchedBlocks != 3 {
			t.Errorf("query --json: %s", out)
		}

		out, errOut, code = runCLI(t, "query", "--server", x.svc.GRPCAddr(), "--tokens", idsArg(prompt))
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 4 || !strings.HasPrefix(lines[0], "model (server default): 87 tokens (caller), 5 full blocks of 16 tokens") ||
			!strings.HasPrefix(lines[1], "ENGINE") || !regexpLine(lines[2], "pod-a", "5", "80", "92.0%", "GPU:5", "verified", "ok") ||
			!regexpLine(lines[3], "pod-b", "3", "48", "55.2%", "GPU:3", "verified", "ok") {
			t.Errorf("query table:\n%s", out)
		}
	})

	t.Run("cli lookup and pods", func(t *testing.T) {
		out, errOut, code := runCLI(t, "lookup", "--server", x.svc.GRPCAddr(), "--tokens", idsArg(prompt[:4*e2eBlockSize]))
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		hs, _ := e2eHasher.Chain(nil, nil, 0, prompt[:4*e2eBlockSize], nil)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 6 || !regexpLine(lines[2], "0", fmt.Sprint(hs[0].Key), "pod-a[GPU]", "pod-b[GPU]") ||
			!regexpLine(lines[5], "3", fmt.Sprint(hs[3].Key), "pod-a[GPU]") {
			t.Errorf("lookup:\n%s", out)
		}

		// --pod keeps only that pod's holders.
		out, errOut, code = runCLI(t, "lookup", "--server", x.svc.GRPCAddr(), "--tokens", idsArg(prompt[:4*e2eBlockSize]), "--pod", "pod-b")
		lines = strings.Split(strings.TrimSpace(out), "\n")
		if code != 0 || len(lines) != 6 || !regexpLine(lines[2], "0", fmt.Sprint(hs[0].Key), "pod-b[GPU]") || !regexpLine(lines[5], "3", fmt.Sprint(hs[3].Key), "-") {
			t.Errorf("lookup --pod pod-b: exit %d %s\n%s", code, errOut, out)
		}

		out, errOut, code = runCLI(t, "pods", "--server", x.svc.GRPCAddr(), "--json")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var pods client.PodsJSON
		if err := json.Unmarshal([]byte(out), &pods); err != nil {
			t.Fatal(err)
		}
		if len(pods.Pods) != 2 {
			t.Fatalf("pods: %s", out)
		}
		for _, p := range pods.Pods {
			if !p.Connected || p.Health != "ok" || p.HashCheck != "verified" || p.Blocks < 3 || p.Endpoint != x.engines[p.Pod].PubEndpoint() || p.LastEventAgeSeconds == nil {
				t.Errorf("pod %+v", p)
			}
		}
		out, _, code = runCLI(t, "pods", "--server", x.svc.GRPCAddr())
		if code != 0 || !strings.Contains(out, "HASH CHECK") || !strings.Contains(out, "pod-b") || !strings.Contains(out, "verified") {
			t.Errorf("pods table:\n%s", out)
		}
		out, _, code = runCLI(t, "pods", "--server", x.svc.GRPCAddr(), "--pod", "pod-b")
		if lines := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(lines) != 2 || !strings.HasPrefix(lines[1], "pod-b ") {
			t.Errorf("pods --pod pod-b:\n%s", out)
		}
	})

	t.Run("dropped batch recovered by replay", func(t *testing.T) {
		lost := testutil.Seq(20000, 4*e2eBlockSize)
		next := testutil.Seq(30000, 2*e2eBlockSize)
		a.DropNext(1)
		if _, err := a.Process(lost, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Process(next, nil); err != nil {
			t.Fatal(err)
		}
		x.awaitMatched(next, map[string]uint32{"pod-a": 2, "pod-b": 0})
		if got := x.matched(lost); got["pod-a"] != 4 {
			t.Errorf("the dropped batch's blocks: %v, want pod-a 4", got)
		}
		p := x.pod("pod-a", 0)
		if p.GetGaps() < 1 || p.GetReplaysOk() < 1 || p.GetHealth() != kvindexv1.EngineHealth_ENGINE_HEALTH_OK || p.GetLastSeq() != a.Seq()-1 {
			t.Errorf("pod-a after the gap: %v", p)
		}
	})

	t.Run("engine restart", func(t *testing.T) {
		resetsBefore := x.pod("pod-b", 0).GetResets()
		if err := b.Restart(); err != nil {
			t.Fatal(err)
		}
		fresh := testutil.Seq(40000, 2*e2eBlockSize)
		if _, err := b.Process(fresh, nil); err != nil {
			t.Fatal(err)
		}
		// pod-b's old blocks disappear; the new process's appear.
		x.awaitMatched(fresh, map[string]uint32{"pod-a": 0, "pod-b": 2})
		x.awaitMatched(prompt, map[string]uint32{"pod-a": 5, "pod-b": 0})
		if p := x.pod("pod-b", 0); p.GetResets() <= resetsBefore || p.GetBlocks() != 2 {
			t.Errorf("pod-b after restart: resets %d (before %d), blocks %d", p.GetResets(), resetsBefore, p.GetBlocks())
		}
	})

	t.Run("cli tail", func(t *testing.T) {
		out := &testutil.SyncBuffer{}
		root := newRootCmd()
		root.SetArgs([]string{"tail", "--server", x.svc.GRPCAddr(), "--pod", "pod-b"})
		root.SetOut(out)
		root.SetErr(out)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- root.ExecuteContext(ctx) }()
		x.await("the watcher", func() bool { return x.svc.API() != nil && watchers(x) == 1 })
		if _, err := a.Process(testutil.Seq(50000, 32), nil); err != nil { // filtered out
			t.Fatal(err)
		}
		if _, err := b.Process(testutil.Seq(60000, 48), nil); err != nil {
			t.Fatal(err)
		}
		x.await("tail's line", func() bool { return strings.Contains(out.String(), "BlockStored") })
		cancel()
		if err := <-done; err != nil {
			t.Errorf("tail ended with %v", err)
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 1 || !strings.Contains(lines[0], " pod-b seq=1 BlockStored n=3 first=") || !strings.HasSuffix(lines[0], "tokens=48 GPU") {
			t.Errorf("tail printed:\n%s", out.String())
		}
	})
}

// watchers reads the open Watch streams from the metrics.
func watchers(x *e2e) int {
	resp, err := http.Get("http://" + x.svc.HTTPAddr() + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		var n int
		if _, err := fmt.Sscanf(l, "kvindex_watchers %d", &n); err == nil {
			return n
		}
	}
	return -1
}

// regexpLine reports whether line's whitespace-separated fields start
// with want.
func regexpLine(line string, want ...string) bool {
	f := strings.Fields(line)
	return len(f) >= len(want) && slices.Equal(f[:len(want)], want)
}

// Text prompts through the local tokenizer answer as their token ids do,
// and the CLI reports a missing tokenizer clearly.
func TestE2ETokenizer(t *testing.T) {
	t.Parallel() // its own service and engines on free ports
	const tk = "../../tokenizer/testdata/qwen2.5/tokenizer.json.gz"
	x := startE2E(t, []string{"pod-a"}, "--tokenizer", tk)
	local, err := tokenizer.LoadFile(tk)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Repeat("kvindex routes each request to the replica that already holds its prefix. ", 8)
	ids := local.Encode(text, true)
	if len(ids) < 3*e2eBlockSize {
		t.Fatalf("%d tokens", len(ids))
	}
	if _, err := x.engines["pod-a"].Process(ids, nil); err != nil {
		t.Fatal(err)
	}
	want := uint32(len(ids) / e2eBlockSize)
	x.awaitMatched(ids, map[string]uint32{"pod-a": want})

	byText, errOut, code := runCLI(t, "query", "--server", x.svc.GRPCAddr(), "--prompt", text, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	byIDs, errOut, code := runCLI(t, "query", "--server", x.svc.GRPCAddr(), "--tokens", idsArg(ids), "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var a, b client.LongestPrefixJSON
	json.Unmarshal([]byte(byText), &a)
	json.Unmarshal([]byte(byIDs), &b)
	if len(a.Pods) != 1 || a.Pods[0].MatchedBlocks != want || a.TokenSource != "local" || b.TokenSource != "caller" ||
		a.PromptTokens != b.PromptTokens || a.Pods[0].MatchedBlocks != b.Pods[0].MatchedBlocks {
		t.Errorf("by text %s\nby ids %s", byText, byIDs)
	}
	scores, err := x.client.PodScores(context.Background(), e2eModel, text, nil)
	if err != nil || len(scores) != 1 || scores[0].GetScore() != float64(want) {
		t.Errorf("GetPodScores: %v %v", scores, err)
	}

	// Chat needs the engine's /tokenize.
	msgs := writeFile(t, "chat.json", `[{"role":"user","content":"hi"}]`)
	_, errOut, code = runCLI(t, "query", "--server", x.svc.GRPCAddr(), "--messages-file", msgs)
	if code != 1 || !strings.HasPrefix(errOut, "kvindex: cannot tokenize the prompt: local tokenizer: tokenizer: the local tokenizer encodes completion prompts only; it cannot render chat templates, so chat messages, tools and chat_template_kwargs need the engine's /tokenize") ||
		!strings.HasSuffix(errOut, "(FailedPrecondition)\n") {
		t.Errorf("chat with a local tokenizer: %q", errOut)
	}
}

func TestE2EMissingTokenizer(t *testing.T) {
	t.Parallel() // its own service and engines on free ports
	x := startE2E(t, []string{"pod-a"})
	_, errOut, code := runCLI(t, "query", "--server", x.svc.GRPCAddr(), "--prompt", "hello")
	if code != 1 || !strings.HasPrefix(errOut, "kvindex: text and chat prompts need a tokenizer: this kvindex has none") || strings.Count(errOut, "\n") != 1 {
		t.Errorf("no tokenizer: %q", errOut)
	}
	// A file that is not a tokenizer stops serve with one line.
	bad := writeFile(t, "tokenizer.json", `{"model":{"type":"Unigram"}}`)
	_, errOut, code = runCLI(t, "serve", "--listen", "tcp://127.0.0.1:*", "--engine-allow", "*=127.0.0.1", "--tokenizer", bad, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0")
	if code != exitUsage || !strings.HasPrefix(errOut, "kvindex: --tokenizer "+bad+": ") || strings.Count(errOut, "\n") != 1 {
		t.Errorf("bad tokenizer file: %q", errOut)
	}
}

// The CLI names an unreachable server in one line.
func TestCLIUnreachable(t *testing.T) {
	for _, cmd := range []string{"query", "lookup", "pods", "tail"} {
		args := []string{cmd, "--server", "127.0.0.1:1", "--timeout", "5s"}
		if cmd == "query" || cmd == "lookup" {
			args = append(args, "--tokens", "1,2,3")
		}
		_, errOut, code := runCLI(t, args...)
		if code != 1 || !strings.HasPrefix(errOut, "kvindex: cannot reach kvindex at 127.0.0.1:1: ") || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%s: exit %d, %q", cmd, code, errOut)
		}
	}
}

func TestCLIPromptErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
		code int // 2: usage error; 1: the command ran and failed
	}{
		{[]string{"query"}, "kvindex: no prompt: give --tokens, --tokens-file, --prompt or --messages-file (see 'kvindex query --help')\n", 2},
		{[]string{"query", "--tokens", "1", "--prompt", "x"}, "kvindex: give only one of --tokens/--tokens-file, --prompt (see 'kvindex query --help')\n", 2},
		{[]string{"lookup", "--tokens", "1,-2"}, "kvindex: --tokens: token 1: \"-2\" is negative; token ids are non-negative integers (see 'kvindex lookup --help')\n", 2},
		{[]string{"query", "--tokens", "1", "--legacy-mm"}, "kvindex: --legacy-mm applies to kvindex hash only (see 'kvindex query --help')\n", 2},
		{[]string{"query", "--tokens", "1", "--mm", "img"}, "kvindex: --mm \"img\": want ID:OFFSET:LENGTH (see 'kvindex query --help')\n", 2},
		{[]string{"query", "--messages-file", "/nonexistent.json"}, "kvindex: --messages-file: stat /nonexistent.json: no such file or directory\n", 1},
		{[]string{"query", "--tokens", "1", "--pod", "a", "--pod", ""}, "kvindex: --pod: empty pod name (see 'kvindex query --help')\n", 2},
	}
	for _, tc := range tests {
		_, errOut, code := runCLI(t, tc.args...)
		if code != tc.code || errOut != tc.want {
			t.Errorf("%v: exit %d, %q; want exit %d, %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
	bad := writeFile(t, "m.json", `{"messages":"hi"}`)
	_, errOut, _ := runCLI(t, "query", "--messages-file", bad)
	if !strings.HasPrefix(errOut, "kvindex: --messages-file "+bad+": want a JSON array") {
		t.Errorf("bad messages file: %q", errOut)
	}
}

// An engine hashing with another seed is flagged "mismatch", with the
// reason in pods and in the log, and stays routable by token ids.
func TestE2EHashMismatch(t *testing.T) {
	t.Parallel() // its own service and engines on free ports
	// The engine uses seed 0.
	x := startE2E(t, []string{"pod-a"}, "--hash-seed", "1")
	prompt := testutil.Seq(7000, 4*e2eBlockSize)
	if _, err := x.engines["pod-a"].Process(prompt, nil); err != nil {
		t.Fatal(err)
	}
	x.awaitMatched(prompt, map[string]uint32{"pod-a": 4})
	out, errOut, code := runCLI(t, "pods", "--server", x.svc.GRPCAddr(), "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var pods client.PodsJSON
	if err := json.Unmarshal([]byte(out), &pods); err != nil || len(pods.Pods) != 1 {
		t.Fatalf("%v: %s", err, out)
	}
	if p := pods.Pods[0]; p.HashCheck != "mismatch" || !strings.Contains(p.Message, "hash mismatch") {
		t.Errorf("pod %+v", p)
	}
	out, _, _ = runCLI(t, "pods", "--server", x.svc.GRPCAddr())
	if !strings.Contains(out, "mismatch") || !strings.Contains(out, "pod-a: hash mismatch") {
		t.Errorf("pods table:\n%s", out)
	}
	x.await("the warning in the log", func() bool {
		logs := x.logs.String()
		return strings.Contains(logs, `msg="engine flagged" component=api pod=pod-a`) && strings.Contains(logs, "hash_check=mismatch")
	})
}

// startService builds and starts the service as kvindex serve runs it;
// it stops when ctx ends (Wait reports how).
func startService(ctx context.Context, o *service.Options, log *slog.Logger) (*service.Service, error) {
	s, err := service.New(o, log)
	if err != nil {
		return nil, configUsage(err, serveFlagNames)
	}
	return s, configUsage(s.Start(ctx), serveFlagNames)
}
