package tokenizer_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/enginesim/simhttp"
	"github.com/kvindex/kvindex/tokenizer"
	"github.com/kvindex/kvindex/tokenizer/chattemplate"
)

// simEngine is a simulated vLLM engine serving /tokenize with tok (none
// if nil), as kvindex sim runs it: its base URL.
func simEngine(t *testing.T, tok tokenizer.Tokenizer) string {
	t.Helper()
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 16})
	e, err := enginesim.New(enginesim.Config{Pod: "pod-a", Model: "qwen", Hasher: h, CapacityBlocks: 64})
	if err != nil {
		t.Fatal(err)
	}
	front, err := simhttp.New(simhttp.Config{Ranks: []*enginesim.Engine{e}, Tokenizer: tok})
	if err != nil {
		t.Fatal(err)
	}
	if err := front.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { front.Close() })
	return "http://" + front.Addr().String()
}

func qwenLocal(t *testing.T) *tokenizer.Local {
	t.Helper()
	l, err := tokenizer.LoadFile("testdata/qwen2.5/tokenizer.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func withTemplate(t *testing.T, l *tokenizer.Local, path string) *tokenizer.ChatLocal {
	t.Helper()
	tmpl, err := chattemplate.Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &tokenizer.ChatLocal{Local: l, Template: tmpl}
}

// The check against a simulated engine (the tokenizer Qwen2.5's, chat
// rendered as ChatML, which Qwen2.5's template writes for these
// messages): each form's verdict, for a local side that agrees, one
// whose template differs, one without a template, and an engine that
// cannot tokenize text.
func TestCheckEngines(t *testing.T) {
	l := qwenLocal(t)
	engine := simEngine(t, l)
	bare := simEngine(t, nil)
	for _, tc := range []struct {
		name             string
		local            tokenizer.Tokenizer
		engine           string
		completion, chat tokenizer.Verdict
	}{
		{"same", withTemplate(t, l, "chattemplate/testdata/templates/qwen2.5.json"), engine, tokenizer.Match, tokenizer.Match},
		{"other template", withTemplate(t, l, "chattemplate/testdata/templates/phi-3.5-mini.jinja"), engine, tokenizer.Match, tokenizer.Mismatch},
		{"no template", l, engine, tokenizer.Match, tokenizer.LocalDeclined},
		{"engine without tokenizer", withTemplate(t, l, "chattemplate/testdata/templates/qwen2.5.json"), bare, tokenizer.EngineRefused, tokenizer.EngineRefused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := tokenizer.CheckEngines(context.Background(), tc.local, func() []string { return []string{tc.engine} }, tokenizer.CheckConfig{})
			if err != nil {
				t.Fatal(err)
			}
			for f, want := range map[tokenizer.Form]tokenizer.Verdict{tokenizer.FormCompletion: tc.completion, tokenizer.FormChat: tc.chat} {
				r, ok := tokenizer.FormResult(rs, f)
				if !ok || r.Verdict != want {
					t.Errorf("%s: %v (%v); want %v", f, r.Verdict, r, want)
				}
				if want == tokenizer.Mismatch && (r.Pos < 0 || r.Pos > min(len(r.Local), len(r.Engine)) || tokenizer.FirstDiff(r.Local, r.Engine) != r.Pos) {
					t.Errorf("%s: mismatch at %d: %v", f, r.Pos, r)
				}
			}
		})
	}
}

// Until an engine answers, the check asks again, each round the engines
// listed then: here a port nobody listens on, then the engine.
func TestCheckEnginesRetries(t *testing.T) {
	l := qwenLocal(t)
	engine := simEngine(t, l)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + lis.Addr().String()
	lis.Close()
	var rounds atomic.Int32
	engines := func() []string {
		if rounds.Add(1) < 3 {
			return []string{dead}
		}
		return []string{dead, engine}
	}
	rs, err := tokenizer.CheckEngines(context.Background(), l, engines, tokenizer.CheckConfig{RetryMin: 1, RetryMax: 1})
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := tokenizer.FormResult(rs, tokenizer.FormCompletion); r.Verdict != tokenizer.Match {
		t.Errorf("completion: %v", r)
	}
	if n := rounds.Load(); n != 3 {
		t.Errorf("%d rounds; want 3", n)
	}

	// A context that ends first: the results so far, and its error.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rs, err = tokenizer.CheckEngines(ctx, l, func() []string { return []string{dead} }, tokenizer.CheckConfig{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v; want context.Canceled", err)
	}
	if r, _ := tokenizer.FormResult(rs, tokenizer.FormCompletion); r.Verdict != tokenizer.Unchecked {
		t.Errorf("completion: %v; want unchecked", r)
	}
}

func TestFirstDiff(t *testing.T) {
	for _, tc := range []struct {
		a, b []uint64
		want int
	}{
		{nil, nil, -1},
		{[]uint64{1, 2}, []uint64{1, 2}, -1},
		{[]uint64{1, 2}, []uint64{1, 3}, 1},
		{[]uint64{1, 2}, []uint64{1, 2, 3}, 2},
		{[]uint64{5}, nil, 0},
	} {
		if got := tokenizer.FirstDiff(tc.a, tc.b); got != tc.want {
			t.Errorf("FirstDiff(%v, %v) = %d; want %d", tc.a, tc.b, got, tc.want)
		}
	}
}
