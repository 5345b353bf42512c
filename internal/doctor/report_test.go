package doctor

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/blockhash"
	"google.golang.org/protobuf/proto"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

// golden compares got with testdata/name, rewriting it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	p := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(p, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (go test -run %s -update):\n%s", p, t.Name(), got)
	}
}

func samplesResponse(t *testing.T, pod string, e engine) *kvindexv1.EngineHashSamples {
	out := &kvindexv1.EngineHashSamples{Pod: pod, Model: "m"}
	for _, s := range e.samples(t) {
		out.Samples = append(out.Samples, toProto(s))
	}
	return out
}

func TestBuild(t *testing.T) {
	mismatch := kvindexv1.HashCheck_HASH_CHECK_MISMATCH
	ok := kvindexv1.EngineHealth_ENGINE_HEALTH_OK
	in := Input{
		Server: "kvindex:50051",
		Hash:   &kvindexv1.HashConfig{Algo: "sha256", Seed: blockhash.DefaultSeed, BlockSize: 16},
		Pods: &kvindexv1.ListPodsResponse{Pods: []*kvindexv1.PodInfo{
			{Pod: "fine", Model: "m", Health: ok, Connected: true, HashCheck: kvindexv1.HashCheck_HASH_CHECK_VERIFIED},
			{Pod: "seed42", Model: "m", Health: ok, Connected: true, HashCheck: mismatch, Message: "hash mismatch: ..."},
			{Pod: "random", Model: "m", Health: ok, Connected: true, HashCheck: mismatch},
			{Pod: "quiet", Model: "m", Health: ok, Connected: true, HashCheck: mismatch},
			{Pod: "down", DpRank: 1, Model: "m", Endpoint: "tcp://10.0.0.9:5557", Health: kvindexv1.EngineHealth_ENGINE_HEALTH_DISCONNECTED},
			{Pod: "lossy", Model: "m", Health: kvindexv1.EngineHealth_ENGINE_HEALTH_DEGRADED, Connected: true, Gaps: 3, ReplaysFailed: 3},
			{Pod: "squeezed", Model: "m", Health: kvindexv1.EngineHealth_ENGINE_HEALTH_PARTIAL, Connected: true, ReplaysFailed: 1, ReplaysOk: 4},
			{Pod: "slow", Model: "m", Health: ok, Connected: true, HashCheck: kvindexv1.HashCheck_HASH_CHECK_VERIFIED, LastBatchLagSeconds: proto.Float64(31.04)},
			{Pod: "early", Model: "m", Health: ok, Connected: true, HashCheck: kvindexv1.HashCheck_HASH_CHECK_VERIFIED, LastBatchLagSeconds: proto.Float64(-12.5)},
		}, TokenizerChecks: []*kvindexv1.TokenizerCheck{
			{Form: "completion", Verdict: "match", Detail: "sample \"a\" (completion): 3 ids, the same as engine http://vllm:8000's"},
			{Form: "chat", Verdict: "mismatch", Disagrees: true, Detail: "sample \"b\" (chat): the ids differ first at position 2"},
		}},
		Samples: &kvindexv1.HashSamplesResponse{Engines: []*kvindexv1.EngineHashSamples{
			samplesResponse(t, "seed42", engine{cfg: blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "42", BlockSize: 64}, lora: "sql"}),
			samplesResponse(t, "random", engine{cfg: blockhash.Config{Algo: blockhash.XXHashPickle, Seed: "c0ffee", BlockSize: 16}, digests: true}),
		}},
	}
	r := Build(in)
	var kinds []string
	for _, f := range r.Findings {
		kinds = append(kinds, f.Engine+":"+f.Kind)
	}
	want := []string{"seed42:hash_mismatch", "random:hash_mismatch", "quiet:hash_mismatch", "down/1:disconnected", "lossy:degraded", "squeezed:partial", "squeezed:replay_failed", "slow:ingest_lag", "early:engine_clock_ahead", ":tokenizer_disagrees"}
	if r.Healthy || r.Engines != 9 || !slices.Equal(kinds, want) {
		t.Fatalf("healthy %v, %d engines, findings %v; want %v", r.Healthy, r.Engines, kinds, want)
	}
	if h := r.Findings[0].Hash; h.Outcome != Found || h.KvindexFlags != "--hash-algo sha256_cbor --hash-seed 42 --block-size 64" ||
		h.EngineSettings != "vLLM --prefix-caching-hash-algo sha256 --block-size 16 and PYTHONHASHSEED unset (vLLM releases after August 2026)" {
		t.Errorf("seed42: %+v", h)
	}
	if h := r.Findings[1].Hash; h.Outcome != RandomSeed || h.Algo != "xxhash" {
		t.Errorf("random: %+v", h)
	}
	var text, js bytes.Buffer
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	golden(t, "report.txt", text.Bytes())
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Findings) != len(r.Findings) {
		t.Fatalf("JSON does not read back: %v\n%s", err, js.Bytes())
	}
	golden(t, "report.json", js.Bytes())

	// Healthy: no findings; --pod narrows the report.
	in.Only = []string{"fine"}
	in.Pods.TokenizerChecks = in.Pods.TokenizerChecks[:1]
	if r := Build(in); !r.Healthy || r.Engines != 1 {
		t.Errorf("only the fine pod: %+v", r)
	}
	in.Only = []string{"nobody"}
	if r := Build(in); r.Healthy || r.Findings[0].Kind != KindNoEngines {
		t.Errorf("no such pod: %+v", r)
	}
	// kvindex's clock ahead of this one's.
	in.Only, in.Now = []string{"fine"}, time.UnixMilli(1_000_000)
	in.Pods.Pods[0].LastEventUnixMs = 1_000_000 + 1500
	if r := Build(in); !r.Healthy {
		t.Errorf("1.5 s ahead: %+v", r.Findings)
	}
	in.Pods.Pods[0].LastEventUnixMs = 1_000_000 + 60_000
	if r := Build(in); len(r.Findings) != 1 || r.Findings[0].Kind != KindClock || !strings.Contains(r.Findings[0].Problem, "at least 1m0s ahead") {
		t.Errorf("a minute ahead: %+v", r.Findings)
	}
	in.Now = time.Time{}
	// Without the admin scope the mismatch is still reported.
	in.Only, in.Samples, in.SamplesErr = []string{"seed42"}, nil, "the admin scope is needed"
	if r := Build(in); r.Findings[0].Hash.Outcome != NoSamples {
		t.Errorf("samples refused: %+v", r.Findings[0])
	}
}

