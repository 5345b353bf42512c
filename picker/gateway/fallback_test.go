package gateway_test

import (
	"cmp"
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/picker"
	"github.com/kvindex/kvindex/picker/gateway"
)

// A model the index does not know: ext_proc routes it by load with the
// reason said, or answers 404 at once, as configured.
func TestExtProcUnknownModel(t *testing.T) {
	f := newFleet(t, "pod-a", "pod-b")
	body := `{"model":"no-such-model","prompt":[1,2,3,4],"max_tokens":1}`
	for _, tt := range []struct {
		policy     gateway.UnknownModel
		wantStatus int // 0: routed
	}{
		{"", 0},
		{gateway.UnknownModelRoute, 0},
		{gateway.UnknownModelReject, http.StatusNotFound},
	} {
		t.Run(cmp.Or(string(tt.policy), "default"), func(t *testing.T) {
			svc, reg := newService(t, f, remote(t, f.indexAddr), func(c *gateway.Config) { c.UnknownModel = tt.policy })
			c, _ := startPicker(t, svc)
			e := send(t, c, "/v1/completions", nil, nil, body, 16)
			if e.status != tt.wantStatus {
				t.Fatalf("status %d (%s), want %d", e.status, e.body, tt.wantStatus)
			}
			if tt.wantStatus != 0 {
				if !strings.Contains(string(e.body), `unknown model \"no-such-model\"`) {
					t.Errorf("404 body %s does not name the model", e.body)
				}
				if n := mustVec(t, reg, "kvindex_picker_picks_total", "unknown_model"); n != 1 {
					t.Errorf("unknown_model picks = %v, want 1", n)
				}
				return
			}
			if e.dest == "" || e.fallback != string(picker.FallbackUnknownModel) {
				t.Errorf("destination %q, fallback %q: want routed with reason unknown_model", e.dest, e.fallback)
			}
			e.finish(t, nil)
			if n := mustVec(t, reg, "kvindex_picker_index_fallbacks_total", "unknown_model"); n != 1 {
				t.Errorf("unknown_model fallbacks = %v, want 1", n)
			}
		})
	}
}

// An index that does not answer within the deadline: /v1/pick says
// "timeout" in its JSON and header (ext_proc's header and metadata are
// checked by TestExtProcIndexFallback).
func TestHTTPPickTimeout(t *testing.T) {
	f := newFleet(t, "pod-a", "pod-b")
	stuck := &stuckIndex{asked: make(chan struct{}, 16)}
	stuckAddr := serveGRPC(t, func(r grpc.ServiceRegistrar) { kvindexv1.RegisterIndexServiceServer(r, stuck) })
	svc, reg := newService(t, f, remote(t, stuckAddr), func(c *gateway.Config) { c.IndexTimeout = 20 * time.Millisecond })
	hs := httptest.NewServer(svc.Handler())
	t.Cleanup(hs.Close)
	code, hdr, d := postPick(t, hs.URL, idsBody(testutil.Seq(1, 64)), nil)
	<-stuck.asked
	if code != http.StatusOK || d.Fallback != "timeout" || hdr.Get(gateway.HeaderFallback) != "timeout" {
		t.Errorf("status %d, fallback %q, header %q: want 200 and timeout", code, d.Fallback, hdr.Get(gateway.HeaderFallback))
	}
	if n := mustVec(t, reg, "kvindex_picker_index_fallbacks_total", "timeout"); n != 1 {
		t.Errorf("timeout fallbacks = %v, want 1", n)
	}
}

