package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/internal/service"
	"github.com/kvindex/kvindex/internal/testutil"
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
	x := &e2e{t: t, engines: engines, logs: &testutil.SyncBuffer{}}
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
		return svc.Wait()
	}}
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if t.Failed() {
			t.Logf("kvindex logs:\n%s", x.logs.String())
		}
	})
	if x.client, err = client.Dial(context.Background(), svc.GRPCAddr()); err != nil {
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
	t.Parallel() // its own service and engines on free ports
	dir := t.TempDir()
	a := newStateEngine(t, "pod-a")
	engines := map[string]*simzmq.Engine{"pod-a": a}
	prompt := testutil.Seq(7000, 6*e2eBlockSize)

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
	if err := configUsage(service.Check(o, slog.New(slog.DiscardHandler)), serveFlagNames); err == nil || !strings.HasPrefix(err.Error(), "--state-dir: ") {
		t.Errorf("a state dir under a file: %v, want an error naming --state-dir", err)
	}
}
