package main

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/statefile"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/enginesim/simzmq"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// stateRun is one kvindex serve process (in-process) following engines.
type stateRun struct {
	*e2e
	stop func() error // stops serve (as SIGTERM does) and reports how it went
}

// startStateRun starts serve with --state-dir dir following engines.
func startStateRun(t *testing.T, dir string, engines map[string]*simzmq.Engine) *stateRun {
	t.Helper()
	x := &e2e{t: t, engines: engines, logs: &syncBuffer{}}
	args := []string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--model", e2eModel,
		"--hash-algo", "sha256_cbor", "--hash-seed", "0", "--block-size", "16", "--ready-grace", "1m",
		"--state-dir", dir, "--snapshot-interval", "1h"}
	for pod, e := range engines {
		args = append(args, "--engine", pod+"="+e.PubEndpoint()+",replay="+e.ReplayEndpoint())
	}
	o, _, err := parseServe(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	log, _ := newLogger(x.logs, "debug", "text")
	ctx, cancel := context.WithCancel(context.Background())
	svc, err := startService(ctx, o, log)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	x.svc = svc
	stopped := false
	r := &stateRun{e2e: x, stop: func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return svc.wait()
	}}
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if t.Failed() {
			t.Logf("kvindex logs:\n%s", x.logs.String())
		}
	})
	if x.client, err = client.Dial(context.Background(), svc.grpcAddr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.client.Close() })
	return r
}

