package zmqtransport

import (
	"cmp"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
)

// waitTimeout bounds every wait for an observable condition in these
// tests. Nothing is timed: a healthy run finishes in milliseconds, the
// bound only turns a hang into a failure.
const waitTimeout = 15 * time.Second

// sinkEntry is one Sink call as a recSink saw it.
type sinkEntry struct {
	reset  kvevents.ResetReason // set for Reset calls
	seq    uint64
	kinds  []kvevents.Kind
	hashes []uint64 // every event's hashes, concatenated
}

func (e sinkEntry) String() string {
	if e.reset != "" {
		return "reset:" + string(e.reset)
	}
	return fmt.Sprintf("%d%v", e.seq, e.hashes)
}

// recSink records every call per engine and checks the Sink contract:
// calls for one engine never overlap.
type recSink struct {
	mu       sync.Mutex
	calls    map[kvevents.EngineID][]sinkEntry
	inflight map[kvevents.EngineID]bool
	overlaps int
	health   map[kvevents.EngineID]kvevents.Health // as kvevents.HealthSink last heard
}

func newRecSink() *recSink {
	return &recSink{calls: map[kvevents.EngineID][]sinkEntry{}, inflight: map[kvevents.EngineID]bool{}, health: map[kvevents.EngineID]kvevents.Health{}}
}

// Health implements kvevents.HealthSink.
func (r *recSink) Health(engine kvevents.EngineID, h kvevents.Health) {
	r.enter(engine)
	r.mu.Lock()
	r.health[engine] = h
	r.inflight[engine] = false
	r.mu.Unlock()
}

func (r *recSink) healthOf(e kvevents.EngineID) kvevents.Health {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.health[e]
}

func (r *recSink) enter(e kvevents.EngineID) {
	r.mu.Lock()
	if r.inflight[e] {
		r.overlaps++
	}
	r.inflight[e] = true
	r.mu.Unlock()
}

func (r *recSink) Apply(engine kvevents.EngineID, seq uint64, events []kvevents.Event) {
	r.enter(engine)
	// Copy: events are valid only during the call.
	ent := sinkEntry{seq: seq}
	for _, ev := range events {
		ent.kinds = append(ent.kinds, ev.Kind)
		ent.hashes = append(ent.hashes, ev.Hashes...)
	}
	r.mu.Lock()
	r.calls[engine] = append(r.calls[engine], ent)
	r.inflight[engine] = false
	r.mu.Unlock()
}

func (r *recSink) Reset(engine kvevents.EngineID, reason kvevents.ResetReason) {
	r.enter(engine)
	r.mu.Lock()
	r.calls[engine] = append(r.calls[engine], sinkEntry{reset: reason})
	r.inflight[engine] = false
	r.mu.Unlock()
}

func (r *recSink) entries(e kvevents.EngineID) []sinkEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls[e])
}

// applied returns the seqs applied for e since its last reset.
func (r *recSink) applied(e kvevents.EngineID) []uint64 {
	var seqs []uint64
	for _, ent := range r.entries(e) {
		if ent.reset != "" {
			seqs = nil
			continue
		}
		seqs = append(seqs, ent.seq)
	}
	return seqs
}

// waitApplied waits until e's last applied seq is at least seq.
func (r *recSink) waitApplied(t testing.TB, e kvevents.EngineID, seq uint64) {
	t.Helper()
	testutil.Await(t, waitTimeout, fmt.Sprintf("%s to apply seq %d", e, seq), func() bool {
		a := r.applied(e)
		return len(a) > 0 && a[len(a)-1] >= seq
	})
}