func TestEngineSettings(t *testing.T) {
	tests := []struct {
		cfg  blockhash.Config
		want string
	}{
		{blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 16}, "vLLM --prefix-caching-hash-algo sha256_cbor --block-size 16 and PYTHONHASHSEED=0"},
		{blockhash.Config{Algo: blockhash.SHA256Pickle, Seed: blockhash.DefaultSeed, BlockSize: 32}, "vLLM --prefix-caching-hash-algo sha256 --block-size 32 and PYTHONHASHSEED unset (vLLM releases after August 2026)"},
		{blockhash.Config{Algo: blockhash.XXHashCBOR, Seed: blockhash.DefaultSeed, BlockSize: 16}, `vLLM --prefix-caching-hash-algo xxhash_cbor --block-size 16 and no PYTHONHASHSEED (seed "vllm-none-hash" is vLLM's default for sha256 and sha256_cbor only; pick an integer seed for both sides)`},
		{blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "007", BlockSize: 16}, `vLLM --prefix-caching-hash-algo sha256_cbor --block-size 16 and no PYTHONHASHSEED (Python takes only integers there, not "007"; pick an integer seed for both sides)`},
		{blockhash.Config{Algo: blockhash.SGLang, BlockSize: 64}, "SGLang with --page-size 64"},
	}
	for _, tc := range tests {
		if got := EngineSettings(tc.cfg); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.cfg, got, tc.want)
		}
	}
	if got := KvindexFlags(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "a b", BlockSize: 16}); got != "--hash-algo sha256_cbor --hash-seed 'a b' --block-size 16" {
		t.Errorf("flags %q", got)
	}
}

// An engine's lag is reported past lagTolerance, and a negative one (its
// clock ahead of kvindex's) past clockTolerance.
func TestLagFindings(t *testing.T) {
	tests := []struct {
		name string
		lag  *float64 // seconds; nil: unknown
		kind string   // "": no finding
		text string   // in the problem
	}{
		{"unknown", nil, "", ""},
		{"on time", proto.Float64(0.003), "", ""},
		{"at the tolerance", proto.Float64(lagTolerance.Seconds()), "", ""},
		{"behind", proto.Float64(7.34), KindLagging, "applies the engine's events 7.3s after it publishes them"},
		{"far behind", proto.Float64(3600), KindLagging, "1h0m0s after"},
		{"slightly ahead", proto.Float64(-0.5), "", ""},
		{"at the clock tolerance", proto.Float64(-clockTolerance.Seconds()), "", ""},
		{"clock ahead", proto.Float64(-12.5), KindEngineClock, "stamps its batches 12.5s after kvindex applies them"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &kvindexv1.PodInfo{Pod: "p", Model: "m", Health: kvindexv1.EngineHealth_ENGINE_HEALTH_OK, Connected: true, LastBatchLagSeconds: tt.lag}
			r := Build(Input{Pods: &kvindexv1.ListPodsResponse{Pods: []*kvindexv1.PodInfo{p}}})
			if tt.kind == "" {
				if !r.Healthy {
					t.Errorf("findings %+v, want none", r.Findings)
				}
				return
			}
			if len(r.Findings) != 1 || r.Findings[0].Kind != tt.kind || !strings.Contains(r.Findings[0].Problem, tt.text) || r.Findings[0].Fix == "" {
				t.Errorf("findings %+v, want one %s saying %q, with a fix", r.Findings, tt.kind, tt.text)
			}
		})
	}
}
