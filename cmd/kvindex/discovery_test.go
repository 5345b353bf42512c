package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kvindex/kvindex/internal/kubediscovery"
	"github.com/kvindex/kvindex/internal/kubediscovery/kubetest"
	"github.com/kvindex/kvindex/internal/service"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/enginesim/simzmq"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// portOf is the port of a tcp://HOST:PORT endpoint.
func portOf(t *testing.T, ep string) string {
	t.Helper()
	p := ep[strings.LastIndexByte(ep, ':')+1:]
	if _, err := strconv.Atoi(p); err != nil {
		t.Fatalf("endpoint %q has no port", ep)
	}
	return p
}

// serve in connect mode follows the pods discovery finds: a simulated
// engine's pod that appears on the (fake) API server is connected to, its
// events indexed; once the pod is deleted, its entries stay for the
// grace period and are dropped after it.
func TestServeDiscoveryFollowsPods(t *testing.T) {
	eng, err := simzmq.New(enginesim.Config{
		Pod: "vllm-0", Model: e2eModel, Hasher: e2eHasher, CapacityBlocks: 4096,
	}, zmqtransport.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	const grace = 30 * time.Second
	x := &e2e{t: t, engines: map[string]*simzmq.Engine{"vllm-0": eng}, logs: &testutil.SyncBuffer{}}
	o, f, err := parseServe(t, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--model", e2eModel,
		"--hash-algo", "sha256_cbor", "--hash-seed", "0", "--block-size", "16",
		"--discover-selector", "app=vllm", "--discover-namespace", "llm", "--discover-grace", grace.String(),
		"--discover-endpoint", "tcp://{ip}:"+portOf(t, eng.PubEndpoint()),
		"--discover-replay", "tcp://{ip}:"+portOf(t, eng.ReplayEndpoint()),
		"--picker", "--extproc-addr", "127.0.0.1:0", "--scrape-interval", "0", "--discover-metrics", "http://{ip}:18000/metrics")
	if err != nil {
		t.Fatal(err)
	}
	cluster := kubetest.NewCluster(t)
	clk := clocktesting.NewFakeClock(time.Now())
	o.Discover.Client = func() (kubediscovery.PodClient, string, error) {
		return cluster.Client(), "default", nil
	}
	o.Discover.Clock = clk
	x.start(o, f.log.format)

	// A pod of another app is not followed; the engine's pod is.
	other := kubetest.EnginePod("web-0", "127.0.0.1")
	other.Labels = map[string]string{"app": "web"}
	for _, p := range []*corev1.Pod{other, kubetest.EnginePod("vllm-0", "127.0.0.1")} {
		cluster.Create(t, p)
	}
	x.warmUp("vllm-0")
	prompt := testutil.Seq(7000, 4*e2eBlockSize)
	if _, err := eng.Process(prompt, nil); err != nil {
		t.Fatal(err)
	}
	x.awaitMatched(prompt, map[string]uint32{"vllm-0": 4})
	if x.pod("web-0", 0) != nil {
		t.Error("the pod outside the selector is followed")
	}
	// The picker's candidates are the Ready pods, at their metrics port
	// (set in the same report as the engines, just after them).
	x.await("the pod a candidate", func() bool { code, _ := pick(t, x, prompt); return code == http.StatusOK })
	if code, d := pick(t, x, prompt); code != http.StatusOK || d.Pod != "vllm-0" || d.Endpoint != "127.0.0.1:18000" {
		t.Errorf("/v1/pick: %d %+v, want vllm-0 at 127.0.0.1:18000", code, d)
	}

	// Deleted: kept for the grace period, then dropped with its entries.
	cluster.Delete(t, "llm", "vllm-0")
	x.await("the grace timer armed", clk.HasWaiters)
	if got := x.matched(prompt); got["vllm-0"] != 4 {
		t.Fatalf("within the grace period the index answers %v, want vllm-0's 4 blocks", got)
	}
	// A pod that went away is no candidate, grace or not.
	if code, d := pick(t, x, prompt); code != http.StatusServiceUnavailable {
		t.Errorf("/v1/pick with the pod gone: %d %+v, want 503", code, d)
	}
	clk.Step(grace)
	x.awaitMatched(prompt, map[string]uint32{})
	x.await("vllm-0 gone from the pods", func() bool { return x.pod("vllm-0", 0) == nil })
}

// The discovery flags' errors name the flag.
func TestDiscoveryFlagErrors(t *testing.T) {
	base := []string{"--model", "m", "--hash-algo", "sha256_cbor", "--hash-seed", "0"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"namespace without selector", []string{"--engine", "a=tcp://10.0.0.1:5557", "--discover-namespace", "llm"}, "--discover-namespace needs --discover-selector"},
		{"endpoint without selector", []string{"--engine", "a=tcp://10.0.0.1:5557", "--discover-endpoint", "tcp://{ip}:1"}, "need --discover-selector"},
		{"bad selector", []string{"--discover-selector", "=x"}, "--discover-selector"},
		{"no {ip}", []string{"--discover-selector", "app=vllm", "--discover-endpoint", "tcp://10.0.0.1:5557"}, "no {ip}"},
		{"no port", []string{"--discover-selector", "app=vllm", "--discover-endpoint", "tcp://{ip}"}, "--discover-endpoint"},
		{"ranks overlap replay", []string{"--discover-selector", "app=vllm", "--discover-ranks", "2", "--discover-replay", "tcp://{ip}:5558"}, "--discover-ranks 2"},
		{"ranks out of range", []string{"--discover-selector", "app=vllm", "--discover-ranks", "0"}, "--discover-ranks 0"},
		{"negative grace", []string{"--discover-selector", "app=vllm", "--discover-grace", "-1s"}, "--discover-grace"},
		{"bind mode with connect-mode flags", []string{"--discover-selector", "app=vllm", "--listen", "tcp://*:5557", "--discover-ranks", "2", "--discover-replay", "tcp://{ip}:5567"}, "apply to connect mode"},
		{"bind mode over ipc", []string{"--discover-selector", "app=vllm", "--listen", "ipc:///tmp/kv"}, "needs a tcp --listen"},
		{"bad metrics URL", []string{"--discover-selector", "app=vllm", "--discover-metrics", "ftp://{ip}/metrics"}, "--discover-metrics"},
		{"picker endpoints and discovery", []string{"--discover-selector", "app=vllm", "--picker", "--endpoint", "a=10.0.0.1:8000"}, "--endpoint and --discover-selector"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := parseServe(t, append(base, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one with %q", err, tc.want)
			}
		})
	}
	t.Run("no model", func(t *testing.T) {
		_, _, err := parseServe(t, "--hash-algo", "sha256_cbor", "--hash-seed", "0", "--discover-selector", "app=vllm")
		if err == nil || !strings.Contains(err.Error(), "needs --model") {
			t.Errorf("error %v, want one saying discovery needs --model", err)
		}
	})
	t.Run("valid", func(t *testing.T) {
		o, _, err := parseServe(t, append(base, "--discover-selector", "app=vllm", "--engine", "static=tcp://10.0.0.9:5557", "--picker")...)
		if err != nil {
			t.Fatal(err)
		}
		if o.Discover == nil || o.Picker == nil || !o.Picker.Gateway.Dynamic {
			t.Fatalf("discovery %+v, picker %+v: want both, the picker's endpoints dynamic", o.Discover, o.Picker)
		}
	})
}