func newStateEngine(t *testing.T, pod string) *simzmq.Engine {
	t.Helper()
	e, err := simzmq.New(enginesim.Config{Pod: pod, Model: e2eModel, Hasher: e2eHasher, CapacityBlocks: 4096},
		zmqtransport.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func (x *e2e) awaitHealth(pod string, want kvindexv1.EngineHealth) {
	x.t.Helper()
	x.await(pod+" "+want.String(), func() bool {
		p := x.pod(pod, 0)
		return p != nil && p.GetHealth() == want
	})
}

// TestStateDirRestart: serve stops (writing its state), starts again from
// the state dir and answers what the engine holds at once, reported
// restored; once the engine confirms the position by replay, ok. An engine
// that restarted meanwhile is recognised and its old entries dropped.
func TestStateDirRestart(t *testing.T) {
	dir := t.TempDir()
	a := newStateEngine(t, "pod-a")
	engines := map[string]*simzmq.Engine{"pod-a": a}
	prompt := tokensFrom(7000, 6*e2eBlockSize)

	r1 := startStateRun(t, dir, engines)
	r1.warmUp("pod-a")
	if _, err := a.Process(prompt, nil); err != nil {
		t.Fatal(err)
	}
	r1.awaitMatched(prompt, map[string]uint32{"pod-a": 6})
	if err := r1.stop(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(r1.logs.String(), "state snapshot written") {
		t.Fatalf("no snapshot at shutdown:\n%s", r1.logs.String())
	}

	// The engine keeps its cache (and publishes nothing) while kvindex is
	// away: only the state dir can tell kvindex about the prompt.
	r2 := startStateRun(t, dir, engines)
	if got := r2.matched(prompt); got["pod-a"] != 6 {
		t.Fatalf("after restart the index answers %v, want pod-a: 6", got)
	}
	// On connecting, kvindex replays from its position: the same process,
	// so the restored entries are confirmed.
	r2.awaitHealth("pod-a", kvindexv1.EngineHealth_ENGINE_HEALTH_OK)
	if !strings.Contains(r2.logs.String(), "engine verified by replay (same process)") {
		t.Error("ok without a verifying replay")
	}
	r2.awaitMatched(prompt, map[string]uint32{"pod-a": 6})
	if err := r2.stop(); err != nil {
		t.Fatal(err)
	}

	// The engine restarts (a new process, same name) while kvindex is away.
	a2 := newStateEngine(t, "pod-a")
	r3 := startStateRun(t, dir, map[string]*simzmq.Engine{"pod-a": a2})
	r3.warmUp("pod-a")
	r3.awaitHealth("pod-a", kvindexv1.EngineHealth_ENGINE_HEALTH_OK)
	r3.awaitMatched(prompt, map[string]uint32{"pod-a": 0})
}

// TestStateDirRefusals: a state file kvindex cannot use leaves it empty,
// never half restored; a corrupted one is kept aside for inspection.
func TestStateDirRefusals(t *testing.T) {
	o, _, err := parseServe(t, "--engine", "pod-a=tcp://127.0.0.1:1", "--model", "m", "--hash-algo", "sha256_cbor",
		"--hash-seed", "0", "--block-size", "16", "--state-dir", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	fresh := func() (*stateDir, *indexer.Index, *syncBuffer) {
		ix, err := indexer.New(o.index)
		if err != nil {
			t.Fatal(err)
		}
		logs := &syncBuffer{}
		log, _ := newLogger(logs, "debug", "text")
		d, err := newStateDir(o, ix, log)
		if err != nil {
			t.Fatal(err)
		}
		return d, ix, logs
	}
	// A state file of one engine, written by a kvindex hashing as o does.
	src, _, _ := fresh()
	id := kvevents.EngineID{Model: "m", Pod: "pod-a"}
	src.index.Apply(id, 3, []kvevents.Event{{Kind: kvevents.BlockStored, Hashes: []uint64{11, 12}, BlockSize: 16}})
	writeState := func(h statefile.Hashing) {
		w, err := statefile.Begin(o.stateDir)
		if err != nil {
			t.Fatal(err)
		}
		hdr := &statefile.Header{Hashing: h, Positions: statefile.FromPositions([]kvevents.Position{
			{Engine: id, Seq: 3, Print: 5}, {Engine: kvevents.EngineID{Model: "m", Pod: "gone"}, Seq: 9},
		})}
		if err := w.Write(hdr, src.index.Snapshot); err != nil {
			t.Fatal(err)
		}
		if err := w.Commit(); err != nil {
			t.Fatal(err)
		}
	}

	writeState(src.hashing)
	d, ix, _ := fresh()
	pos := d.restore(o)
	if len(pos) != 1 || pos[0].Engine != id || pos[0].Seq != 3 || pos[0].Print != 5 {
		t.Fatalf("restored positions %+v, want pod-a's only (gone is not configured)", pos)
	}
	if st := ix.Stats(); st.HolderBlocks != 2 {
		t.Fatalf("restored %d holder blocks, want 2", st.HolderBlocks)
	}

	other := src.hashing
	other.Seed = "1"
	writeState(other)
	d, ix, logs := fresh()
	if pos := d.restore(o); pos != nil || ix.Stats().HolderBlocks != 0 {
		t.Errorf("another hash seed: restored %v, %d blocks; want nothing", pos, ix.Stats().HolderBlocks)
	}
	if !strings.Contains(logs.String(), "hashed otherwise") {
		t.Errorf("the refusal is not logged:\n%s", logs)
	}

	writeState(src.hashing)
	path := filepath.Join(o.stateDir, statefile.Name)
	b, _ := os.ReadFile(path)
	b[len(b)-3] ^= 1 // in the snapshot's last frame
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	d, ix, logs = fresh()
	if pos := d.restore(o); pos != nil || ix.Stats().HolderBlocks != 0 {
		t.Errorf("corrupted file: restored %v, %d blocks; want nothing", pos, ix.Stats().HolderBlocks)
	}
	if _, err := os.Stat(path + ".bad"); err != nil {
		t.Errorf("the corrupted file is not kept: %v", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the corrupted file is still the state file: %v", err)
	}
	if !strings.Contains(logs.String(), "state file refused") {
		t.Errorf("the refusal is not logged:\n%s", logs)
	}
}

func TestStateDirFlags(t *testing.T) {
	if _, _, err := parseServe(t, "--engine", "a=tcp://h:1", "--model", "m", "--snapshot-interval", "1ms"); err == nil ||
		!strings.Contains(err.Error(), "--snapshot-interval") {
		t.Errorf("a 1ms interval: %v, want an error naming --snapshot-interval", err)
	}
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o600)
	o, _, err := parseServe(t, "--engine", "a=tcp://h:1", "--model", "m", "--state-dir", filepath.Join(file, "sub"))
	if err != nil {
		t.Fatal(err)
	}
	ix, _ := indexer.New(o.index)
	if _, err := newStateDir(o, ix, nil); err == nil || !strings.Contains(err.Error(), "--state-dir") {
		t.Errorf("a state dir under a file: %v, want an error naming --state-dir", err)
	}
}
