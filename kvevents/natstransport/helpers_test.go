package natstransport_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/natstransport"
)

const testModel = "Llama-3.1-8B/Instruct"

// natsServer is an embedded NATS server with JetStream that a test can
// stop and start again on the same port and store.
type natsServer struct {
	t    testing.TB
	dir  string
	port int
	s    *server.Server
}

func startNATS(t testing.TB) *natsServer {
	t.Helper()
	ns := &natsServer{t: t, dir: t.TempDir(), port: -1}
	ns.start()
	t.Cleanup(ns.stop)
	return ns
}

func (ns *natsServer) start() {
	ns.t.Helper()
	s, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: ns.port, JetStream: true, StoreDir: ns.dir, NoSigs: true, NoLog: true,
	})
	if err != nil {
		ns.t.Fatal(err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		ns.t.Fatal("nats server not ready")
	}
	ns.s = s
	ns.port = s.Addr().(*net.TCPAddr).Port
}

func (ns *natsServer) stop() {
	if ns.s != nil {
		ns.s.Shutdown()
		ns.s.WaitForShutdown()
		ns.s = nil
	}
}

func (ns *natsServer) restart() {
	ns.stop()
	ns.start()
}

func (ns *natsServer) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", ns.port) }

// connect opens a connection that reconnects forever.
func connect(t testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
		nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

func ensureStream(t testing.TB, js jetstream.JetStream) jetstream.Stream {
	t.Helper()
	s, err := natstransport.EnsureStream(context.Background(), js, natstransport.StreamConfig{MaxBytes: 1 << 30}, quiet())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// countingHandler counts the records at Warn or above, for tests that
// check a problem was logged.
type countingHandler struct {
	slog.Handler
	warns *atomic.Int64
}

func newCountingLogger() (*slog.Logger, *atomic.Int64) {
	n := new(atomic.Int64)
	return slog.New(countingHandler{slog.NewTextHandler(io.Discard, nil), n}), n
}

func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		h.warns.Add(1)
	}
	return h.Handler.Handle(ctx, r)
}

func (h countingHandler) WithAttrs(a []slog.Attr) slog.Handler {
	return countingHandler{h.Handler.WithAttrs(a), h.warns}
}

func (h countingHandler) WithGroup(g string) slog.Handler {
	return countingHandler{h.Handler.WithGroup(g), h.warns}
}

// awaitBound bounds every wait for a condition: a generous deadline (a
// hang, not a slow machine, is what it catches).
const awaitBound = 30 * time.Second

func awaitChan(t testing.TB, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(awaitBound):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// batch is one engine batch as the ZMQ side hands it to a relay.
type batch struct {
	engine  kvevents.EngineID
	seq     uint64
	payload []byte
}

type collector struct {
	mu  sync.Mutex
	id  kvevents.EngineID
	out *[]batch
}

func (c *collector) Publish(seq uint64, payload []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	*c.out = append(*c.out, batch{c.id, seq, payload})
	return nil
}

// fleet is a set of simulated engines whose batches a test collects in
// the order they were made.
type fleet struct {
	engines []*enginesim.Engine
	batches []batch
	rng     *rand.Rand
	docs    [][]uint64
}

func newFleet(t testing.TB, pods, ranks int) *fleet {
	t.Helper()
	f := &fleet{rng: rand.New(rand.NewPCG(1, 2))}
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 16})
	for p := range pods {
		for r := range ranks {
			id := kvevents.EngineID{Model: testModel, Pod: fmt.Sprintf("vllm-%d.pod", p), DPRank: r}
			e, err := enginesim.New(enginesim.Config{
				Pod: id.Pod, Model: id.Model, DPRank: r, Hasher: h, CapacityBlocks: 96,
				Publisher: &collector{id: id, out: &f.batches}, BufferSteps: 16,
			})
			if err != nil {
				t.Fatal(err)
			}
			f.engines = append(f.engines, e)
		}
	}
	for i := range 12 {
		doc := make([]uint64, 64+16*i%64)
		for j := range doc {
			doc[j] = uint64(1000*i + j)
		}
		f.docs = append(f.docs, doc)
	}
	return f
}

// run makes n requests on random engines (shared system prompts, random
// tails: hits, misses and evictions) and returns the batches they made.
func (f *fleet) run(t testing.TB, n int) []batch {
	t.Helper()
	start := len(f.batches)
	for range n {
		e := f.engines[f.rng.IntN(len(f.engines))]
		doc := f.docs[f.rng.IntN(len(f.docs))]
		prompt := append([]uint64(nil), doc...)
		for range 16 + f.rng.IntN(64) {
			prompt = append(prompt, uint64(f.rng.IntN(50000)))
		}
		if _, err := e.Process(prompt, nil); err != nil {
			t.Fatal(err)
		}
	}
	return f.batches[start:]
}

func feed(r *natstransport.Relay, bs []batch) {
	for _, b := range bs {
		r.ApplyPayload(b.engine, b.seq, b.payload, nil)
	}
}

func newIndex(t testing.TB) *indexer.Index {
	t.Helper()
	ix, err := indexer.New(indexer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return ix
}

// directIndex applies batches straight to an index: what every replica
// must end up with.
func directIndex(t testing.TB, bs []batch) *indexer.Index {
	t.Helper()
	ix := newIndex(t)
	var dec kvevents.Decoder
	var b kvevents.Batch
	for _, x := range bs {
		if err := dec.Decode(x.payload, &b); err != nil {
			t.Fatal(err)
		}
		ix.Apply(x.engine, x.seq, b.Events)
	}
	return ix
}

// replica is a consumer and its index.
type replica struct {
	c  *natstransport.Consumer
	ix *indexer.Index
}

func startReplica(t testing.TB, js jetstream.JetStream, cfg natstransport.ConsumerConfig, ix *indexer.Index) *replica {
	t.Helper()
	if ix == nil {
		ix = newIndex(t)
	}
	cfg.Model = testModel
	if cfg.RelayTimeout == 0 {
		cfg.RelayTimeout = time.Hour // only the cut-off test watches heartbeats
	}
	c, err := natstransport.NewConsumer(js, cfg, ix, quiet())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &replica{c, ix}
}

// digest is the replica's index digest, taken with ingest parked.
func (r *replica) digest(t testing.TB) (d [32]byte) {
	t.Helper()
	if err := r.c.Checkpoint(func(uint64, []kvevents.Position) error { d = r.ix.Digest(); return nil }); err != nil {
		t.Fatal(err)
	}
	return d
}

func lastSeq(t testing.TB, s jetstream.Stream) uint64 {
	t.Helper()
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

func msgCount(t testing.TB, s jetstream.Stream) uint64 {
	t.Helper()
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func startRelay(t testing.TB, js jetstream.JetStream, cfg natstransport.RelayConfig) *natstransport.Relay {
	t.Helper()
	cfg.Model = testModel
	r, err := natstransport.NewRelay(js, cfg, quiet())
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// awaitPublished waits until the relay has every record it was given
// acknowledged.
func awaitPublished(t testing.TB, r *natstransport.Relay, records uint64) {
	t.Helper()
	testutil.Await(t, awaitBound, "relay acks", func() bool { return r.Stats().Published >= records && r.Stats().BufferedRecords == 0 })
}
