package gateway_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/api/server"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/picker"
	"github.com/kvindex/kvindex/picker/gateway"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
)

// hashIndex is kvindex hashing with h, with no engines, served over
// loopback gRPC; hashCfg, when not nil, replaces what it answers to
// GetHashConfig (an index that says one thing and does another).
func hashIndex(t *testing.T, h *blockhash.Hasher, hashCfg *kvindexv1.HashConfig) string {
	t.Helper()
	ix, err := indexer.New(indexer.Options{Hasher: h})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Index: ix, BlockSize: h.BlockSize(), Hasher: h, DefaultModel: testModel, ReadyGrace: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return serveGRPC(t, func(gs grpc.ServiceRegistrar) {
		if hashCfg == nil {
			srv.Register(gs)
			return
		}
		kvindexv1.RegisterIndexServiceServer(gs, sayingIndex{srv, hashCfg})
	})
}

type sayingIndex struct {
	*server.Server
	cfg *kvindexv1.HashConfig
}

func (s sayingIndex) GetHashConfig(context.Context, *kvindexv1.GetHashConfigRequest) (*kvindexv1.HashConfig, error) {
	return s.cfg, nil
}

// warmPicker is a picker asking the index at addr, warmed (so that it
// has learnt the index's hashing), logging into log.
func warmPicker(t *testing.T, addr string, blockSize int, log *bytes.Buffer) (*gateway.Service, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	sc := noSpeculation()
	sc.BlockSize = blockSize
	cfg := gateway.Config{Endpoints: []gateway.Endpoint{{Pod: "pod-a", Addr: "127.0.0.1:1"}}, Scorer: sc, IndexTimeout: waitFor, Registry: reg}
	if log != nil {
		cfg.Logger = slog.New(slog.NewTextHandler(&lockedWriter{w: log}, nil))
	}
	svc, err := gateway.New(cfg, remote(t, addr))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := svc.Warm(ctx, waitFor); err != nil {
		t.Fatal(err)
	}
	return svc, reg
}

type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// The keys the picker computes are the index's own for the same tokens
// (the index's Lookup, by token ids, over gRPC: its own hashing and
// memo), for every algorithm, two seeds, two block sizes, and with LoRA
// name and cache salt; through the picker's memo too: a conversation's
// later turns, and a prompt leaving it after a checkpoint.
func TestPickerHashesAsTheIndex(t *testing.T) {
	type extras struct{ lora, salt string }
	for _, algo := range blockhash.Algos {
		for _, seed := range []string{"0", blockhash.DefaultSeed} {
			for _, bsz := range []int{16, 32} {
				xs := []extras{{}, {lora: "sql-lora", salt: "s1"}, {salt: "s2"}}
				if algo == blockhash.SGLang {
					xs = xs[:1] // SGLang hashing has no extra keys
				}
				for _, x := range xs {
					name := fmt.Sprintf("%s/seed=%s/bs=%d/lora=%q/salt=%q", algo, seed, bsz, x.lora, x.salt)
					t.Run(name, func(t *testing.T) {
						h, err := blockhash.New(blockhash.Config{Algo: algo, Seed: seed, BlockSize: bsz})
						if err != nil {
							t.Fatal(err)
						}
						addr := hashIndex(t, h, nil)
						svc, _ := warmPicker(t, addr, bsz, nil)
						c := remote(t, addr).(gateway.Remote).Client
						turn1 := testutil.Seq(7, 70*bsz+5)
						turn2 := append(slices.Clone(turn1), testutil.Seq(90000, 6*bsz+3)...)
						turn3 := append(slices.Clone(turn2[:40*bsz+1]), testutil.Seq(50000, 9*bsz)...)
						short := testutil.Seq(3, bsz-1)
						for i, ids := range [][]uint64{turn1, turn2, turn2, turn3, turn1, short} {
							p := &kvindexv1.Prompt{Input: &kvindexv1.Prompt_Tokens{Tokens: &kvindexv1.TokenIds{Ids: ids}}, LoraName: x.lora, CacheSalt: x.salt}
							got := svc.PromptKeys(&gateway.Request{Model: testModel, Prompt: p, Tokens: ids})
							resp, err := c.Lookup(context.Background(), testModel, p, nil)
							if err != nil {
								t.Fatal(err)
							}
							want := make([]uint64, len(resp.GetBlocks()))
							for j, b := range resp.GetBlocks() {
								want[j] = b.GetHash()
							}
							if len(ids) < bsz {
								if got != nil {
									t.Fatalf("prompt %d: %d keys for a prompt shorter than a block", i, len(got))
								}
								continue
							}
							if !slices.Equal(got, want) {
								t.Fatalf("prompt %d (%d tokens): the picker's keys differ from the index's\npicker %v\nindex  %v", i, len(ids), got, want)
							}
						}
					})
				}
			}
		}
	}
}

