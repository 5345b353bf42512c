package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/internal/service"
	"github.com/kvindex/kvindex/internal/testutil"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/enginesim/simzmq"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// End-to-end NATS mode through Debian's nats-server binary: simulated
// engines publish over ZMQ, one relay forwards their batches to JetStream,
// serve --nats replicas consume them; a replica that restarts starts from
// the snapshot another one wrote and catches up on the tail.

// natsServerProc runs nats-server with JetStream on a free port and
// returns its URL.
func natsServerProc(t *testing.T) string {
	t.Helper()
	url, out := testutil.NATSServer(t, t.Skip)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("nats-server output:\n%s", out.String())
		}
	})
	return url
}

// natsKeyFile writes the key every relay and replica of the tests shares.
func natsKeyFile(t *testing.T) string {
	t.Helper()
	return writeFile(t, "nats.key", strings.Repeat("k", 32)+"\n")
}

// natsReplicaProc is one serve --nats replica started in-process.
type natsReplicaProc struct {
	svc    *service.Service
	cancel context.CancelFunc
	client *client.Client
	logs   *testutil.SyncBuffer
}

func startNATSReplica(t *testing.T, url string, extra ...string) *natsReplicaProc {
	t.Helper()
	o, f, err := parseServe(t, append([]string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--model", e2eModel,
		"--hash-algo", "sha256_cbor", "--hash-seed", "0", "--block-size", "16",
		"--nats", url, "--nats-auth-key", natsKeyFile(t)}, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	r := &natsReplicaProc{logs: &testutil.SyncBuffer{}}
	log, err := newLogger(r.logs, "debug", f.log.format)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	if r.svc, err = startService(ctx, o, log); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.stop(t)
		if t.Failed() {
			t.Logf("replica logs:\n%s", r.logs.String())
		}
	})
	dctx, dcancel := context.WithTimeout(context.Background(), e2eDeadline)
	defer dcancel()
	if r.client, err = client.Dial(dctx, r.svc.GRPCAddr()); err != nil {
		t.Fatal(err)
	}
	return r
}

// stop stops the replica (once).
func (r *natsReplicaProc) stop(t *testing.T) {
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	r.client.Close()
	if err := r.svc.Wait(); err != nil {
		t.Errorf("replica shutdown: %v", err)
	}
}

// answers returns each prompt's matched blocks per pod, as the replica
// answers them.
func (r *natsReplicaProc) answers(t *testing.T, prompts [][]uint64) []map[string]uint32 {
	t.Helper()
	out := make([]map[string]uint32, len(prompts))
	for i, p := range prompts {
		res, err := r.client.LongestPrefixTokens(context.Background(), e2eModel, p, nil)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = map[string]uint32{}
		for _, h := range res.GetPods() {
			out[i][h.GetPod()] = h.GetMatchedBlocks()
		}
	}
	return out
}

// startRelay builds and starts the relay as kvindex relay runs it; it
// stops when ctx ends (Wait reports how).
func startRelay(ctx context.Context, o *service.RelayOptions, log *slog.Logger) (*service.Relay, error) {
	r, err := service.NewRelay(o, log)
	if err != nil {
		return nil, err
	}
	return r, r.Start(ctx)
}