// serve in bind mode admits the engines discovery finds: a simulated
// engine connected before its pod is known is refused until the pod is
// found, then its events are indexed; after the pod
// is deleted and its grace has passed, its messages are refused and its
// entries dropped.
func TestServeDiscoveryBindModeAllows(t *testing.T) {
	const grace = 30 * time.Second
	x := &e2e{t: t, engines: map[string]*simzmq.Engine{}, logs: &testutil.SyncBuffer{}}
	o, f, err := parseServe(t, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--model", e2eModel,
		"--hash-algo", "sha256_cbor", "--hash-seed", "0", "--block-size", "16",
		"--listen", "tcp://127.0.0.1:*", "--discover-selector", "app=vllm", "--discover-namespace", "llm", "--discover-grace", grace.String())
	if err != nil {
		t.Fatal(err)
	}
	cluster := kubetest.NewCluster(t)
	clk := clocktesting.NewFakeClock(time.Now())
	o.Discover.Client = func() (kubediscovery.PodClient, string, error) {
		return cluster.Client(), "default", nil
	}
	o.Discover.Clock = clk
	x.start(o, f.log.format)

	// The engine connects before its pod is known, as every engine does
	// when kvindex restarts: its batches are refused until discovery
	// admits the pod, then taken on the same connection.
	eng, err := simzmq.New(enginesim.Config{
		Pod: "vllm-0", Model: e2eModel, Hasher: e2eHasher, CapacityBlocks: 4096,
	}, zmqtransport.PublisherConfig{Connect: true, Endpoint: x.svc.Subscriber().ListenEndpoint(), Topic: "kv@vllm-0@" + e2eModel})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	x.engines["vllm-0"] = eng
	refused := func() uint64 { ls, _ := x.svc.Subscriber().ListenerStats(); return ls.RefusedSources }
	x.await("the unknown engine's batches refused", func() bool {
		if _, err := eng.Process(testutil.Seq(100_000+int(x.salt)*100, e2eBlockSize), nil); err != nil {
			t.Fatal(err)
		}
		x.salt++
		return refused() > 0
	})
	if x.pod("vllm-0", 0) != nil {
		t.Fatal("the engine is followed before its pod is known")
	}
	cluster.Create(t, kubetest.EnginePod("vllm-0", "127.0.0.1"))
	x.warmUp("vllm-0")
	prompt := testutil.Seq(8000, 3*e2eBlockSize)
	if _, err := eng.Process(prompt, nil); err != nil {
		t.Fatal(err)
	}
	x.awaitMatched(prompt, map[string]uint32{"vllm-0": 3})

	cluster.Delete(t, "llm", "vllm-0")
	x.await("the grace timer armed", clk.HasWaiters)
	clk.Step(grace)
	x.awaitMatched(prompt, map[string]uint32{})
	before := refused()
	x.await("the engine's messages refused", func() bool {
		if _, err := eng.Process(testutil.Seq(9000+int(x.salt), e2eBlockSize), nil); err != nil {
			t.Fatal(err)
		}
		x.salt++
		return refused() > before
	})
	if got := x.matched(prompt); len(got) != 0 {
		t.Errorf("after the pod was dropped the index answers %v", got)
	}
}

