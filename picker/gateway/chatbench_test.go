package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/picker/gateway"
	"github.com/kvindex/kvindex/tokenizer"
	"github.com/kvindex/kvindex/tokenizer/chattemplate"
)

// Shape of BenchmarkPickerChatTurn: conversations of about 16,000
// tokens, each turn adding about 300.
const (
	chatBenchConversations = 8
	chatBenchTokens        = 16000
	chatBenchTurnWords     = 220 // about 300 tokens
	chatBenchStreams       = 64
)

// chatBench is BenchmarkPickerChatTurn's fixture: conversations as chat
// messages, the index holding each one's rendered prompt on one pod.
type chatBench struct {
	convs [][]chatMsg
	// prefix is each conversation's body up to its next message.
	prefix [][]byte
	tok    *tokenizer.ChatLocal
}

type chatMsg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chatWords returns n words of English-like text drawn from rng.
func chatWords(rng *rand.Rand, n int) string {
	vocab := strings.Fields("the picker routes each turn to the engine whose cache holds the conversation " +
		"so far, and the engine then prefills only what the turn adds: a tool result, a question, " +
		"a plan. Agents resend their whole context every turn while the gateway keeps its latency " +
		"budget small, so tokenizing and hashing must cost what is new and nothing more")
	var sb strings.Builder
	for i := range n {
		if i > 0 {
			if i%17 == 0 {
				sb.WriteString(".\n")
			} else {
				sb.WriteByte(' ')
			}
		}
		sb.WriteString(vocab[rng.IntN(len(vocab))])
	}
	return sb.String()
}

func newChatBench(b *testing.B) *chatBench {
	l, err := tokenizer.LoadFile("../../tokenizer/testdata/qwen2.5/tokenizer.json.gz")
	if err != nil {
		b.Fatal(err)
	}
	tmpl, err := chattemplate.Load("../../tokenizer/chattemplate/testdata/templates/qwen2.5.json", nil)
	if err != nil {
		b.Fatal(err)
	}
	cb := &chatBench{tok: &tokenizer.ChatLocal{Local: l, Template: tmpl}}
	rng := rand.New(rand.NewPCG(3, 5))
	for c := range chatBenchConversations {
		msgs := []chatMsg{{"system", fmt.Sprintf("You are agent %d of a platform team. ", c) + chatWords(rng, 100)}}
		for n := 0; n < chatBenchTokens; {
			role := "user"
			if len(msgs)%2 == 0 {
				role = "assistant"
			}
			msgs = append(msgs, chatMsg{role, chatWords(rng, chatBenchTurnWords)})
			if len(msgs)%8 == 0 {
				ids, err := cb.tok.Tokenize(context.Background(), testModel, turnInput(msgs))
				if err != nil {
					b.Fatal(err)
				}
				n = len(ids)
			}
		}
		if msgs[len(msgs)-1].Role == "user" {
			msgs = msgs[:len(msgs)-1] // the benchmark's turn is the next user message
		}
		cb.convs = append(cb.convs, msgs)
		prefix := []byte(`{"model":"` + testModel + `","messages":[`)
		for _, m := range msgs {
			prefix = appendMsg(prefix, m, ',')
		}
		cb.prefix = append(cb.prefix, prefix)
	}
	return cb
}

func turnInput(msgs []chatMsg) tokenizer.Input {
	in := tokenizer.Input{}
	for _, m := range msgs {
		in.Messages = append(in.Messages, tokenizer.Message{Role: m.Role, Content: m.Content})
	}
	return in
}

// turn is conversation c's next turn, a user message of its own.
func (cb *chatBench) turn(c int, rng *rand.Rand) []chatMsg {
	return append(slices.Clip(cb.convs[c]), chatMsg{"user", chatWords(rng, chatBenchTurnWords)})
}

func turnBody(msgs []chatMsg) []byte {
	b, _ := json.Marshal(map[string]any{"model": testModel, "messages": msgs})
	return b
}

// appendMsg appends m as JSON, then the closing bytes.
func appendMsg(dst []byte, m chatMsg, closing ...byte) []byte {
	j, _ := json.Marshal(m)
	return append(append(dst, j...), closing...)
}

