package service

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/enginesim/simzmq"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

const (
	testModel     = "Qwen/Qwen2.5-0.5B"
	testBlockSize = 16
	// testDeadline bounds every wait for something to happen.
	testDeadline = 20 * time.Second
)

var testHasher = blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: testBlockSize})

// testLogger logs into a buffer that is shown if the test fails.
func testLogger(t *testing.T) (*slog.Logger, *testutil.SyncBuffer) {
	t.Helper()
	logs := &testutil.SyncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs:\n%s", logs.String())
		}
	})
	return slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), logs
}

// baseOptions are a service's options on loopback's free ports, with
// the defaults kvindex serve has, following engines.
func baseOptions(engines ...zmqtransport.EngineConfig) *Options {
	o := DefaultOptions()
	o.GRPCAddr, o.HTTPAddr, o.Model, o.Engines = "127.0.0.1:0", "127.0.0.1:0", testModel, engines
	o.Index.Hasher, o.ReadyGrace = testHasher, time.Minute
	return o
}

// newEngine starts a simulated engine publishing over ZMQ with a replay
// socket, closed when the test ends.
func newEngine(t *testing.T, pod string) (*simzmq.Engine, zmqtransport.EngineConfig) {
	t.Helper()
	e, err := simzmq.New(enginesim.Config{Pod: pod, Model: testModel, Hasher: testHasher, CapacityBlocks: 4096},
		zmqtransport.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e, zmqtransport.EngineConfig{Name: pod, Model: testModel, Endpoint: e.PubEndpoint(), ReplayEndpoint: e.ReplayEndpoint(), Ranks: 1}
}

// started is a running service and a client of it.
type started struct {
	*Service
	client *client.Client
	cancel context.CancelFunc
	logs   *testutil.SyncBuffer
}

// startService starts the service of o, stopped (and its stop checked)
// when the test ends.
func startService(t *testing.T, o *Options) *started {
	t.Helper()
	log, logs := testLogger(t)
	s, err := New(o, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := s.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	st := &started{Service: s, cancel: cancel, logs: logs}
	t.Cleanup(func() { st.stop(t) })
	dctx, dcancel := context.WithTimeout(context.Background(), testDeadline)
	defer dcancel()
	if st.client, err = client.Dial(dctx, s.GRPCAddr()); err != nil {
		t.Fatal(err)
	}
	return st
}

// stop stops the service (once) and checks that it stopped cleanly.
func (s *started) stop(t *testing.T) {
	t.Helper()
	if s.cancel == nil {
		return
	}
	s.cancel()
	s.cancel = nil
	s.client.Close()
	if err := s.Wait(); err != nil {
		t.Errorf("stop: %v", err)
	}
}

// await polls cond until it holds, failing the test after testDeadline.
func await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.Await(t, testDeadline, what, cond)
}

// matched is each pod's matched blocks for tokens, as s answers.
func (s *started) matched(t *testing.T, tokens []uint64) map[string]uint32 {
	t.Helper()
	res, err := s.client.LongestPrefixTokens(context.Background(), testModel, tokens, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint32{}
	for _, p := range res.GetPods() {
		out[p.GetPod()] = p.GetMatchedBlocks()
	}
	return out
}

// awaitHeld waits until s answers that pod holds tokens' every block.
func (s *started) awaitHeld(t *testing.T, pod string, tokens []uint64) {
	t.Helper()
	want := uint32(len(tokens) / testBlockSize)
	await(t, pod+" holding the prompt", func() bool { return s.matched(t, tokens)[pod] == want })
}

// startPicker builds and starts a picker from o, logging to log; stop
// ends it and reports a failed stop (tests that check for leaked
// goroutines call it themselves, the others leave it to t.Cleanup, where
// it is called again harmlessly).
func startPicker(t *testing.T, o *PickerServiceOptions, log *slog.Logger) (pk *PickerService, stop func()) {
	t.Helper()
	pk, err := NewPicker(o, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := pk.Start(ctx); err != nil {
		cancel()
		t.Fatalf("the picker did not start: %v", err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := pk.Wait(); err != nil {
				t.Errorf("picker stop: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return pk, stop
}
