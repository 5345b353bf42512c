package service

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/kvindex/kvindex/internal/kubediscovery"
	"github.com/kvindex/kvindex/internal/kubediscovery/kubetest"
	"github.com/kvindex/kvindex/internal/snapstore"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents/natstransport"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// NATS mode on an embedded nats-server with JetStream: a relay follows
// simulated engines over ZMQ and publishes to the stream; replicas
// consume it; the lease holder's final snapshot starts the next replica.

// startNATS runs an embedded NATS server with JetStream on a free port
// and returns its URL.
func startNATS(t *testing.T) string {
	t.Helper()
	s := runNATS(t, &server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true,
	})
	return fmt.Sprintf("nats://127.0.0.1:%d", s.Addr().(*net.TCPAddr).Port)
}

// runNATS starts an embedded NATS server with opts, waits until it takes
// connections and shuts it down when the test ends.
func runNATS(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// natsConn reaches url, signing with the key every relay and replica of
// the tests shares.
func natsConn(t *testing.T, url string) NATSConn {
	t.Helper()
	key := filepath.Join(t.TempDir(), "nats.key")
	if err := os.WriteFile(key, []byte(strings.Repeat("k", natstransport.MinAuthKey)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return NATSConn{URL: url, AuthKey: key}
}

// startRelay runs a relay of engines to url, stopped when the test ends.
func startRelay(t *testing.T, url string, engines []zmqtransport.EngineConfig, d *DiscoverOptions) *Relay {
	t.Helper()
	r, _ := startRelayConn(t, natsConn(t, url), engines, d)
	return r
}

// startRelayConn is startRelay through conn; it returns the relay's logs
// too.
func startRelayConn(t *testing.T, conn NATSConn, engines []zmqtransport.EngineConfig, d *DiscoverOptions) (*Relay, *testutil.SyncBuffer) {
	t.Helper()
	o := &RelayOptions{
		Engines: engines, Discover: d, Model: testModel, Conn: conn, HTTPAddr: "127.0.0.1:0",
		Stream: natstransport.StreamConfig{Name: natstransport.DefaultStream},
		Relay: natstransport.RelayConfig{Stream: natstransport.DefaultStream, Model: testModel,
			MaxBuffer: natstransport.DefaultRelayBuffer, Heartbeat: 100 * time.Millisecond},
	}
	return runRelay(t, o)
}

// runRelay runs the relay of o, stopped when the test ends; it returns
// the relay's logs too.
func runRelay(t *testing.T, o *RelayOptions) (*Relay, *testutil.SyncBuffer) {
	t.Helper()
	log, logs := testLogger(t)
	r, err := NewRelay(o, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := r.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := r.Wait(); err != nil {
			t.Errorf("relay stop: %v", err)
		}
	})
	return r, logs
}

// startReplica runs a replica of url's stream; no periodic snapshots,
// so the snapshots a replica starts from are the ones a stopping lease
// holder writes.
func startReplica(t *testing.T, url string) *started {
	t.Helper()
	return startReplicaConn(t, natsConn(t, url))
}

// startReplicaConn is startReplica through conn.
func startReplicaConn(t *testing.T, conn NATSConn) *started {
	t.Helper()
	o := baseOptions()
	o.NATS = &NATSOptions{
		Conn:     conn,
		Stream:   natstransport.StreamConfig{Name: natstransport.DefaultStream},
		Snapshot: snapstore.Config{Bucket: snapstore.DefaultBucket, Model: testModel, Keep: snapstore.DefaultKeep},
		Interval: time.Hour,
	}
	s := startService(t, o)
	await(t, "replica ready", func() bool {
		ok, err := s.client.Ready(context.Background())
		return err == nil && ok
	})
	return s
}

func TestNATSReplicasFollowTheRelay(t *testing.T) {
	url := startNATS(t)
	e, ec := newEngine(t, "vllm-a")
	startRelay(t, url, []zmqtransport.EngineConfig{ec}, nil)
	a, b := startReplica(t, url), startReplica(t, url)
	// The first prompts warm up the relay's ZMQ subscription.
	var held [][]uint64
	for i := 0; len(held) < 4; i++ {
		p := testutil.Seq(i*1000+1, 3*testBlockSize)
		if _, err := e.Process(p, nil); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			a.awaitHeld(t, "vllm-a", p) // replay fills what the subscription missed
		}
		held = append(held, p)
	}
	for _, r := range []*started{a, b} {
		for _, p := range held {
			r.awaitHeld(t, "vllm-a", p)
		}
	}

	// The lease holder stops and writes a final snapshot; a new replica
	// starts from it.
	var holder, live *started
	await(t, "one lease holder", func() bool {
		la, lb := strings.Contains(a.logs.String(), "writer lease acquired"), strings.Contains(b.logs.String(), "writer lease acquired")
		switch {
		case la && !lb:
			holder, live = a, b
		case lb && !la:
			holder, live = b, a
		}
		return la != lb
	})
	holder.stop(t)
	if !strings.Contains(holder.logs.String(), `msg="final snapshot written"`) {
		t.Fatalf("the stopping lease holder wrote no final snapshot:\n%s", holder.logs.String())
	}
	c := startReplica(t, url)
	if !strings.Contains(c.logs.String(), `msg="snapshot restored"`) {
		t.Errorf("the new replica did not start from a snapshot:\n%s", c.logs.String())
	}
	p := testutil.Seq(99_000, 2*testBlockSize)
	if _, err := e.Process(p, nil); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*started{live, c} {
		for _, q := range append(held, p) {
			r.awaitHeld(t, "vllm-a", q)
		}
	}
}

// A relay that finds its engines on Kubernetes (a fake API server here)
// follows a pod that appears, and its batches reach the replicas.
func TestNATSRelayDiscovery(t *testing.T) {
	url := startNATS(t)
	e, ec := newEngine(t, "vllm-0")
	port := func(ep string) string { return ep[strings.LastIndexByte(ep, ':')+1:] }
	d := &DiscoverOptions{Selector: "app=vllm", Namespace: "llm", Ranks: 1, Engines: true,
		Endpoint: "tcp://{ip}:" + port(ec.Endpoint), Replay: "tcp://{ip}:" + port(ec.ReplayEndpoint)}
	cluster := kubetest.NewCluster(t)
	d.Client = func() (kubediscovery.PodClient, string, error) {
		return cluster.Client(), "default", nil
	}
	startRelay(t, url, nil, d)
	r := startReplica(t, url)
	cluster.Create(t, kubetest.EnginePod("vllm-0", "127.0.0.1"))
	p := testutil.Seq(4242, 3*testBlockSize)
	if _, err := e.Process(p, nil); err != nil {
		t.Fatal(err)
	}
	r.awaitHeld(t, "vllm-0", p)
}

// NATS mode logs what happened, once: a replica is ready once caught up
// (no grace ran out, so no "engines not connected"), its own Close is no
// disconnection, and no line names its component twice. The relay's
// /readyz answers in serve's JSON.
func TestNATSLogsAndRelayReadyz(t *testing.T) {
	url := startNATS(t)
	e, ec := newEngine(t, "vllm-a")
	// Heartbeats a minute apart: a replica starting after the first one
	// has not heard that the relay follows the engine when it is ready.
	o := &RelayOptions{
		Engines: []zmqtransport.EngineConfig{ec}, Model: testModel, Conn: natsConn(t, url), HTTPAddr: "127.0.0.1:0",
		Stream: natstransport.StreamConfig{Name: natstransport.DefaultStream},
		Relay: natstransport.RelayConfig{Stream: natstransport.DefaultStream, Model: testModel,
			MaxBuffer: natstransport.DefaultRelayBuffer, Heartbeat: time.Minute},
	}
	relay, _ := runRelay(t, o)
	var ready map[string]string
	await(t, "the relay ready", func() bool {
		resp, err := http.Get("http://" + relay.HTTPAddr() + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		ready = nil
		if err := json.NewDecoder(resp.Body).Decode(&ready); err != nil {
			t.Fatalf("relay /readyz (%s) is not JSON: %v", resp.Status, err)
		}
		return resp.StatusCode == http.StatusOK
	})
	if !maps.Equal(ready, map[string]string{"status": "ready"}) {
		t.Errorf("relay /readyz: %v, want serve's {\"status\":\"ready\"}", ready)
	}

	p := testutil.Seq(1, 3*testBlockSize)
	if _, err := e.Process(p, nil); err != nil {
		t.Fatal(err)
	}
	startReplica(t, url).awaitHeld(t, "vllm-a", p) // the relay has published the prompt
	a := startReplica(t, url)
	a.stop(t)
	await(t, "the replica's NATS connection closed", func() bool { return strings.Contains(a.logs.String(), `msg="NATS connection closed"`) })
	for _, line := range strings.Split(a.logs.String(), "\n") {
		for _, bad := range []string{"engines not connected", "NATS disconnected"} {
			if strings.Contains(line, bad) {
				t.Errorf("replica logged %q", line)
			}
		}
		if strings.Count(line, " component=") > 1 {
			t.Errorf("component twice: %q", line)
		}
	}
}
