package main

import (
	"encoding/json"
	"strings"
	"testing"

	"google.golang.org/grpc"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/doctor"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/enginesim/simzmq"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// doctorEngine is a simulated engine of TestDoctor: its hashing, what it
// sends, and what kvindex doctor must say of it.
type doctorEngine struct {
	pod    string
	cfg    blockhash.Config
	bytes  bool              // sends full digests
	extras *blockhash.Extras // the requests' LoRA name and salt
	flags  string            // kvindex flags doctor must print ("" : none)
	want   doctor.Outcome
}

// kvindex doctor against a kvindex following engines that each hash
// otherwise than it does (every algorithm, seed and block size; one
// seeding randomly), over real ZMQ and gRPC: it names each engine's
// configuration and the flags that mirror it, or says it cannot be
// mirrored, and exits 1.
func TestDoctorHashMismatch(t *testing.T) {
	t.Parallel() // its own service and engines on free ports
	// A seed as 32 random bytes would be.
	random := "b7e151628aed2a6abf7158809cf4f3c762e7160f38b4da56a784d9045190cfef"
	lora := &blockhash.Extras{LoRAName: "sql-lora", CacheSalt: "tenant-a"}
	engines := []doctorEngine{
		{"cbor-42", blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "42", BlockSize: 16}, false, lora, "--hash-algo sha256_cbor --hash-seed 42 --block-size 16", doctor.Found},
		{"xxcbor-0", blockhash.Config{Algo: blockhash.XXHashCBOR, Seed: "0", BlockSize: 32}, true, nil, "--hash-algo xxhash_cbor --hash-seed 0 --block-size 32", doctor.Found},
		{"pickle-default", blockhash.Config{Algo: blockhash.SHA256Pickle, Seed: blockhash.DefaultSeed, BlockSize: 64}, false, lora, "--hash-algo sha256 --hash-seed vllm-none-hash --block-size 64", doctor.Found},
		{"xxpickle-42", blockhash.Config{Algo: blockhash.XXHashPickle, Seed: "42", BlockSize: 128}, false, nil, "--hash-algo xxhash --hash-seed 42 --block-size 128", doctor.Found},
		{"sglang", blockhash.Config{Algo: blockhash.SGLang, BlockSize: 16}, false, nil, "--hash-algo sglang --block-size 16", doctor.Found},
		{"given-seed", blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "31337", BlockSize: 16}, false, nil, "--hash-algo sha256_cbor --hash-seed 31337 --block-size 16", doctor.Found},
		{"random", blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: random, BlockSize: 16}, true, nil, "", doctor.RandomSeed},
	}
	x := &e2e{t: t, logs: &testutil.SyncBuffer{}}
	// kvindex runs vLLM's default hashing with seed 7: none of theirs.
	args := []string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--model", e2eModel,
		"--hash-algo", "sha256_cbor", "--hash-seed", "7", "--block-size", "16", "--ready-grace", "1m"}
	sims := map[string]*simzmq.Engine{}
	for _, de := range engines {
		e, err := simzmq.New(enginesim.Config{Pod: de.pod, Model: e2eModel, Hasher: blockhash.MustNew(de.cfg), CapacityBlocks: 4096, BytesHashes: de.bytes},
			zmqtransport.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		sims[de.pod] = e
		args = append(args, "--engine", de.pod+"="+e.PubEndpoint()+",replay="+e.ReplayEndpoint())
	}
	o, f, err := parseServe(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	x.start(o, f.log.format)
	for i, de := range engines {
		e, bs := sims[de.pod], de.cfg.BlockSize
		// Until kvindex has flagged the engine (a SUB socket misses what
		// is published before its subscription reaches the engine).
		n := 0
		x.await(de.pod+" flagged", func() bool {
			n++
			if _, err := e.Process(testutil.Seq(100_000*(i+1)+n*1000, bs), de.extras); err != nil {
				t.Fatal(err)
			}
			p := x.pod(de.pod, 0)
			return p != nil && p.GetHashCheck().String() == "HASH_CHECK_MISMATCH"
		})
		// A sequence stored in two events: the second chains from the first.
		prompt := testutil.Seq(900_000+i*10_000, 5*bs)
		for _, cut := range []int{3 * bs, 5 * bs} {
			if _, err := e.Process(prompt[:cut], de.extras); err != nil {
				t.Fatal(err)
			}
		}
	}
	var r doctor.Report
	x.await("every engine's events kept", func() bool {
		out, errOut, code := runCLI(t, "doctor", "--server", x.svc.GRPCAddr(), "--json", "--seed", "31337")
		if code != exitRuntime || !strings.Contains(errOut, "findings") {
			t.Fatalf("exit %d, stderr %q, want 1 with findings", code, errOut)
		}
		r = doctor.Report{}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		for _, f := range r.Findings {
			if f.Hash == nil || f.Hash.Samples < 3 {
				return false
			}
		}
		return len(r.Findings) == len(engines)
	})
	byPod := map[string]doctor.Finding{}
	for _, f := range r.Findings {
		byPod[f.Pod] = f
	}
	for _, de := range engines {
		f := byPod[de.pod]
		if f.Kind != doctor.KindHashMismatch || f.Hash.Outcome != de.want || f.Hash.KvindexFlags != de.flags {
			t.Errorf("%s: %s, %+v; want %s with %q", de.pod, f.Kind, f.Hash, de.want, de.flags)
		}
	}
	if h := byPod["random"].Hash; h.Algo != "sha256_cbor" || h.BlockSize != 16 || !strings.Contains(byPod["random"].Problem, "not reproducible: the engine seeds its hashes randomly") {
		t.Errorf("random: %+v", byPod["random"])
	}
	if f := byPod["cbor-42"]; f.Hash.Extras != doctor.ExtrasReported || !strings.Contains(f.Fix, "PYTHONHASHSEED=7") {
		t.Errorf("cbor-42: %+v", f)
	}

	// The text form, narrowed to one pod.
	out, _, code := runCLI(t, "doctor", "--server", x.svc.GRPCAddr(), "--pod", "xxcbor-0")
	want := "xxcbor-0 (" + e2eModel + "): hash mismatch"
	if code != exitRuntime || !strings.HasPrefix(out, "1 engine followed by kvindex at ") || !strings.Contains(out, want) ||
		!strings.Contains(out, "fix: run kvindex serve with --hash-algo xxhash_cbor --hash-seed 0 --block-size 32") {
		t.Errorf("exit %d, output:\n%s", code, out)
	}
}

// A fleet whose engines hash as kvindex does is healthy: exit 0.
func TestDoctorHealthy(t *testing.T) {
	t.Parallel() // its own service and engines on free ports
	x := startE2E(t, []string{"pod-a", "pod-b"})
	out, errOut, code := runCLI(t, "doctor", "--server", x.svc.GRPCAddr())
	if code != exitOK || errOut != "" || out != "2 engines followed by kvindex at "+x.svc.GRPCAddr()+", hashing sha256_cbor, seed \"0\", block size 16: healthy\n" {
		t.Fatalf("exit %d, stderr %q, output %q", code, errOut, out)
	}
	out, _, code = runCLI(t, "doctor", "--server", x.svc.GRPCAddr(), "--json", "--pod", "pod-b")
	var r doctor.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil || code != exitOK || !r.Healthy || r.Engines != 1 || len(r.Findings) != 0 {
		t.Fatalf("exit %d, %v: %s", code, err, out)
	}
	// A pod it does not follow is a finding.
	out, _, code = runCLI(t, "doctor", "--server", x.svc.GRPCAddr(), "--pod", "pod-z")
	if code != exitRuntime || !strings.Contains(out, "kvindex follows no engines of pod pod-z") {
		t.Errorf("exit %d, output %q", code, out)
	}
}

func TestDoctorUsage(t *testing.T) {
	tests := [][]string{
		{"doctor", "extra"},
		{"doctor", "--pod", ""},
		{"doctor", "--no-such-flag"},
		{"doctor", "--server", "ftp://kvindex"},
	}
	for _, args := range tests {
		if _, errOut, code := runCLI(t, args...); code != exitUsage || !strings.Contains(errOut, "kvindex doctor --help") {
			t.Errorf("%q: exit %d, stderr %q", args, code, errOut)
		}
	}
}

// The engines' events need the admin scope: with a query token doctor
// still reports the mismatch, saying what it could not read; with query
// and admin it names the engine's configuration.
func TestDoctorAdminScope(t *testing.T) {
	t.Parallel() // its own service and engines on free ports
	p := newPKI(t)
	auth := writeAuthFile(t, p.dir, `  - name: operator
    sha256: `+tokenSHA("admin-secret")+`
    scopes: [query, admin]
`)
	queryTok := writeToken(t, p.dir, "query", "query-secret")
	adminTok := writeToken(t, p.dir, "admin", "admin-secret")
	// The engines hash with seed 0.
	x := startE2EDial(t, []grpc.DialOption{dialTLS(t, client.TLSConfig{CAFile: p.ca.CertFile}), client.WithToken("query-secret")},
		[]string{"pod-a"}, "--hash-seed", "1", "--tls-cert", p.server.CertFile, "--tls-key", p.server.KeyFile, "--auth-tokens", auth)
	x.await("pod-a flagged", func() bool { return x.pod("pod-a", 0).GetHashCheck() == kvindexv1.HashCheck_HASH_CHECK_MISMATCH })
	doctorJSON := func(token string) doctor.Finding {
		t.Helper()
		out, errOut, code := runCLI(t, "doctor", "--json", "--server", x.svc.GRPCAddr(), "--tls-ca", p.ca.CertFile, "--token-file", token)
		var r doctor.Report
		if err := json.Unmarshal([]byte(out), &r); err != nil || code != exitRuntime || len(r.Findings) != 1 {
			t.Fatalf("exit %d, %v: %s %s", code, err, out, errOut)
		}
		return r.Findings[0]
	}
	if f := doctorJSON(queryTok); f.Hash.Outcome != doctor.NoSamples || !strings.Contains(f.Fix, "needs a credential with the admin scope") {
		t.Errorf("with the query token: %+v", f)
	}
	if f := doctorJSON(adminTok); f.Hash.Outcome != doctor.Found || f.Hash.KvindexFlags != "--hash-algo sha256_cbor --hash-seed 0 --block-size 16" {
		t.Errorf("with the admin token: %+v", f.Hash)
	}
}