// The memo counts its hits, and a later turn hashes only its new blocks.
func TestPickerHashMemo(t *testing.T) {
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: bs})
	svc, reg := warmPicker(t, hashIndex(t, h, nil), bs, nil)
	turn1 := testutil.Seq(1, 100*bs+7)
	turn2 := append(slices.Clone(turn1), testutil.Seq(5000, 19*bs)...)
	for _, ids := range [][]uint64{turn1, turn2} {
		if svc.PromptKeys(&gateway.Request{Model: testModel, Prompt: client.TokensPrompt(ids), Tokens: ids}) == nil {
			t.Fatal("the picker does not hash")
		}
	}
	if hits, misses := mustVec(t, reg, "kvindex_picker_hash_memo_total", "hit"), mustVec(t, reg, "kvindex_picker_hash_memo_total", "miss"); hits != 1 || misses != 1 {
		t.Errorf("memo hits %v, misses %v; want 1 and 1", hits, misses)
	}
	// turn 2's 119 full blocks: 100 from turn 1's memo, 19 hashed.
	if memo, hashed := mustVec(t, reg, "kvindex_picker_hash_blocks_total", "memo"), mustVec(t, reg, "kvindex_picker_hash_blocks_total", "hashed"); memo != 100 || hashed != 100+19 {
		t.Errorf("blocks from the memo %v, hashed %v; want 100 and 119", memo, hashed)
	}
}

// Pickers querying by the keys they hashed (a remote index, and one in
// the same process, which Warm asks as well) and one querying by token
// ids pick the same pods, with the same matched prefixes, on the same
// workload: conversations whose first turns engines served.
func TestHashQueryPicksLikeIds(t *testing.T) {
	f := newFleet(t, "pod-a", "pod-b", "pod-c")
	hashSvc, hashReg := newService(t, f, remote(t, f.indexAddr), nil)
	localSvc, localReg := newService(t, f, gateway.Local{Server: f.srv}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, svc := range []*gateway.Service{hashSvc, localSvc} {
		if err := svc.Warm(ctx, waitFor); err != nil {
			t.Fatal(err)
		}
	}
	idsSvc, idsReg := newService(t, f, remote(t, f.indexAddr), nil) // never warmed: has not learnt the hashing
	var convs [][]uint64
	for i, ep := range f.endpoints {
		for j := range 2 {
			turn1 := testutil.Seq(10000*(2*i+j+1), (5+3*i+j)*bs+3)
			resp, err := http.Post("http://"+ep.Addr+"/v1/completions", "application/json", strings.NewReader(idsBody(turn1)))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			testutil.Await(t, waitFor, "the index to hear turn 1", func() bool { return f.held(t, ep.Pod, turn1) == len(turn1)/bs })
			convs = append(convs, append(slices.Clone(turn1), testutil.Seq(900000+1000*len(convs), 2*bs)...))
		}
	}
	convs = append(convs, testutil.Seq(777777, 4*bs)) // held by none
	for i, ids := range convs {
		body := []byte(idsBody(ids))
		var ds [3]picker.Decision
		for k, svc := range []*gateway.Service{hashSvc, idsSvc, localSvc} {
			r, err := gateway.ParseRequest(body, func(string) string { return "" })
			if err != nil {
				t.Fatal(err)
			}
			d, done, err := svc.Pick(context.Background(), r, nil)
			if err != nil {
				t.Fatal(err)
			}
			done()
			ds[k] = d
		}
		for _, d := range ds[1:] {
			if ds[0].Pod != d.Pod || ds[0].Fallback != "" || d.Fallback != "" || fmt.Sprint(ds[0].Scores) != fmt.Sprint(d.Scores) {
				t.Fatalf("conversation %d: by hashes %+v, by ids or in process %+v", i, ds[0], d)
			}
		}
	}
	for _, reg := range []*prometheus.Registry{hashReg, localReg} {
		if n := mustVec(t, reg, "kvindex_picker_index_queries_total", "hashes"); n != float64(len(convs)) {
			t.Errorf("a hashing picker sent %v queries by hashes; want %d", n, len(convs))
		}
	}
	if n := mustVec(t, idsReg, "kvindex_picker_index_queries_total", "tokens"); n != float64(len(convs)) {
		t.Errorf("the other picker sent %v queries by ids; want %d", n, len(convs))
	}
}

// A picker and an index that would hash differently never query by
// hashes: whether the index says a configuration the picker's code
// hashes otherwise (a digest that differs), or hashes otherwise than it
// says (the index refuses the keys: the request asks again with its
// ids). Either way it is an error in the log and the metric, and no
// request is routed without the index.
func TestHashMismatchFallsBackToIds(t *testing.T) {
	real := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: bs})
	said := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "1", BlockSize: bs})
	cases := []struct {
		name    string
		says    *kvindexv1.HashConfig
		hashes  float64 // queries sent by hashes
		logLine string
	}{
		{"digest differs", &kvindexv1.HashConfig{Algo: "sha256_cbor", Seed: "0", BlockSize: bs, Digest: real.Digest() + 1}, 0, "would hash prompts otherwise than its index"},
		{"unknown algorithm", &kvindexv1.HashConfig{Algo: "sha512_cbor", Seed: "0", BlockSize: bs, Digest: 42}, 0, "would hash prompts otherwise than its index"},
		{"index hashes otherwise", &kvindexv1.HashConfig{Algo: "sha256_cbor", Seed: "1", BlockSize: bs, Digest: said.Digest()}, 1, "the index refused the block keys"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var log bytes.Buffer
			svc, reg := warmPicker(t, hashIndex(t, real, tc.says), bs, &log)
			ids := testutil.Seq(1, 10*bs)
			for range 3 {
				r, err := gateway.ParseRequest([]byte(idsBody(ids)), func(string) string { return "" })
				if err != nil {
					t.Fatal(err)
				}
				d, done, err := svc.Pick(context.Background(), r, nil)
				if err != nil {
					t.Fatal(err)
				}
				done()
				if d.Fallback != "" {
					t.Fatalf("routed without the index: %s", d.Fallback)
				}
			}
			if n := mustVec(t, reg, "kvindex_picker_index_queries_total", "hashes"); n != tc.hashes {
				t.Errorf("%v queries by hashes; want %v", n, tc.hashes)
			}
			if n := mustVec(t, reg, "kvindex_picker_index_queries_total", "tokens"); n != 3 {
				t.Errorf("%v queries by ids; want 3", n)
			}
			if n := mustVec(t, reg, "kvindex_picker_hash_config_total", "mismatch"); n != 1 {
				t.Errorf("mismatches counted %v; want 1", n)
			}
			if !strings.Contains(log.String(), "level=ERROR") || !strings.Contains(log.String(), tc.logLine) {
				t.Errorf("no error logged saying %q:\n%s", tc.logLine, log.String())
			}
		})
	}
}