// A picker whose index is not up yet routes by load and session with the
// reason index_unreachable and reports not ready; once the index listens
// it becomes ready by itself and routes by prefix.
func TestIndexStartsLater(t *testing.T) {
	f := newFleet(t, "pod-a", "pod-b", "pod-c")
	addr := testutil.FreeAddr(t) // nothing listens there until the index starts below

	c, err := client.New(addr, gateway.IndexDialOption())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var logs testutil.SyncBuffer
	svc, reg := newService(t, f, gateway.Remote{Client: c}, func(c *gateway.Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	ctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	if err := svc.Warm(ctx, waitFor); err == nil {
		t.Fatal("warming an index that is not there succeeded")
	}
	if ready, why := svc.IndexReady(); ready || !strings.Contains(why, addr) {
		t.Errorf("ready %v (%q), want not ready naming %s", ready, why, addr)
	}
	xc, conn := startPicker(t, svc)
	hc := healthpb.NewHealthClient(conn)
	health := func(name string) healthpb.HealthCheckResponse_ServingStatus {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetStatus()
	}
	if st := health("readiness"); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("readiness %v while the index is down", st)
	}
	if st := health("liveness"); st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("liveness %v: the picker routes without its index", st)
	}

	turn1 := testutil.Seq(777, 8*bs)
	e := send(t, xc, "/v1/completions", nil, nil, idsBody(turn1), 100)
	if e.dest == "" || e.fallback != string(picker.FallbackIndexUnreachable) {
		t.Fatalf("destination %q, fallback %q: want routed by load, reason index_unreachable", e.dest, e.fallback)
	}
	first := f.podOf[e.dest]
	e.forward(t, "/v1/completions")
	testutil.Await(t, waitFor, "the index to hear turn 1", func() bool { return f.held(t, first, turn1) == 8 })

	// The index starts where the picker looks for it.
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("the index's port was taken meanwhile: %v", err)
	}
	gs := grpc.NewServer()
	f.srv.Register(gs)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	testutil.Await(t, 3*waitFor, "the picker to find its index", func() bool { ready, _ := svc.IndexReady(); return ready })
	testutil.Await(t, waitFor, "readiness to follow", func() bool { return health("readiness") == healthpb.HealthCheckResponse_SERVING })

	turn2 := append(append([]uint64{}, turn1...), testutil.Seq(90000, 2*bs)...)
	e = send(t, xc, "/v1/completions", nil, nil, idsBody(turn2), 100)
	if f.podOf[e.dest] != first || e.fallback != "" {
		t.Errorf("turn 2 went to %s (fallback %q); turn 1's prefix is on %s", f.podOf[e.dest], e.fallback, first)
	}
	e.forward(t, "/v1/completions")
	if n := mustVec(t, reg, "kvindex_picker_index_fallbacks_total", "index_unreachable"); n != 1 {
		t.Errorf("index_unreachable fallbacks = %v, want 1", n)
	}
	// The index goes away again: not ready, routed by load, said so.
	gs.Stop()
	testutil.Await(t, waitFor, "the picker to see its index gone", func() bool { ready, _ := svc.IndexReady(); return !ready })
	e = send(t, xc, "/v1/completions", nil, nil, idsBody(turn2), 100)
	if e.dest == "" || e.fallback != string(picker.FallbackIndexUnreachable) {
		t.Errorf("destination %q, fallback %q: want routed by load, reason index_unreachable", e.dest, e.fallback)
	}
	e.finish(t, nil)
	// Each transition is logged once: down, up, down.
	out := logs.String()
	if down, up := strings.Count(out, "the index is unreachable"), strings.Count(out, "the index answers"); down != 2 || up != 1 {
		t.Errorf("logged down %d and up %d times, want 2 and 1:\n%s", down, up, out)
	}
}

// Fallbacks are logged at WARN at most once per FallbackLogEvery for each
// reason, naming the model, with the count of those not logged.
func TestFallbackLogRateLimited(t *testing.T) {
	f := newFleet(t, "pod-a")
	var logs testutil.SyncBuffer
	var mu sync.Mutex
	now := time.Unix(1e9, 0)
	svc, _ := newService(t, f, gateway.Local{Server: f.srv}, func(c *gateway.Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		c.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	})
	hs := httptest.NewServer(svc.Handler())
	t.Cleanup(hs.Close)
	chat := `{"model":"qwen","messages":[{"role":"user","content":"hi"}]}` // no tokenizer here: fallback "tokenizer"
	for range 3 {
		if code, _, d := postPick(t, hs.URL, chat, nil); code != http.StatusOK || d.Fallback != "tokenizer" {
			t.Fatalf("status %d, fallback %q", code, d.Fallback)
		}
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 {
		t.Fatalf("%d WARN lines for 3 fallbacks within the interval, want 1:\n%s", n, logs.String())
	}
	mu.Lock()
	now = now.Add(gateway.FallbackLogEvery)
	mu.Unlock()
	postPick(t, hs.URL, chat, nil)
	out := logs.String()
	if n := strings.Count(out, "level=WARN"); n != 2 || !strings.Contains(out, "unlogged_since_last=2") || !strings.Contains(out, "model=qwen") || !strings.Contains(out, "reason=tokenizer") {
		t.Errorf("after the interval: want a second WARN naming the reason, the model and 2 unlogged:\n%s", out)
	}
}