// pick asks serve's /v1/pick for a token prompt.
func pick(t *testing.T, x *e2e, prompt []uint64) (int, struct{ Endpoint, Pod string }) {
	t.Helper()
	var d struct{ Endpoint, Pod string }
	body := fmt.Sprintf(`{"model":%q,"prompt":[%s]}`, e2eModel, idsArg(prompt))
	resp, err := http.Post("http://"+x.svc.HTTPAddr()+"/v1/pick", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(raw, &d); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode, d
}

// kvindex picker takes the discovery flags that concern it: candidates
// come from the pods' metrics URLs, not from event endpoints, and
// --endpoint and discovery exclude each other.
func TestPickerDiscoveryFlags(t *testing.T) {
	cmd := newPickerCmd()
	for name, want := range map[string]bool{"discover-selector": true, "discover-namespace": true, "discover-grace": true,
		"discover-metrics": true, "discover-endpoint": false, "discover-replay": false, "discover-ranks": false} {
		if got := cmd.Flags().Lookup(name) != nil; got != want {
			t.Errorf("kvindex picker --%s registered: %v, want %v", name, got, want)
		}
	}
	f := pickFlags{service.PickerSettings{Endpoints: []string{"a=10.0.0.1:8000"}, ExtProcAddr: ":9002"}}
	var o service.PickerOptions
	if err := f.Options(true, &o); err == nil || !strings.Contains(configUsage(err, serveFlagNames).Error(), "--endpoint and --discover-selector") {
		t.Errorf("--endpoint with discovery: %v", err)
	}
	f.Endpoints = nil
	if err := f.Options(true, &o); err != nil || !o.Gateway.Dynamic || len(o.Gateway.Endpoints) != 0 {
		t.Errorf("discovery: %+v, %v; want dynamic endpoints, none yet", o.Gateway, err)
	}
}