// wantSeqs asserts that e's calls, rendered, equal want.
func (r *recSink) wantCalls(t testing.TB, e kvevents.EngineID, want []string) {
	t.Helper()
	var got []string
	for _, ent := range r.entries(e) {
		if ent.reset != "" {
			got = append(got, ent.String())
		} else {
			got = append(got, strconv.FormatUint(ent.seq, 10))
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("%s: Sink calls\n got  %v\n want %v", e, got, want)
	}
}

// seqRange returns "from".."to-1" as strings, for wantCalls.
func seqRange(from, to uint64) []string {
	var out []string
	for s := from; s < to; s++ {
		out = append(out, strconv.FormatUint(s, 10))
	}
	return out
}

// testBatch is the batch a test publisher sends as seq n: one BlockStored
// whose single hash encodes the seq, so the Sink can check that the
// payload it got is the one published under that seq.
func testBatch(n uint64, rank int) *kvevents.Batch {
	toks := make([]uint64, 16)
	for i := range toks {
		toks[i] = n*16 + uint64(i)
	}
	return &kvevents.Batch{
		TS: 1750000000.5, HasDPRank: true, DPRank: rank,
		Events: []kvevents.Event{{
			Kind: kvevents.BlockStored, Hashes: []uint64{hashOf(n)}, TokenIDs: toks, BlockSize: 16, Medium: kvevents.MediumGPU,
		}},
	}
}

func hashOf(seq uint64) uint64 { return 0x9e3779b97f4a7c15 ^ seq }

// checkHashes asserts that every applied batch of e carries the hash of
// its own seq.
func (r *recSink) checkHashes(t testing.TB, e kvevents.EngineID) {
	t.Helper()
	for _, ent := range r.entries(e) {
		if ent.reset != "" {
			continue
		}
		if len(ent.hashes) != 1 || ent.hashes[0] != hashOf(ent.seq) {
			t.Fatalf("%s seq %d carries hashes %x, want [%x]", e, ent.seq, ent.hashes, hashOf(ent.seq))
		}
	}
}

func encodeTestBatch(t testing.TB, n uint64, rank int, shape kvevents.Shape) []byte {
	t.Helper()
	p, err := kvevents.AppendBatch(nil, testBatch(n, rank), kvevents.EncodeOptions{Shape: shape})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// goldenPayload is one of the msgspec-produced payloads in
// testdata/interop/wire_payloads.json.
type goldenPayload struct {
	Hex    string `json:"payload_hex"`
	DPRank *int   `json:"dp_rank"`
	Events []struct {
		Kind   string   `json:"kind"`
		Hashes []uint64 `json:"hashes"`
	} `json:"events"`
}

func loadGoldenPayloads(t testing.TB) map[string]goldenPayload {
	t.Helper()
	raw, err := os.ReadFile("testdata/interop/wire_payloads.json")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Payloads map[string]goldenPayload `json:"payloads"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	return f.Payloads
}

func (g goldenPayload) bytes(t testing.TB) []byte {
	b, err := hex.DecodeString(g.Hex)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// pubOptions configures a testPublisher.
type pubOptions struct {
	topic     string
	newReplay bool   // replay replies carry the topic frame (vLLM >= 0.26)
	noReplay  bool   // no replay socket at all
	silent    bool   // the replay socket never answers
	keep      int    // replay buffer length in batches (vLLM buffer_steps)
	connect   string // connect the PUB to this endpoint instead of binding
	pubAt     string // bind endpoints (default tcp://127.0.0.1:*)
	replayAt  string
}

// bufferedBatch is one batch of a testPublisher's replay buffer.
type bufferedBatch struct {
	seq     uint64
	payload []byte
}

// testPublisher speaks vLLM's ZmqEventPublisher protocol: 3-frame
// messages on a PUB socket, replay on a ROUTER. Its PUB is an XPUB, which
// is the same on the wire but reports subscriptions, so tests can wait for
// the subscriber instead of sleeping past the slow-joiner window.
type testPublisher struct {
	t    testing.TB
	opts pubOptions
	zctx *zmq.Context

	mu       sync.Mutex
	pub      *zmq.Socket
	router   *zmq.Socket
	PubEP    string
	ReplayEP string
	next     uint64
	buf      []bufferedBatch
	drop     map[uint64]bool
	subs     int // subscriptions seen
	gen      int // engine process: restart counts up; its batches differ in their timestamp

	replays atomic.Int64 // replay requests served
	stop    chan struct{}
	done    chan struct{}
}

func newTestPublisher(t testing.TB, opts pubOptions) *testPublisher {
	t.Helper()
	if opts.keep == 0 {
		opts.keep = 10_000
	}
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	p := &testPublisher{t: t, opts: opts, zctx: zctx, drop: map[uint64]bool{}}
	p.open()
	t.Cleanup(p.Close)
	return p
}

func (p *testPublisher) open() {
	t := p.t
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	pub, err := p.zctx.NewSocket(zmq.XPUB)
	must(err)
	must(pub.SetLinger(0))
	must(pub.SetSndhwm(0))
	// Report every subscription, also repeated ones (a subscriber that
	// reconnects before its old connection is noticed as gone).
	must(pub.SetXpubVerbose(1))
	if p.opts.connect != "" {
		must(pub.SetReconnectIvl(20 * time.Millisecond))
		must(pub.Connect(p.opts.connect))
		p.PubEP = p.opts.connect
	} else {
		at := cmp.Or(p.PubEP, p.opts.pubAt, "tcp://127.0.0.1:*")
		if err := bindRetry(pub, at); err != nil {
			pub.Close()
			t.Fatal(err)
		}
		p.PubEP, err = pub.GetLastEndpoint()
		must(err)
	}
	p.pub = pub
	if !p.opts.noReplay {
		r, err := p.zctx.NewSocket(zmq.ROUTER)
		must(err)
		must(r.SetLinger(0))
		must(r.SetSndhwm(0))
		if err := bindRetry(r, cmp.Or(p.ReplayEP, p.opts.replayAt, "tcp://127.0.0.1:*")); err != nil {
			r.Close()
			p.pub.Close()
			t.Fatal(err)
		}
		p.ReplayEP, err = r.GetLastEndpoint()
		must(err)
		p.router = r
		p.stop, p.done = make(chan struct{}), make(chan struct{})
		go p.serveReplay(r, p.stop, p.done)
	}
}

// bindRetry binds, retrying while the port is still held: libzmq closes a
// socket's listener asynchronously, so a restarted publisher may find its
// old port busy for a moment.
func bindRetry(sock *zmq.Socket, endpoint string) error {
	deadline := time.Now().Add(waitTimeout)
	for {
		err := sock.Bind(endpoint)
		if err == nil || zmq.AsErrno(err) != zmq.EADDRINUSE || time.Now().After(deadline) {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// serveReplay answers replay requests the way vLLM's _service_replay does.
func (p *testPublisher) serveReplay(r *zmq.Socket, stop, done chan struct{}) {
	defer close(done)
	poller := zmq.NewPoller()
	poller.Add(r, zmq.POLLIN)
	for {
		select {
		case <-stop:
			return
		default:
		}
		polled, err := poller.Poll(10 * time.Millisecond)
		if err != nil || len(polled) == 0 {
			continue
		}
		msg, err := r.RecvMessageBytes(0)
		if err != nil || len(msg) != 3 {
			continue
		}
		p.replays.Add(1)
		if p.opts.silent {
			continue
		}
		id, start := msg[0], binary.BigEndian.Uint64(msg[2])
		p.mu.Lock()
		buf := slices.Clone(p.buf)
		p.mu.Unlock()
		send := func(seq []byte, payload []byte) {
			if p.opts.newReplay {
				_, _ = r.SendMessage(id, []byte{}, []byte(p.opts.topic), seq, payload)
			} else {
				_, _ = r.SendMessage(id, []byte{}, seq, payload)
			}
		}
		for _, h := range buf {
			if h.seq >= start {
				send(seqBytes(h.seq), h.payload)
			}
		}
		send(seqBytes(replayEndSeq), []byte{})
	}
}

func seqBytes(seq uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], seq)
	return b[:]
}

// waitSubscribed waits until n subscriptions in total have reached the
// PUB socket: from then on, published messages reach the subscriber(s).
func (p *testPublisher) waitSubscribed(n int) {
	p.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.subs < n {
		if time.Now().After(deadline) {
			p.t.Fatalf("publisher %s: no subscriber after %v", p.PubEP, waitTimeout)
		}
		poller := zmq.NewPoller()
		poller.Add(p.pub, zmq.POLLIN)
		polled, err := poller.Poll(20 * time.Millisecond)
		if err != nil || len(polled) == 0 {
			continue
		}
		msg, err := p.pub.RecvBytes(0)
		if err == nil && len(msg) > 0 && msg[0] == 1 {
			p.subs++
		}
	}
}

// dropLive makes the given seqs skip the live socket (they still enter
// the replay buffer), as if the SUB's queue had overflowed.
func (p *testPublisher) dropLive(seqs ...uint64) {
	p.mu.Lock()
	for _, s := range seqs {
		p.drop[s] = true
	}
	p.mu.Unlock()
}

// publish sends payload as the next batch and returns its seq.
func (p *testPublisher) publish(payload []byte) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	seq := p.next
	p.next++
	p.buf = append(p.buf, bufferedBatch{seq, payload})
	if len(p.buf) > p.opts.keep {
		p.buf = p.buf[len(p.buf)-p.opts.keep:]
	}
	if !p.drop[seq] {
		if _, err := p.pub.SendMessage([]byte(p.opts.topic), seqBytes(seq), payload); err != nil {
			p.t.Errorf("publish: %v", err)
		}
	}
	return seq
}

// publishN publishes test batches until n have been published in total.
// A restarted publisher's batches carry another timestamp, as a new
// engine process's would.
func (p *testPublisher) publishN(n uint64, rank int) {
	for p.peekNext() < n {
		b := testBatch(p.peekNext(), rank)
		p.mu.Lock()
		b.TS += float64(p.gen)
		p.mu.Unlock()
		payload, err := kvevents.AppendBatch(nil, b, kvevents.EncodeOptions{Shape: kvevents.ShapeArray})
		if err != nil {
			p.t.Fatal(err)
		}
		p.publish(payload)
	}
}

func (p *testPublisher) peekNext() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.next
}

// sendRaw sends an arbitrary multipart message on the PUB socket.
func (p *testPublisher) sendRaw(frames ...[]byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	parts := make([]any, len(frames))
	for i, f := range frames {
		parts[i] = f
	}
	if _, err := p.pub.SendMessage(parts...); err != nil {
		p.t.Errorf("send raw: %v", err)
	}
}

// restart simulates a new engine process on the same endpoints: fresh
// sockets, seq back to 0, empty replay buffer.
func (p *testPublisher) restart() {
	p.closeSockets()
	p.mu.Lock()
	p.next, p.buf, p.subs = 0, nil, 0
	p.gen++
	clear(p.drop)
	p.mu.Unlock()
	p.open()
}

func (p *testPublisher) closeSockets() {
	if p.stop != nil {
		close(p.stop)
		<-p.done
		p.stop = nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pub != nil {
		p.pub.Close()
		p.pub = nil
	}
	if p.router != nil {
		p.router.Close()
		p.router = nil
	}
}

// Close stops the publisher for good (an engine going away).
func (p *testPublisher) Close() {
	p.closeSockets()
	if p.zctx != nil {
		p.zctx.Term()
		p.zctx = nil
	}
}

// freePortPair returns two tcp endpoints on 127.0.0.1 with consecutive
// ports (rank 0 and rank 1 of a data-parallel engine).
func freePortPair(t testing.TB) (string, string) {
	t.Helper()
	port := testutil.FreePorts(t, 2)
	return "tcp://127.0.0.1:" + strconv.Itoa(port), "tcp://127.0.0.1:" + strconv.Itoa(port+1)
}

// fixedClock is an injected wall clock.
func fixedClock() time.Time { return time.Unix(1_750_000_000, 42) }

// startSubscriber starts a subscriber whose logs go to the test log.
func startSubscriber(t testing.TB, cfg SubscriberConfig, sink kvevents.Sink) *Subscriber {
	t.Helper()
	if cfg.Now == nil {
		cfg.Now = fixedClock
	}
	s, err := NewSubscriber(cfg, sink, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// waitReady waits until a connect-mode stream is connected and, if it has
// a replay endpoint, has finished the replay it asks for on connecting
// (recovering the engine's buffer), so that a test's own batches meet a
// settled stream.
func waitReady(t testing.TB, s *Subscriber, e kvevents.EngineID) {
	t.Helper()
	testutil.Await(t, waitTimeout, e.String()+" ready", func() bool {
		st, ok := streamOf(s, e)
		if !ok || !st.Connected {
			return false
		}
		return st.ReplayEndpoint == "" || (st.ReplaysOK+st.ReplaysFailed >= 1 && !st.Replaying)
	})
}

// streamOf returns the stats of one engine's stream.
func streamOf(s *Subscriber, e kvevents.EngineID) (kvevents.StreamStats, bool) {
	for _, st := range s.Streams() {
		if st.Engine == e {
			return st, true
		}
	}
	return kvevents.StreamStats{}, false
}

// mustStream returns the stats of e's stream once no replay is
// outstanding: a replay's end marker may still be in flight after the
// Sink saw its last batch, and a stream settles only with it.
func mustStream(t testing.TB, s *Subscriber, e kvevents.EngineID) kvevents.StreamStats {
	t.Helper()
	var st kvevents.StreamStats
	testutil.Await(t, waitTimeout, e.String()+" settled", func() bool {
		var ok bool
		st, ok = streamOf(s, e)
		if !ok {
			t.Fatalf("no stream for %s in %+v", e, s.Streams())
		}
		return !st.Replaying
	})
	return st
}

// testLogger writes slog records to t.Log (only shown for failing tests
// or -v).
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// goroutineBaseline and checkNoLeaks detect goroutines left behind.
func goroutineBaseline() int { return runtime.NumGoroutine() }

func checkNoLeaks(t testing.TB, base int) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Fatalf("%d goroutines left (baseline %d):\n%s", runtime.NumGoroutine(), base, buf[:n])
		}
		time.Sleep(2 * time.Millisecond)
	}
}
