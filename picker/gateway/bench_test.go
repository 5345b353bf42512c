package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/api/server"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/picker/gateway"
	"github.com/kvindex/kvindex/tokenizer"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// Shape of BenchmarkPicker: 16,384-token prompts of a long chat, 8
// pods, each prompt held in full by one pod and to half its depth by
// another; bodies arrive in Envoy-sized frames.
const (
	benchTokens = 16384
	benchPods   = 8
	benchFrame  = 16 << 10
)

// benchPrompts tokenizes a long conversation's text with the Qwen2.5
// tokenizer into n distinct prompts of benchTokens ids each: realistic
// ids (and so JSON bytes) rather than counting numbers.
func benchPrompts(b *testing.B, n int) [][]uint64 {
	_, ids := benchConversations(b, n)
	return ids
}

// benchConversations are benchPrompts' conversations: each one's text
// (as its chat template renders it) and its first benchTokens ids.
func benchConversations(b *testing.B, n int) (texts []string, prompts [][]uint64) {
	tok, err := tokenizer.LoadFile("../../tokenizer/testdata/qwen2.5/tokenizer.json.gz")
	if err != nil {
		b.Fatal(err)
	}
	para := "The user asked how the cluster should route long conversations, and the assistant " +
		"explained that every turn repeats the earlier ones, so the pod that served the last turn " +
		"already holds most of the prompt's KV cache in GPU memory. "
	for p := range n {
		var sb strings.Builder
		fmt.Fprintf(&sb, "<|im_start|>system\nConversation %d.<|im_end|>\n", p)
		ids := []uint64{}
		for i := 0; len(ids) < benchTokens; i++ {
			role := "user"
			if i%2 == 1 {
				role = "assistant"
			}
			fmt.Fprintf(&sb, "<|im_start|>%s\nTurn %d. %s%s<|im_end|>\n", role, i, para, para)
			if i%16 == 15 {
				ids = tok.Encode(sb.String(), false)
			}
		}
		texts, prompts = append(texts, sb.String()), append(prompts, ids[:benchTokens])
	}
	return texts, prompts
}

// benchIndex is a kvindex server, tokenizing with toks, whose index
// holds each prompt on two pods (one in full, one to half its depth).
func benchIndex(b *testing.B, prompts [][]uint64, toks ...server.NamedTokenizer) (*server.Server, []gateway.Endpoint) {
	h, err := blockhash.New(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: bs})
	if err != nil {
		b.Fatal(err)
	}
	ix, err := indexer.New(indexer.Options{Hasher: h})
	if err != nil {
		b.Fatal(err)
	}
	var eps []gateway.Endpoint
	for i := range benchPods {
		eps = append(eps, gateway.Endpoint{Pod: fmt.Sprintf("pod-%d", i), Addr: fmt.Sprintf("10.0.0.%d:8000", i+1)})
	}
	seq := make([]uint64, benchPods)
	var streams heardStreams
	for _, e := range eps {
		streams = append(streams, kvevents.StreamStats{Engine: kvevents.EngineID{Model: testModel, Pod: e.Pod}, Connected: true})
	}
	for p, ids := range prompts {
		hs, err := h.Chain(nil, nil, 0, ids, nil)
		if err != nil {
			b.Fatal(err)
		}
		keys := make([]uint64, len(hs))
		for i := range hs {
			keys[i] = hs[i].Key
		}
		for k, depth := range []int{len(keys), len(keys) / 2} {
			e := (p + k*3) % benchPods
			ix.Apply(kvevents.EngineID{Model: testModel, Pod: eps[e].Pod}, seq[e], []kvevents.Event{{
				Kind: kvevents.BlockStored, Hashes: keys[:depth], TokenIDs: ids[:depth*bs], BlockSize: bs,
			}})
			seq[e]++
		}
	}
	srv, err := server.New(server.Config{Index: ix, BlockSize: bs, Hasher: h, DefaultModel: testModel, Streams: streams, ReadyGrace: -1, Tokenizers: toks})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Shutdown)
	return srv, eps
}