// parseRelay parses relay flags as the command line does.
func parseRelay(t *testing.T, args ...string) *service.RelayOptions {
	t.Helper()
	var f relayFlags
	fs := pflag.NewFlagSet("relay", pflag.ContinueOnError)
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	o, err := f.options()
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func TestNATSModeEndToEnd(t *testing.T) {
	t.Parallel() // its own service and engines on free ports
	if testing.Short() {
		t.Skip("-short: the test runs nats-server")
	}
	url := natsServerProc(t)
	pods := []string{"vllm-a", "vllm-b"}
	engines := map[string]*simzmq.Engine{}
	args := []string{"--model", e2eModel, "--nats", url, "--nats-auth-key", natsKeyFile(t), "--http-addr", "127.0.0.1:0", "--heartbeat", "100ms"}
	for _, pod := range pods {
		e, err := simzmq.New(enginesim.Config{
			Pod: pod, Model: e2eModel, Hasher: e2eHasher, CapacityBlocks: 4096,
		}, zmqtransport.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		engines[pod] = e
		args = append(args, "--engine", pod+"="+e.PubEndpoint()+",replay="+e.ReplayEndpoint())
	}
	relayLogs := &testutil.SyncBuffer{}
	rlog, err := newLogger(relayLogs, "debug", "text")
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	relay, err := startRelay(rctx, parseRelay(t, args...), rlog)
	if err != nil {
		rcancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rcancel()
		if err := relay.Wait(); err != nil {
			t.Errorf("relay stop: %v", err)
		}
		if t.Failed() {
			t.Logf("relay logs:\n%s", relayLogs.String())
		}
	})

	// No periodic snapshots within the test: the snapshots a replica
	// starts from are the ones a stopping lease holder writes.
	noPeriodic := []string{"--snapshot-interval", "1h"}
	a, b := startNATSReplica(t, url, noPeriodic...), startNATSReplica(t, url, noPeriodic...)
	await := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(e2eDeadline)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	ready := func(rs ...*natsReplicaProc) {
		t.Helper()
		for _, r := range rs {
			await("replica ready", func() bool {
				ok, err := r.client.Ready(context.Background())
				return err == nil && ok
			})
		}
	}
	ready(a, b)
	// Each engine serves its own prompts; the first ones also warm up
	// the ZMQ subscription (a SUB socket misses what precedes it).
	var prompts [][]uint64
	want := []map[string]uint32{}
	process := func(n int) {
		t.Helper()
		for i := range n {
			pod := pods[i%len(pods)]
			p := testutil.Seq(len(prompts)*1000+1, (2+i%3)*e2eBlockSize)
			if _, err := engines[pod].Process(p, nil); err != nil {
				t.Fatal(err)
			}
			prompts = append(prompts, p)
			w := map[string]uint32{}
			for _, other := range pods {
				w[other] = 0 // every engine of the model is answered for
			}
			w[pod] = uint32(len(p) / e2eBlockSize)
			want = append(want, w)
		}
	}
	agree := func(rs ...*natsReplicaProc) {
		t.Helper()
		var got []map[string]uint32
		deadline := time.Now().Add(e2eDeadline)
		await("replicas answering every prompt", func() bool {
			if time.Now().After(deadline) {
				t.Logf("answers %v, want %v", got, want)
			}
			for _, r := range rs {
				got = r.answers(t, prompts)
				for i := range want {
					if !mapsEqual(got[i], want[i]) {
						return false
					}
				}
			}
			return true
		})
	}
	indexSeq := func(r *natsReplicaProc) uint64 {
		t.Helper()
		res, err := r.client.LongestPrefixTokens(context.Background(), e2eModel, prompts[0], nil)
		if err != nil {
			t.Fatal(err)
		}
		return res.GetIndexSeq()
	}
	// holder waits until exactly one of rs holds the snapshot lease and
	// returns it and the others.
	holder := func(rs ...*natsReplicaProc) (h *natsReplicaProc, rest []*natsReplicaProc) {
		t.Helper()
		await("one lease holder", func() bool {
			h, rest = nil, nil
			n := 0
			for _, r := range rs {
				l := r.logs.String()
				if i := strings.LastIndex(l, "writer lease acquired"); i >= 0 && !strings.Contains(l[i:], "writer lease released") {
					h, n = r, n+1
				} else {
					rest = append(rest, r)
				}
			}
			return n == 1
		})
		return h, rest
	}
	// stopHolder stops the lease holder, which writes a last snapshot of
	// everything it applied, and returns the sequence it covers and the
	// replicas left.
	stopHolder := func(rs ...*natsReplicaProc) (uint64, []*natsReplicaProc) {
		t.Helper()
		h, rest := holder(rs...)
		seq := indexSeq(h)
		h.stop(t)
		if !strings.Contains(h.logs.String(), fmt.Sprintf(`msg="final snapshot written" component=nats stream_seq=%d `, seq)) {
			t.Fatalf("the stopping lease holder wrote no final snapshot at stream_seq %d:\n%s", seq, h.logs.String())
		}
		return seq, rest
	}
	restoredFrom := func(r *natsReplicaProc, seq uint64) {
		t.Helper()
		if !strings.Contains(r.logs.String(), fmt.Sprintf(`msg="snapshot restored" component=nats stream_seq=%d `, seq)) {
			t.Errorf("the new replica did not start from the snapshot at stream_seq %d:\n%s", seq, r.logs.String())
		}
	}

	process(8)
	agree(a, b)

	// The lease holder stops; the fleet moves on; a new replica starts
	// from the holder's last snapshot and reads the tail after it.
	seq, rest := stopHolder(a, b)
	live := rest[0]
	process(8)
	agree(live)
	c := startNATSReplica(t, url, noPeriodic...)
	ready(c)
	restoredFrom(c, seq)
	process(4)
	agree(live, c)
	// The replica's metrics say what it read.
	resp, err := http.Get("http://" + c.svc.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range []string{"kvindex_nats_consumer_messages_total", "kvindex_nats_index_stream_sequence", "kvindex_snapshot_restores_total"} {
		if !strings.Contains(string(body), "\n"+m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
	// Caught up with the same stream, both say so: the same index sequence.
	await("the same index sequence on both replicas", func() bool {
		s1, s2 := indexSeq(live), indexSeq(c)
		return s1 == s2 && s1 > seq
	})

	// Once more, with nothing after the snapshot: the next replica starts
	// from exactly where the stopping holder was.
	seq, rest = stopHolder(live, c)
	d := startNATSReplica(t, url, noPeriodic...)
	ready(d)
	restoredFrom(d, seq)
	agree(rest[0], d)
	// Every engine ok on both, once the new replica has heard the relay's
	// heartbeat (until then it cannot vouch that the relay is alive).
	for _, r := range []*natsReplicaProc{rest[0], d} {
		await("every engine ok", func() bool {
			listed, err := r.client.ListPods(context.Background(), "")
			if err != nil {
				t.Fatal(err)
			}
			if len(listed) != len(pods) {
				return false
			}
			for _, p := range listed {
				if !strings.HasSuffix(p.GetHealth().String(), "_OK") {
					return false
				}
			}
			return true
		})
	}
}