// BenchmarkPickerChatTurn measures the gateway path for what gateways
// carry: an agent's next chat turn, sent as text (OpenAI chat messages)
// through an Envoy-like ext_proc client in 16 KiB frames, from the
// request headers sent to the body's last frame answered. Each of 8
// conversations holds about 16,000 tokens (Qwen2.5's template and
// tokenizer) and every request adds a new ~300-token user message to
// one; the picker renders and tokenizes it itself (--tokenizer,
// --chat-template, with its segment cache warm from the conversation's
// earlier turns) and asks the index, which holds each conversation on
// one pod, with the default deadline:
//
//   - local: the index in the same process (kvindex serve --picker);
//   - remote: the index over loopback gRPC, asked by block keys;
//   - remote-c64: the same, 64 streams at once;
//   - remote-http-c64: the same, 64 HTTP callers posting each body to
//     /v1/pick over kept-alive connections (pickHTTP);
//   - cold: every request a conversation never seen (nothing cached in
//     the picker or the index), the index over loopback gRPC.
//
// fallback-% is the share of picks made without the index's answer
// (its deadline passed); faults/op the process's minor page faults per
// request (memory touched anew, each a trip through the kernel). Run with -benchtime=3000x for stable
// percentiles.
func BenchmarkPickerChatTurn(b *testing.B) {
	cb := newChatBench(b)
	var prompts [][]uint64
	for c := range cb.convs {
		ids, err := cb.tok.Tokenize(context.Background(), testModel, turnInput(cb.convs[c]))
		if err != nil {
			b.Fatal(err)
		}
		prompts = append(prompts, ids)
	}
	srv, eps := benchIndex(b, prompts)
	c := serveIndex(b, srv)

	for _, v := range []struct {
		name    string
		src     gateway.Source
		streams int
		cold    bool
		http    bool // POST /v1/pick instead of ext_proc
	}{
		{"local", gateway.Local{Server: srv}, 1, false, false},
		{"remote", gateway.Remote{Client: c}, 1, false, false},
		{"remote-c64", gateway.Remote{Client: c}, chatBenchStreams, false, false},
		{"remote-http-c64", gateway.Remote{Client: c}, chatBenchStreams, false, true},
		{"cold", gateway.Remote{Client: c}, 1, true, false},
	} {
		b.Run(v.name, func(b *testing.B) {
			reg := prometheus.NewRegistry()
			tok := &tokenizer.ChatLocal{Local: cb.tok.Local.WithSegmentCache(64 << 20), Template: cb.tok.Template}
			svc, err := gateway.New(gateway.Config{Endpoints: eps, Scorer: noSpeculation(), Registry: reg, Tokenizer: tok}, v.src)
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if err := svc.Warm(ctx, 0); err != nil {
				b.Fatal(err)
			}
			var pick func(body []byte)
			if v.http {
				pick = pickHTTP(b, svc, v.streams)
			} else {
				xc := serveExtProc(b, svc)
				pick = func(body []byte) { pickOnce(b, xc, body) }
			}
			rng := rand.New(rand.NewPCG(11, uint64(len(v.name))))
			// The conversations' earlier turns, once each: the picker's
			// segment cache and chain memo hold them, as a live picker's
			// would; each goes to its holder.
			for i := range cb.convs {
				pick(turnBody(cb.turn(i, rng)))
			}
			warm := fallbacks(b, reg)
			// Each request's body is built by its stream before its clock
			// starts, into the stream's own buffer: every one a new turn
			// (or, cold, a new conversation). Bodies built beforehand for
			// all b.N requests would hold b.N x 82 KB live, a heap no
			// picker has, whose growth the requests would pay for in page
			// faults (faults/op).
			build := func(dst []byte, i int, rng *rand.Rand) []byte {
				c := i % len(cb.convs)
				if !v.cold {
					dst = append(dst, cb.prefix[c]...)
					return appendMsg(dst, chatMsg{"user", chatWords(rng, chatBenchTurnWords)}, ']', '}')
				}
				// Its own text throughout: every segment new to the
				// picker's cache, every block new to the index.
				dst = append(dst, `{"model":"`+testModel+`","messages":[`...)
				for _, m := range cb.convs[c] {
					dst = appendMsg(dst, chatMsg{m.Role, fmt.Sprintf("Cold %d. ", i) + chatWords(rng, chatBenchTurnWords)}, ',')
				}
				return appendMsg(dst, chatMsg{"user", chatWords(rng, chatBenchTurnWords)}, ']', '}')
			}
			lat := make([]time.Duration, b.N)
			var next sync.Mutex
			n := 0
			var wg sync.WaitGroup
			b.ReportAllocs()
			faults0 := minorFaults(b)
			b.ResetTimer()
			var bodyBytes atomic.Int64
			for stream := range v.streams {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(stream), uint64(len(v.name))))
					var body []byte
					for {
						next.Lock()
						i := n
						n++
						next.Unlock()
						if i >= b.N {
							return
						}
						body = build(body[:0], i, rng)
						bodyBytes.Add(int64(len(body)))
						t0 := time.Now()
						pick(body)
						lat[i] = time.Since(t0)
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(minorFaults(b)-faults0)/float64(b.N), "faults/op")
			fb := fallbacks(b, reg) - warm
			if ok := mustVec(b, reg, "kvindex_picker_local_tokenize_total", "ok"); ok < float64(b.N) {
				b.Fatalf("%v of %d requests tokenized in the picker", ok, b.N)
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-us")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us")
			b.ReportMetric(100*fb/float64(b.N), "fallback-%")
			b.ReportMetric(float64(bodyBytes.Load()/int64(b.N)), "body-bytes")
		})
	}
}

// pickHTTP serves svc's HTTP API on loopback and returns a function that
// POSTs a body to /v1/pick over one of conns kept-alive connections, as
// a gateway's HTTP client would, and checks the answer.
func pickHTTP(b *testing.B, svc *gateway.Service, conns int) func(body []byte) {
	hs := httptest.NewServer(svc.Handler())
	b.Cleanup(hs.Close)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conns}}
	b.Cleanup(hc.CloseIdleConnections)
	return func(body []byte) {
		resp, err := hc.Post(hs.URL+"/v1/pick", "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		var d struct{ Endpoint string }
		if err := json.NewDecoder(resp.Body).Decode(&d); err != nil || resp.StatusCode != http.StatusOK || d.Endpoint == "" {
			b.Fatalf("/v1/pick: %d, %+v, %v", resp.StatusCode, d, err)
		}
	}
}

// minorFaults is the process's minor page faults so far: memory it
// touches for the first time (or again, after the runtime returned it),
// each a trip through the kernel.
func minorFaults(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Minflt
}