// serveIndex serves srv's gRPC API on loopback until the benchmark ends
// and returns a client of it.
func serveIndex(b *testing.B, srv *server.Server) *client.Client {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	gs := srv.NewGRPCServer()
	go gs.Serve(lis)
	b.Cleanup(gs.Stop)
	c, err := client.Dial(context.Background(), lis.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

// serveExtProc serves svc's ext_proc on loopback until the benchmark
// ends and returns a client of it, as Envoy would hold.
func serveExtProc(b *testing.B, svc *gateway.Service) extprocv3.ExternalProcessorClient {
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	xp := svc.ExtProc()
	pgs := grpc.NewServer(xp.ServerOptions()...)
	xp.Register(pgs)
	go pgs.Serve(pl)
	b.Cleanup(pgs.Stop)
	conn, err := grpc.NewClient(pl.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return extprocv3.NewExternalProcessorClient(conn)
}

// heardStreams reports every engine's event stream connected and
// healthy: the index vouches for their entries in full.
type heardStreams []kvevents.StreamStats

func (h heardStreams) Streams() []kvevents.StreamStats { return h }

// BenchmarkPicker measures the latency the picker adds to a request, as
// Envoy sees it over loopback ext_proc: from the request headers sent to
// the body's last frame answered (the destination comes with it), for a
// chat conversation of 16,384 tokens sent as token ids in 16 KB frames.
// The picker asks the index in the same process (local) or a kvindex
// over loopback gRPC, by token ids (remote) or by the block keys the
// picker hashes itself (remote-hashes: it learnt the index's hashing at
// its warm-up; each prompt is resent, so its keys come from the memo).
// query-bytes is the size of one LongestPrefix request on the wire
// (protobuf). The deadline is far above the path's
// latency, so the figures are the index's answer, never the fallback
// (the benchmark fails if any request fell back). One request at a time;
// run with -benchtime=3000x for stable percentiles.
func BenchmarkPicker(b *testing.B) {
	prompts := benchPrompts(b, 8)
	srv, eps := benchIndex(b, prompts)
	bodies := make([][]byte, len(prompts))
	for i, ids := range prompts {
		bodies[i] = []byte(idsBody(ids))
	}
	c := serveIndex(b, srv)

	for _, v := range []struct {
		name   string
		src    gateway.Source
		hashes bool
	}{
		{"local", gateway.Local{Server: srv}, false},
		{"remote", gateway.Remote{Client: c}, false},
		{"remote-hashes", gateway.Remote{Client: c}, true},
	} {
		b.Run(v.name, func(b *testing.B) {
			reg := prometheus.NewRegistry()
			svc, err := gateway.New(gateway.Config{Endpoints: eps, Scorer: noSpeculation(), IndexTimeout: time.Second, Registry: reg}, v.src)
			if err != nil {
				b.Fatal(err)
			}
			if v.hashes {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if err := svc.Warm(ctx, 0); err != nil {
					b.Fatal(err)
				}
			}
			r, err := gateway.ParseRequest(bodies[0], func(string) string { return "" })
			if err != nil {
				b.Fatal(err)
			}
			q := &kvindexv1.LongestPrefixRequest{Model: r.Model, Prompt: r.Prompt, CandidatePods: podNames(eps)}
			if keys := svc.PromptKeys(r); keys != nil {
				q.Prompt = client.HashesPrompt(keys)
			} else if v.hashes {
				b.Fatal("the picker does not hash after its warm-up")
			}
			qbytes := proto.Size(q)
			xc := serveExtProc(b, svc)
			// Warm the connections, pools and the index's memo once per
			// prompt, and check each is answered by its full holder.
			for i := range bodies {
				if dest := pickOnce(b, xc, bodies[i]); dest != eps[i%benchPods].Addr {
					b.Fatalf("prompt %d went to %s, held in full by %s", i, dest, eps[i%benchPods].Addr)
				}
			}
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				t0 := time.Now()
				pickOnce(b, xc, bodies[i%len(bodies)])
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			if n := fallbacks(b, reg); n != 0 {
				b.Fatalf("%v requests fell back: the figures would not be the index's path", n)
			}
			if n := mustVec(b, reg, "kvindex_picker_index_queries_total", "hashes"); v.hashes != (n > 0) {
				b.Fatalf("%v queries by hashes", n)
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-us")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us")
			b.ReportMetric(float64(qbytes), "query-bytes")
		})
	}
}

func podNames(eps []gateway.Endpoint) []string {
	var out []string
	for _, e := range eps {
		out = append(out, e.Pod)
	}
	return out
}

// pickOnce plays Envoy for one request up to the picker's decision: the
// headers, the body in frames, and the answers until the body's end; it
// returns the destination.
func pickOnce(b *testing.B, xc extprocv3.ExternalProcessorClient, body []byte) string {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := xc.Process(ctx)
	if err != nil {
		b.Fatal(err)
	}
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
		{Key: "content-type", RawValue: []byte("application/json")},
	}}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: hm}}}); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < len(body); i += benchFrame {
		end := min(i+benchFrame, len(body))
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: body[i:end], EndOfStream: end == len(body)}}}); err != nil {
			b.Fatal(err)
		}
	}
	dest := ""
	for {
		resp, err := st.Recv()
		if err != nil {
			b.Fatal(err)
		}
		switch r := resp.Response.(type) {
		case *extprocv3.ProcessingResponse_RequestHeaders:
			for _, h := range r.RequestHeaders.GetResponse().GetHeaderMutation().GetSetHeaders() {
				if h.GetHeader().GetKey() == gateway.HeaderDestination {
					dest = string(h.GetHeader().GetRawValue())
				}
			}
		case *extprocv3.ProcessingResponse_RequestBody:
			if r.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() {
				if dest == "" {
					b.Fatal("no destination")
				}
				return dest
			}
		default:
			b.Fatalf("unexpected answer %T", r)
		}
	}
}

