package simzmq_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/testutil/zmqtest"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/enginesim/simzmq"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// recvTimeout bounds every receive, so a missing message fails the test
// instead of hanging it.
const recvTimeout = zmqtest.RecvTimeout

func hasher(t testing.TB, bs int) *blockhash.Hasher {
	t.Helper()
	h, err := blockhash.New(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: bs})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// newEngine starts a simulated engine publishing over ZMQ, with the test
// defaults for what cfg leaves zero.
func newEngine(t testing.TB, cfg enginesim.Config, pcfg zmqtransport.PublisherConfig) *simzmq.Engine {
	t.Helper()
	if cfg.Hasher == nil {
		cfg.Hasher = hasher(t, 4)
	}
	if cfg.CapacityBlocks == 0 {
		cfg.CapacityBlocks = 64
	}
	e, err := simzmq.New(cfg, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// msg is one received live message.
type msg struct {
	topic string
	seq   uint64
	batch kvevents.Batch
	raw   []byte
}

// subscriber is a real SUB socket on its own context, as a consumer
// process would have.
type subscriber struct {
	t    testing.TB
	ctx  *zmq.Context
	sock *zmq.Socket
}

func subscribe(t testing.TB, e *simzmq.Engine, topic string) *subscriber {
	t.Helper()
	ctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	s, err := ctx.NewSocket(zmq.SUB)
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{s.SetLinger(0), s.SetRcvtimeo(recvTimeout), s.SetSubscribe(topic), s.Connect(e.PubEndpoint())} {
		if err != nil {
			t.Fatal(err)
		}
	}
	sub := &subscriber{t: t, ctx: ctx, sock: s}
	t.Cleanup(func() { s.Close(); ctx.Term() })
	sub.sync(e)
	return sub
}

// sync waits until the subscription is live. A PUB socket drops messages
// for a subscriber whose subscription has not reached it yet (the slow
// joiner), so it publishes AllBlocksCleared probes (harmless: the cache
// is still empty) until one arrives, then consumes the probes up to the
// last one sent. The engine's next batch is then the next message.
func (s *subscriber) sync(e *simzmq.Engine) {
	s.t.Helper()
	poller := zmq.NewPoller()
	poller.Add(s.sock, zmq.POLLIN)
	deadline := time.Now().Add(recvTimeout)
	for {
		if err := e.Clear(); err != nil {
			s.t.Fatal(err)
		}
		polled, err := poller.Poll(20 * time.Millisecond)
		if err != nil {
			s.t.Fatal(err)
		}
		if len(polled) > 0 {
			break
		}
		if time.Now().After(deadline) {
			s.t.Fatal("subscription never became live")
		}
	}
	last := e.Seq() - 1
	for {
		m := s.recv()
		if m.batch.Events[0].Kind != kvevents.AllBlocksCleared {
			s.t.Fatalf("probe %d is %v", m.seq, m.batch.Events[0].Kind)
		}
		if m.seq == last {
			return
		}
	}
}

func (s *subscriber) recv() msg {
	s.t.Helper()
	frames, err := s.sock.RecvMessageBytes(0)
	if err != nil {
		s.t.Fatalf("receive: %v", err)
	}
	if len(frames) != 3 || len(frames[1]) != 8 {
		s.t.Fatalf("message of %d frames: %x", len(frames), frames)
	}
	m := msg{topic: string(frames[0]), seq: binary.BigEndian.Uint64(frames[1]), raw: frames[2]}
	if err := (&kvevents.Decoder{}).Decode(frames[2], &m.batch); err != nil {
		s.t.Fatalf("seq %d: %v", m.seq, err)
	}
	return m
}

// expect receives the next message and checks its sequence number.
func (s *subscriber) expect(seq uint64) msg {
	s.t.Helper()
	m := s.recv()
	if m.seq != seq {
		s.t.Fatalf("received seq %d, want %d", m.seq, seq)
	}
	return m
}

func keys(hs []blockhash.Hash) []uint64 {
	var out []uint64
	for _, h := range hs {
		out = append(out, h.Key)
	}
	return out
}

func chain(t testing.TB, h *blockhash.Hasher, toks []uint64, x *blockhash.Extras) []blockhash.Hash {
	t.Helper()
	hs, err := h.Chain(nil, nil, 0, toks, x)
	if err != nil {
		t.Fatal(err)
	}
	return hs
}

func process(t testing.TB, e *simzmq.Engine, toks []uint64, x *blockhash.Extras, wantCached int) {
	t.Helper()
	got, err := e.Process(toks, x)
	if err != nil {
		t.Fatal(err)
	}
	if got != wantCached {
		t.Fatalf("Process cached %d tokens, want %d", got, wantCached)
	}
}

// TestPublishesGoldenEvents checks the events of a first request and of a
// follow-up that extends it against the golden block hashes (sha256_cbor,
// seed "0", tokens 0..47: spec §4) and vLLM's event semantics.
func TestPublishesGoldenEvents(t *testing.T) {
	e := newEngine(t, enginesim.Config{Hasher: hasher(t, 16), DPRank: 2}, zmqtransport.PublisherConfig{Topic: "kv@10.0.0.1@m"})
	sub := subscribe(t, e, "kv@10.0.0.1@m")
	seq := e.Seq()

	process(t, e, testutil.Seq(0, 50), nil, 0) // 3 full blocks; 2 tokens never hashed
	m := sub.expect(seq)
	if m.topic != "kv@10.0.0.1@m" || !m.batch.HasDPRank || m.batch.DPRank != 2 || len(m.batch.Events) != 1 {
		t.Fatalf("message %+v", m)
	}
	ev := m.batch.Events[0]
	golden := []uint64{12687895063098490012, 1814341696565857452, 2713165534665270607}
	if ev.Kind != kvevents.BlockStored || !slices.Equal(ev.Hashes, golden) || ev.HasParent ||
		!slices.Equal(ev.TokenIDs, testutil.Seq(0, 48)) || ev.BlockSize != 16 || ev.Medium != "GPU" ||
		ev.SpecKind != "full_attention" || len(ev.ExtraKeys) != 3 || ev.ExtraKeys[0] != nil || ev.ExtraKeys[2] != nil {
		t.Fatalf("BlockStored %+v", ev)
	}
	if ts := time.Unix(0, int64(m.batch.TS*1e9)); time.Since(ts) > time.Minute || time.Until(ts) > time.Minute {
		t.Errorf("batch time %v is not now", ts)
	}

	// The same prompt extended by one block: a 48-token hit, one new block
	// whose parent is block 2.
	process(t, e, testutil.Seq(0, 64), nil, 48)
	ev = sub.expect(seq + 1).batch.Events[0]
	want := keys(chain(t, e.Config().Hasher, testutil.Seq(0, 64), nil))
	if !slices.Equal(ev.Hashes, want[3:]) || !ev.HasParent || ev.Parent != golden[2] || !slices.Equal(ev.TokenIDs, testutil.Seq(48, 16)) {
		t.Fatalf("follow-up BlockStored %+v", ev)
	}

	// A full hit stores nothing and publishes nothing: the next message is
	// the next request's, one seq later.
	process(t, e, testutil.Seq(0, 64), nil, 64)
	if e.Seq() != seq+2 {
		t.Fatalf("Seq = %d after a full hit, want %d", e.Seq(), seq+2)
	}
	process(t, e, testutil.Seq(1000, 16), nil, 0)
	if ev := sub.expect(seq + 2).batch.Events[0]; ev.TokenIDs[0] != 1000 {
		t.Fatalf("unexpected event %+v", ev)
	}
	if e.Hits() != 48+64 || e.Queries() != 50+64+64+16 {
		t.Errorf("Hits/Queries = %d/%d", e.Hits(), e.Queries())
	}
	if n, err := e.Lookup(testutil.Seq(0, 80), nil); err != nil || n != 4 {
		t.Errorf("Lookup = %d, %v; want 4 blocks", n, err)
	}
}

// TestEvictionOrder follows vLLM's block pool through evictions: a
// request's blocks are freed tail first, hits refresh recency, each
// eviction is one BlockRemoved, and the stored event follows them.
func TestEvictionOrder(t *testing.T) {
	h := hasher(t, 4)
	e := newEngine(t, enginesim.Config{Hasher: h, CapacityBlocks: 4}, zmqtransport.PublisherConfig{})
	sub := subscribe(t, e, "")
	seq := e.Seq()
	a, b := testutil.Seq(0, 12), testutil.Seq(100, 12)
	ka, kb := keys(chain(t, h, a, nil)), keys(chain(t, h, b, nil))

	process(t, e, a, nil, 0)
	sub.expect(seq)
	// B needs 3 blocks: 1 free, then A's tail a2 and a1 are evicted.
	process(t, e, b, nil, 0)
	got := sub.expect(seq + 1).batch.Events
	if len(got) != 3 || got[0].Kind != kvevents.BlockRemoved || !slices.Equal(got[0].Hashes, ka[2:3]) ||
		got[1].Kind != kvevents.BlockRemoved || !slices.Equal(got[1].Hashes, ka[1:2]) || got[0].Medium != "GPU" ||
		got[2].Kind != kvevents.BlockStored || !slices.Equal(got[2].Hashes, kb) {
		t.Fatalf("events %+v", got)
	}
	if n, _ := e.Lookup(a, nil); n != 1 {
		t.Fatalf("A has %d cached blocks, want 1", n)
	}
	if e.CachedBlocks() != 4 {
		t.Fatalf("CachedBlocks = %d", e.CachedBlocks())
	}
	// A again: a0 hits (and is pinned), B's tail b2, b1 make room.
	process(t, e, a, nil, 4)
	got = sub.expect(seq + 2).batch.Events
	if len(got) != 3 || !slices.Equal(got[0].Hashes, kb[2:3]) || !slices.Equal(got[1].Hashes, kb[1:2]) ||
		!slices.Equal(got[2].Hashes, ka[1:]) || !got[2].HasParent || got[2].Parent != ka[0] ||
		!slices.Equal(got[2].TokenIDs, a[4:]) {
		t.Fatalf("events %+v", got)
	}
	if n, _ := e.Lookup(b, nil); n != 1 {
		t.Fatalf("B has %d cached blocks, want 1", n)
	}
}

// TestCapacityOverflow: a request larger than the pool caches only the
// leading blocks that fit.
func TestCapacityOverflow(t *testing.T) {
	h := hasher(t, 4)
	e := newEngine(t, enginesim.Config{Hasher: h, CapacityBlocks: 2}, zmqtransport.PublisherConfig{})
	sub := subscribe(t, e, "")
	seq := e.Seq()
	process(t, e, testutil.Seq(0, 20), nil, 0)
	ev := sub.expect(seq).batch.Events[0]
	if !slices.Equal(ev.Hashes, keys(chain(t, h, testutil.Seq(0, 8), nil))) || !slices.Equal(ev.TokenIDs, testutil.Seq(0, 8)) {
		t.Fatalf("stored %+v", ev)
	}
	if n, _ := e.Lookup(testutil.Seq(0, 20), nil); n != 2 {
		t.Fatalf("Lookup = %d", n)
	}
	// The two cached blocks hit and are pinned: nothing else fits.
	process(t, e, testutil.Seq(0, 20), nil, 8)
	if e.Seq() != seq+1 {
		t.Fatalf("a request that can cache nothing new published a batch")
	}
}

func TestClear(t *testing.T) {
	e := newEngine(t, enginesim.Config{}, zmqtransport.PublisherConfig{})
	sub := subscribe(t, e, "")
	seq := e.Seq()
	process(t, e, testutil.Seq(0, 16), nil, 0)
	sub.expect(seq)
	if err := e.Clear(); err != nil {
		t.Fatal(err)
	}
	m := sub.expect(seq + 1)
	if len(m.batch.Events) != 1 || m.batch.Events[0].Kind != kvevents.AllBlocksCleared {
		t.Fatalf("events %+v", m.batch.Events)
	}
	if e.CachedBlocks() != 0 {
		t.Fatalf("CachedBlocks = %d after Clear", e.CachedBlocks())
	}
	process(t, e, testutil.Seq(0, 16), nil, 0)
}

// TestRestart: a new process starts at seq 0 with an empty cache,
// announces nothing, and binds the same endpoints anew: its subscribers
// reconnect.
func TestRestart(t *testing.T) {
	e := newEngine(t, enginesim.Config{}, zmqtransport.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"})
	pubEP, replayEP := e.PubEndpoint(), e.ReplayEndpoint()
	sub := subscribe(t, e, "")
	seq := e.Seq()
	process(t, e, testutil.Seq(0, 16), nil, 0)
	sub.expect(seq)
	if err := e.Restart(); err != nil {
		t.Fatal(err)
	}
	if e.Seq() != 0 || e.CachedBlocks() != 0 {
		t.Fatalf("after Restart: Seq %d, CachedBlocks %d", e.Seq(), e.CachedBlocks())
	}
	if e.PubEndpoint() != pubEP || e.ReplayEndpoint() != replayEP {
		t.Fatalf("after Restart: endpoints %s %s, want %s %s", e.PubEndpoint(), e.ReplayEndpoint(), pubEP, replayEP)
	}
	process(t, e, testutil.Seq(0, 16), nil, 0) // a miss again
	// The replay buffer starts over too.
	got := replay(t, e, 0, false)
	if len(got) != 1 || got[0].Seq != 0 {
		t.Fatalf("replay after restart: %d batches", len(got))
	}
	// The old connection is gone; the subscriber reconnects to the new
	// process and hears it.
	sub.sync(e)
	seq = e.Seq()
	process(t, e, testutil.Seq(0, 16), nil, 0) // sync's probes emptied the cache
	if m := sub.expect(seq); m.batch.Events[0].Kind != kvevents.BlockStored {
		t.Fatalf("first message after restart is %v", m.batch.Events[0].Kind)
	}
}

// replay asks the engine's ROUTER for every batch from start with a
// DEALER, as a consumer does, and checks the reply layout.
func replay(t testing.TB, e *simzmq.Engine, start uint64, withTopic bool) []zmqtest.Replayed {
	t.Helper()
	d := zmqtest.Dealer(t, e.ReplayEndpoint())
	zmqtest.Request(t, d, start)
	return zmqtest.ReadReplay(t, d, e.Publisher().Topic(), withTopic)
}

// TestDropNextAndReplay loses batches on the live stream and recovers
// them over replay, in both reply layouts.
func TestDropNextAndReplay(t *testing.T) {
	for _, withTopic := range []bool{false, true} {
		t.Run(fmt.Sprintf("topic=%v", withTopic), func(t *testing.T) {
			e := newEngine(t, enginesim.Config{}, zmqtransport.PublisherConfig{Topic: "kv-events", ReplayEndpoint: "tcp://127.0.0.1:*", ReplayWithTopic: withTopic})
			sub := subscribe(t, e, "kv-events")
			seq := e.Seq()
			e.DropNext(2)
			for i := 0; i < 3; i++ {
				process(t, e, testutil.Seq(100*i, 8), nil, 0)
			}
			live := sub.recv()
			if live.seq != seq+2 {
				t.Fatalf("first live message has seq %d, want %d (two dropped)", live.seq, seq+2)
			}
			got := replay(t, e, seq, withTopic)
			if len(got) != 3 {
				t.Fatalf("replayed %d batches, want 3", len(got))
			}
			for i, r := range got {
				if r.Seq != seq+uint64(i) {
					t.Fatalf("replayed seq %d at %d", r.Seq, i)
				}
				var b kvevents.Batch
				if err := (&kvevents.Decoder{}).Decode(r.Payload, &b); err != nil {
					t.Fatal(err)
				}
				if b.Events[0].Kind != kvevents.BlockStored || b.Events[0].TokenIDs[0] != uint64(100*i) {
					t.Fatalf("replayed batch %d: %+v", i, b.Events[0])
				}
			}
			if string(got[2].Payload) != string(live.raw) {
				t.Fatal("the replayed copy of a live batch differs from it")
			}
			// Nothing at or after a future seq: just the end marker.
			if got := replay(t, e, seq+3, withTopic); len(got) != 0 {
				t.Fatalf("replay from the next seq returned %d batches", len(got))
			}
		})
	}
}

// TestReplayRequests: malformed requests are ignored, as vLLM ignores
// them; start_seq is read as a big-endian int of any length; the buffer
// keeps only the last BufferSteps batches.
func TestReplayRequests(t *testing.T) {
	e := newEngine(t, enginesim.Config{BufferSteps: 3}, zmqtransport.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"})
	for i := 0; i < 5; i++ {
		process(t, e, testutil.Seq(100*i, 4), nil, 0)
	}
	d := zmqtest.Dealer(t, e.ReplayEndpoint())
	// Two malformed requests (ROUTER sees 2 and 4 frames), then a valid one
	// with a 1-byte start: the only reply is the valid one's.
	for _, req := range [][]any{{""}, {"", []byte{0}, []byte{1}}, {"", []byte{3}}} {
		if _, err := d.SendMessage(req...); err != nil {
			t.Fatal(err)
		}
	}
	got := zmqtest.ReadReplay(t, d, "", false)
	if len(got) != 2 || got[0].Seq != 3 || got[1].Seq != 4 {
		t.Fatalf("replay from 3: %v", got)
	}
	// From 0: the oldest buffered batch is 2, so a consumer sees the gap.
	if got := replay(t, e, 0, false); len(got) != 3 || got[0].Seq != 2 {
		t.Fatalf("replay from 0 returned %d batches starting at %d", len(got), got[0].Seq)
	}
}

// TestShapes publishes in every wire shape and hash form and checks what
// a consumer decodes.
func TestShapes(t *testing.T) {
	h := hasher(t, 4)
	toks := testutil.Seq(0, 8)
	hs := chain(t, h, toks, nil)
	for _, tc := range []struct {
		shape       kvevents.Shape
		bytesHashes bool
	}{
		{kvevents.ShapeV090, false},
		{kvevents.ShapeArray, false},
		{kvevents.ShapeMap, false},
		{kvevents.ShapeMap, true},
		{kvevents.ShapeArray, true},
	} {
		t.Run(fmt.Sprintf("%v_bytes=%v", tc.shape, tc.bytesHashes), func(t *testing.T) {
			e := newEngine(t, enginesim.Config{Hasher: h, CapacityBlocks: 2, Shape: tc.shape, BytesHashes: tc.bytesHashes, Medium: "CPU"}, zmqtransport.PublisherConfig{})
			sub := subscribe(t, e, "")
			seq := e.Seq()
			process(t, e, toks, nil, 0)
			process(t, e, testutil.Seq(50, 4), nil, 0) // evicts one block
			st := sub.expect(seq).batch.Events[0]
			m := sub.expect(seq + 1)
			rm := m.batch.Events[0]
			if !slices.Equal(st.Hashes, keys(hs)) || rm.Kind != kvevents.BlockRemoved || !slices.Equal(rm.Hashes, keys(hs)[1:]) {
				t.Fatalf("stored %v, removed %v", st.Hashes, rm.Hashes)
			}
			if tc.bytesHashes {
				if len(st.Digests) != 2 || string(st.Digests[1]) != string(hs[1].Digest()) || string(rm.Digests[0]) != string(hs[1].Digest()) {
					t.Fatalf("digests %x / %x", st.Digests, rm.Digests)
				}
			} else if st.Digests != nil {
				t.Fatal("int hashes carried digests")
			}
			if tc.shape == kvevents.ShapeV090 {
				if m.batch.HasDPRank || st.Medium != "" || st.ExtraKeys != nil {
					t.Fatalf("v0.9.0 payload carries later fields: %+v", m.batch)
				}
			} else if st.Medium != "CPU" || rm.Medium != "CPU" || len(st.ExtraKeys) != 2 {
				t.Fatalf("stored %+v", st)
			}
		})
	}
}

// TestExtraKeysVerify: with LoRA and a cache salt, the event's extra keys
// let a consumer recompute its hashes (spec §3.7), and they match the
// golden range48_lora_salt vector.
func TestExtraKeysVerify(t *testing.T) {
	h := hasher(t, 16)
	e := newEngine(t, enginesim.Config{Hasher: h}, zmqtransport.PublisherConfig{})
	sub := subscribe(t, e, "")
	seq := e.Seq()
	x := &blockhash.Extras{LoRAName: "sql-lora", CacheSalt: "tenant-a"}
	process(t, e, testutil.Seq(0, 48), x, 0)
	ev := sub.expect(seq).batch.Events[0]
	golden := []uint64{14692344355639159905, 3148631331017690090, 6923214878449139564}
	if !slices.Equal(ev.Hashes, golden) || ev.LoRAName != "sql-lora" {
		t.Fatalf("hashes %v lora %q", ev.Hashes, ev.LoRAName)
	}
	wantKeys := []string{`("sql-lora", "tenant-a")`, `("sql-lora",)`, `("sql-lora",)`}
	for i, k := range ev.ExtraKeys {
		if k.String() != wantKeys[i] {
			t.Errorf("extra keys of block %d = %v, want %s", i, k, wantKeys[i])
		}
	}
	again, err := h.ChainKeys(nil, nil, ev.TokenIDs, ev.ExtraKeys)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(keys(again), ev.Hashes) {
		t.Fatalf("recomputed %v, event says %v", keys(again), ev.Hashes)
	}
	// Without the extras it is another prefix altogether.
	if n, _ := e.Lookup(testutil.Seq(0, 48), nil); n != 0 {
		t.Fatalf("Lookup without extras = %d", n)
	}
	if n, _ := e.Lookup(testutil.Seq(0, 48), x); n != 3 {
		t.Fatalf("Lookup with extras = %d", n)
	}
}

// TestStreamMirrorsCache drives concurrent requests with shared prefixes
// through a small pool and replays every published event into a
// reference-counted model of the cache, as an index would. At the end the
// model must agree with the engine about every prompt's cached prefix:
// the event stream is a faithful account of the cache.
func TestStreamMirrorsCache(t *testing.T) {
	h := hasher(t, 4)
	e := newEngine(t, enginesim.Config{Hasher: h, CapacityBlocks: 40, BufferSteps: 100000}, zmqtransport.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"})
	var prompts [][]uint64
	rng := rand.New(rand.NewPCG(7, 8))
	for i := 0; i < 30; i++ {
		p := testutil.Seq(1000*(i%6), 4*(1+rng.IntN(6))) // 6 families of shared prefixes
		p = append(p, testutil.Seq(50000+i, rng.IntN(12))...)
		prompts = append(prompts, p)
	}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			for i := 0; i < 200; i++ {
				if _, err := e.Process(prompts[rng.IntN(len(prompts))], nil); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()

	held := map[uint64]int{}
	batches := replay(t, e, 0, false)
	if uint64(len(batches)) != e.Seq() {
		t.Fatalf("replayed %d batches, engine published %d", len(batches), e.Seq())
	}
	var d kvevents.Decoder
	var b kvevents.Batch
	removes := 0
	for i, r := range batches {
		if r.Seq != uint64(i) {
			t.Fatalf("batch %d has seq %d", i, r.Seq)
		}
		if err := d.Decode(r.Payload, &b); err != nil {
			t.Fatal(err)
		}
		for _, ev := range b.Events {
			for _, k := range ev.Hashes {
				switch ev.Kind {
				case kvevents.BlockStored:
					held[k]++
				case kvevents.BlockRemoved:
					removes++
					if held[k]--; held[k] < 0 {
						t.Fatalf("batch %d removes %d, which is not held", i, k)
					}
				}
			}
		}
	}
	if removes == 0 {
		t.Fatal("the pool never evicted: the test exercises nothing")
	}
	total := 0
	for _, n := range held {
		total += n
	}
	if total != e.CachedBlocks() {
		t.Fatalf("events leave %d blocks held, engine caches %d", total, e.CachedBlocks())
	}
	for i, p := range prompts {
		ks := keys(chain(t, h, p, nil))
		model := 0
		for model < len(ks) && held[ks[model]] > 0 {
			model++
		}
		if got := e.LookupKeys(ks); got != model {
			t.Fatalf("prompt %d: engine holds %d blocks, the event stream says %d", i, got, model)
		}
	}
}

func TestIPCEndpoints(t *testing.T) {
	dir := t.TempDir()
	e := newEngine(t, enginesim.Config{}, zmqtransport.PublisherConfig{
		Endpoint:       "ipc://" + filepath.Join(dir, "pub"),
		ReplayEndpoint: "ipc://" + filepath.Join(dir, "replay"),
	})
	if e.PubEndpoint() != "ipc://"+filepath.Join(dir, "pub") {
		t.Fatalf("PubEndpoint = %q", e.PubEndpoint())
	}
	sub := subscribe(t, e, "")
	seq := e.Seq()
	process(t, e, testutil.Seq(0, 8), nil, 0)
	sub.expect(seq)
	if got := replay(t, e, seq, false); len(got) != 1 {
		t.Fatalf("replayed %d", len(got))
	}
}

func TestNewErrors(t *testing.T) {
	h := hasher(t, 4)
	for _, tc := range []struct {
		name string
		cfg  enginesim.Config
		pcfg zmqtransport.PublisherConfig
	}{
		{"no hasher", enginesim.Config{CapacityBlocks: 1}, zmqtransport.PublisherConfig{}},
		{"no capacity", enginesim.Config{Hasher: h}, zmqtransport.PublisherConfig{}},
		{"bad endpoint", enginesim.Config{Hasher: h, CapacityBlocks: 1}, zmqtransport.PublisherConfig{Endpoint: "bogus://x"}},
		{"bad replay endpoint", enginesim.Config{Hasher: h, CapacityBlocks: 1}, zmqtransport.PublisherConfig{ReplayEndpoint: "tcp://256.0.0.1:1"}},
		{"publisher already set", enginesim.Config{Hasher: h, CapacityBlocks: 1, Publisher: &zmqtransport.Publisher{}}, zmqtransport.PublisherConfig{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if e, err := simzmq.New(tc.cfg, tc.pcfg); err == nil {
				e.Close()
				t.Fatal("New succeeded")
			}
		})
	}
	// Two engines cannot bind one port.
	a := newEngine(t, enginesim.Config{}, zmqtransport.PublisherConfig{})
	if _, err := simzmq.New(enginesim.Config{Hasher: h, CapacityBlocks: 1}, zmqtransport.PublisherConfig{Endpoint: a.PubEndpoint()}); err == nil {
		t.Fatal("second bind to one port succeeded")
	}
}

// settledGoroutines returns the goroutine count once goroutines of
// earlier tests that are still unwinding have exited.
func settledGoroutines() int {
	n := runtime.NumGoroutine()
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
		m := runtime.NumGoroutine()
		if m == n {
			break
		}
		n = m
	}
	return n
}

// TestCloseReleasesEverything: Close stops the replay goroutine, and the
// engine refuses work afterwards.
func TestCloseReleasesEverything(t *testing.T) {
	before := settledGoroutines()
	var engines []*simzmq.Engine
	for i := 0; i < 4; i++ {
		e, err := simzmq.New(enginesim.Config{Hasher: hasher(t, 4), CapacityBlocks: 8},
			zmqtransport.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"})
		if err != nil {
			t.Fatal(err)
		}
		engines = append(engines, e)
	}
	if runtime.NumGoroutine() < before+4 {
		t.Fatalf("%d goroutines with 4 replay servers, %d before", runtime.NumGoroutine(), before)
	}
	replay(t, engines[0], 0, false) // a served replay must not keep anything alive either
	for _, e := range engines {
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		if err := e.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	}
	// Close waits for the replay goroutines; allow the runtime a moment to
	// retire them, polling the observable count.
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines after Close, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
	e := engines[0]
	if _, err := e.Process(testutil.Seq(0, 8), nil); !errors.Is(err, enginesim.ErrClosed) {
		t.Fatalf("Process after Close: %v", err)
	}
	if err := e.Clear(); !errors.Is(err, enginesim.ErrClosed) {
		t.Fatalf("Clear after Close: %v", err)
	}
}

func Example() {
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 16})
	e, err := simzmq.New(enginesim.Config{Pod: "pod-a", Model: "m", Hasher: h, CapacityBlocks: 1024},
		zmqtransport.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()
	// Subscribers connect to e.PubEndpoint(); replay clients to
	// e.ReplayEndpoint().
	prompt := make([]uint64, 100)
	for i := range prompt {
		prompt[i] = uint64(i)
	}
	first, _ := e.Process(prompt, nil)
	second, _ := e.Process(prompt, nil)
	blocks, _ := e.Lookup(prompt, nil)
	fmt.Println(first, second, blocks, e.CachedBlocks(), e.Seq())
	// Output: 0 96 6 6 1
}
