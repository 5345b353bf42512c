package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/picker/enginemetrics"
)

// kvindex pods shows the fleet cached fraction kvindex serve --picker
// computes from the engines' own prefix-cache counters: after chat
// requests sent straight to simulated engines, it equals what their
// /metrics count, hits over queries, overall and for the model.
func TestPodsFleetCachedFraction(t *testing.T) {
	const tk = "../../tokenizer/testdata/qwen2.5/tokenizer.json.gz"
	const model = "Qwen/Qwen2.5-7B-Instruct"
	sim := startSim(t, "--engines", "2", "--tokenizer", tk, "--rate", "0", "--http-port", "8000", "--prefill-per-token", "0")
	var extra []string
	fronts := make([]string, 2)
	for i := range fronts {
		addr := sim.run.Fronts()[i].Addr
		fronts[i] = "http://" + addr
		extra = append(extra, "--endpoint", fmt.Sprintf("pod-%d=%s", i, addr))
	}
	_, _, svc := followSimService(t, sim, append(extra, "--picker", "--extproc-addr", "127.0.0.1:0", "--scrape-interval", "20ms")...)
	pods := func(args ...string) string {
		t.Helper()
		out, errOut, code := runCLI(t, append([]string{"pods", "--server", svc.GRPCAddr()}, args...)...)
		if code != 0 {
			t.Fatalf("kvindex pods %v: exit %d: %s", args, code, errOut)
		}
		return out
	}

	// A pod's first scrape sets its baseline: wait for both before any
	// request, so that every request lands in the window.
	deadline := time.Now().Add(e2eDeadline)
	for m := simGet(t, "http://"+svc.HTTPAddr()+"/metrics"); !strings.Contains(m, `kvindex_engine_requests_waiting{pod="pod-0"}`) ||
		!strings.Contains(m, `kvindex_engine_requests_waiting{pod="pod-1"}`); m = simGet(t, "http://"+svc.HTTPAddr()+"/metrics") {
		if time.Now().After(deadline) {
			t.Fatalf("the engines were never scraped:\n%s", m)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if out := pods(); !strings.Contains(out, "fleet cached fraction (last 1m0s): no queries\n") {
		t.Errorf("before any request, kvindex pods says:\n%s", out)
	}

	// Two turns of one conversation on pod-1 (the second finds the first
	// cached), one turn of another on pod-0.
	chat := func(front string, msgs ...string) {
		var ms []map[string]string
		for i, m := range msgs {
			ms = append(ms, map[string]string{"role": []string{"user", "assistant"}[i%2], "content": m})
		}
		b, _ := json.Marshal(map[string]any{"model": model, "messages": ms, "max_tokens": 8})
		simPost(t, front+"/v1/chat/completions", string(b))
	}
	turn1 := []string{"Find where the subscriber replays lost batches and explain the backoff in detail, with the constants."}
	chat(fronts[1], turn1...)
	chat(fronts[1], append(turn1, "It backs off exponentially up to a cap.", "Show me the constants.")...)
	chat(fronts[0], "Summarise the picker's scoring: prefix affinity, load, sessions and the hot-prefix guard.")

	var hits, queries float64
	var own []client.PodCacheJSON
	for i, f := range fronts {
		r, err := enginemetrics.Parse(strings.NewReader(simGet(t, f+"/metrics")))
		if err != nil {
			t.Fatal(err)
		}
		c := r.Prefix[model]
		hits += c.Hits
		queries += c.Queries
		frac := c.Hits / c.Queries
		own = append(own, client.PodCacheJSON{Pod: fmt.Sprintf("pod-%d", i), Fraction: &frac, HitTokens: c.Hits, QueryTokens: c.Queries, WindowSeconds: 60})
	}
	if hits == 0 || hits >= queries {
		t.Fatalf("the engines count %v hits of %v queries; the test needs some of both", hits, queries)
	}

	// Wait for the scrape that sees every request.
	var got client.PodsJSON
	for {
		got = client.PodsJSON{}
		if err := json.Unmarshal([]byte(pods("--json")), &got); err != nil {
			t.Fatal(err)
		}
		if len(got.Fleet) > 0 && got.Fleet[0].QueryTokens >= queries {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kvindex pods never counted the engines' %v queries: %+v", queries, got.Fleet)
		}
		time.Sleep(10 * time.Millisecond)
	}
	frac := hits / queries
	want := []client.FleetCacheJSON{
		{Model: "", Fraction: &frac, HitTokens: hits, QueryTokens: queries, WindowSeconds: 60},
		{Model: model, Fraction: &frac, HitTokens: hits, QueryTokens: queries, WindowSeconds: 60},
	}
	if g, w := jsonString(t, got.Fleet), jsonString(t, want); g != w {
		t.Errorf("kvindex pods --json fleet:\n got %s\nwant %s", g, w)
	}
	if g, w := jsonString(t, got.PodCache), jsonString(t, own); g != w {
		t.Errorf("kvindex pods --json pod_cache:\n got %s\nwant the engines' own %s", g, w)
	}
	pct := fmt.Sprintf("%.1f%%", frac*100)
	lines := "fleet cached fraction (last 1m0s): " + pct + " (" + model + ": " + pct + ")\n" +
		fmt.Sprintf("engine cached fraction (same window): pod-0: %.1f%%, pod-1: %.1f%%\n", *own[0].Fraction*100, *own[1].Fraction*100)
	if out := pods(); !strings.Contains(out, lines) {
		t.Errorf("kvindex pods lacks %q:\n%s", lines, out)
	}
	if out, line := pods("--model", model), "fleet cached fraction (last 1m0s): "+model+": "+pct+"\n"; !strings.Contains(out, line) {
		t.Errorf("kvindex pods --model lacks %q:\n%s", line, out)
	}
}

func jsonString(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestQueryIndexSeq: kvindex query's header names the answer's index
// sequence when the server reports one, and only then.
func TestQueryIndexSeq(t *testing.T) {
	tests := []struct {
		seq  uint64
		want string
	}{
		{0, "model m: 20 tokens (caller), 1 full blocks of 16 tokens\n"},
		{1<<40 + 1, "model m: 20 tokens (caller), 1 full blocks of 16 tokens, index seq 1099511627777\n"},
	}
	for _, tt := range tests {
		var b strings.Builder
		r := client.LongestPrefixJSON{BlocksTotal: 1, BlockSize: 16, PromptTokens: 20, TokenSource: client.SourceCaller, IndexSeq: tt.seq}
		if err := printQuery(&b, "m", r); err != nil {
			t.Fatal(err)
		}
		if first, _, _ := strings.Cut(b.String(), "\n"); first+"\n" != tt.want {
			t.Errorf("index_seq %d: header %q, want %q", tt.seq, first, tt.want)
		}
	}
}