// An index that does not say how it hashes (older, or without a
// configured hashing) is asked by token ids, and that is counted, not an
// error.
func TestHashConfigUnknown(t *testing.T) {
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: bs})
	ix, err := indexer.New(indexer.Options{Hasher: h})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Index: ix, BlockSize: bs, DefaultModel: testModel, ReadyGrace: -1}) // no Hasher
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	var log bytes.Buffer
	svc, reg := warmPicker(t, serveGRPC(t, srv.Register), bs, &log)
	ids := testutil.Seq(1, 4*bs)
	if keys := svc.PromptKeys(&gateway.Request{Model: testModel, Prompt: client.TokensPrompt(ids), Tokens: ids}); keys != nil {
		t.Fatalf("the picker hashes (%d keys) for an index that did not say how", len(keys))
	}
	if n := mustVec(t, reg, "kvindex_picker_hash_config_total", "unknown"); n != 1 {
		t.Errorf("unknown counted %v times; want 1", n)
	}
	if strings.Contains(log.String(), "level=ERROR") {
		t.Errorf("an error logged for an index that does not say how it hashes:\n%s", log.String())
	}
}

// The index deadline: IndexBudget's rule, with the prompt counted in
// tokens, or in bytes of text / BytesPerToken.
func TestIndexBudget(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		base, per1K time.Duration
		tokens      int
		want        time.Duration
	}{
		{2 * ms, ms / 4, 0, 2 * ms},
		{2 * ms, ms / 4, 1000, 2*ms + ms/4},
		{2 * ms, ms / 4, 16384, 2*ms + 4096*time.Microsecond},
		{5 * ms, 0, 1 << 20, 5 * ms},
	} {
		if got := gateway.IndexBudget(tc.base, tc.per1K, tc.tokens); got != tc.want {
			t.Errorf("IndexBudget(%v, %v, %d) = %v; want %v", tc.base, tc.per1K, tc.tokens, got, tc.want)
		}
	}
	text := strings.Repeat("word ", 800) // 4,000 bytes
	for _, tc := range []struct {
		body string
		want int
	}{
		{idsBody(testutil.Seq(1, 1234)), 1234},
		{fmt.Sprintf(`{"model":%q,"prompt":%q}`, testModel, text), 4000 / gateway.BytesPerToken},
		{fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q},{"role":"user","content":%q}]}`, testModel, text, text), 8000 / gateway.BytesPerToken},
	} {
		r, err := gateway.ParseRequest([]byte(tc.body), func(string) string { return "" })
		if err != nil {
			t.Fatal(err)
		}
		if got := r.TokenCount(); got != tc.want {
			t.Errorf("%.60s...: counted %d tokens; want %d", tc.body, got, tc.want)
		}
	}
}