// BenchmarkPickerParse is the part of BenchmarkPicker's requests spent
// reading the body: ParseRequest of the same 16,384-id bodies.
func BenchmarkPickerParse(b *testing.B) {
	prompts := benchPrompts(b, 8)
	bodies := make([][]byte, len(prompts))
	for i, ids := range prompts {
		bodies[i] = []byte(idsBody(ids))
	}
	none := func(string) string { return "" }
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := gateway.ParseRequest(bodies[i%len(bodies)], none); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPickerQuery is BenchmarkPicker's index path alone: Service.Pick
// of the parsed 16,384-id requests, the index over loopback gRPC, asked
// by token ids (remote) or by the block keys the picker hashes
// (remote-hashes, from its memo: each prompt is resent; remote-hashes-cold,
// a memo too small to hold any, so every prompt is hashed in full). One
// request at a time.
func BenchmarkPickerQuery(b *testing.B) {
	prompts := benchPrompts(b, 8)
	srv, eps := benchIndex(b, prompts)
	c := serveIndex(b, srv)
	reqs := make([]*gateway.Request, len(prompts))
	var err error
	for i, ids := range prompts {
		if reqs[i], err = gateway.ParseRequest([]byte(idsBody(ids)), func(string) string { return "" }); err != nil {
			b.Fatal(err)
		}
	}
	for _, v := range []struct {
		name   string
		hashes bool
		memo   int
	}{{"remote", false, 0}, {"remote-hashes", true, 0}, {"remote-hashes-cold", true, 1}} {
		b.Run(v.name, func(b *testing.B) {
			reg := prometheus.NewRegistry()
			svc, err := gateway.New(gateway.Config{Endpoints: eps, Scorer: noSpeculation(), IndexTimeout: time.Second, HashMemoEntries: v.memo, Registry: reg}, gateway.Remote{Client: c})
			if err != nil {
				b.Fatal(err)
			}
			if v.hashes {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if err := svc.Warm(ctx, 0); err != nil {
					b.Fatal(err)
				}
			}
			pick := func(i int) {
				d, done, err := svc.Pick(context.Background(), reqs[i%len(reqs)], nil)
				if err != nil {
					b.Fatal(err)
				}
				done()
				if d.Endpoint != eps[i%len(reqs)%benchPods].Addr {
					b.Fatalf("prompt %d went to %s", i%len(reqs), d.Endpoint)
				}
			}
			for i := range reqs {
				pick(i)
			}
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				t0 := time.Now()
				pick(i)
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			if n := fallbacks(b, reg); n != 0 {
				b.Fatalf("%v requests fell back", n)
			}
			if n := mustVec(b, reg, "kvindex_picker_index_queries_total", "hashes"); v.hashes != (n > 0) {
				b.Fatalf("%v queries by hashes", n)
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-us")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us")
		})
	}
}

// BenchmarkPickerTokenize is BenchmarkPickerQuery for a prompt sent as
// text (benchConversations' conversations, about 16,400 tokens, as a
// completion prompt), within the default index deadline (IndexBudget:
// DefaultIndexTimeout + DefaultIndexTimeoutPer1K per 1,000 tokens):
// Service.Pick, the index over loopback gRPC. In index-tokenizes the
// picker sends the text, which the index tokenizes with its local
// tokenizer (Qwen2.5's tokenizer.json; an engine's /tokenize would add a
// round trip) within the deadline; in picker-tokenizes the picker
// tokenizes it with the same tokenizer (Config.Tokenizer), before the
// deadline starts, and sends the block keys it hashes. fallback-% is the
// share of requests routed without the index's answer. One request at a
// time.
func BenchmarkPickerTokenize(b *testing.B) {
	texts, prompts := benchConversations(b, 8)
	tok, err := tokenizer.LoadFile("../../tokenizer/testdata/qwen2.5/tokenizer.json.gz")
	if err != nil {
		b.Fatal(err)
	}
	srv, eps := benchIndex(b, prompts, server.NamedTokenizer{Source: client.SourceLocal, Tokenizer: tok})
	c := serveIndex(b, srv)
	bodies := make([][]byte, len(texts))
	for i, text := range texts {
		body, err := json.Marshal(map[string]string{"model": testModel, "prompt": text})
		if err != nil {
			b.Fatal(err)
		}
		bodies[i] = body
	}
	for _, v := range []struct {
		name  string
		tok   tokenizer.Tokenizer
		input string
	}{{"index-tokenizes", nil, "text"}, {"picker-tokenizes", tok, "hashes"}} {
		b.Run(v.name, func(b *testing.B) {
			reg := prometheus.NewRegistry()
			svc, err := gateway.New(gateway.Config{Endpoints: eps, Scorer: noSpeculation(), Tokenizer: v.tok, Registry: reg}, gateway.Remote{Client: c})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if err := svc.Warm(ctx, 0); err != nil {
				b.Fatal(err)
			}
			pick := func(i int) {
				r, err := gateway.ParseRequest(bodies[i%len(bodies)], func(string) string { return "" })
				if err != nil {
					b.Fatal(err)
				}
				d, done, err := svc.Pick(context.Background(), r, nil)
				if err != nil {
					b.Fatal(err)
				}
				done()
				if d.Fallback == "" && d.Endpoint != eps[i%len(bodies)%benchPods].Addr {
					b.Fatalf("prompt %d went to %s", i%len(bodies), d.Endpoint)
				}
			}
			for i := range bodies {
				pick(i)
			}
			fb0 := fallbacks(b, reg)
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				t0 := time.Now()
				pick(i)
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			if n := mustVec(b, reg, "kvindex_picker_index_queries_total", v.input); n == 0 {
				b.Fatalf("no query by %s", v.input)
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-us")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us")
			b.ReportMetric(100*(fallbacks(b, reg)-fb0)/float64(b.N), "fallback-%")
		})
	}
}
