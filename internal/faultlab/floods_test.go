package faultlab

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvindex/kvindex/internal/memlimit"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// floodsBudget is the --memory-budget of the flood rows: the default
// --max-engines then follows from it (memlimit.MaxEngines).
const floodsBudget = 64 << 20

// floodPayload encodes one well-formed batch of blocks with random hashes
// over random tokens: hashes kvindex cannot verify (it keys them by its
// own chain of the tokens, in fallback mode). refused makes the index
// refuse every event (16 tokens per block of 8): decodable junk.
func floodPayload(t testing.TB, rng *rand.Rand, blocks int, refused bool) []byte {
	t.Helper()
	ev := kvevents.Event{Kind: kvevents.BlockStored, BlockSize: blockSize, Medium: kvevents.MediumGPU}
	for range blocks {
		ev.Hashes = append(ev.Hashes, rng.Uint64())
		for range blockSize {
			ev.TokenIDs = append(ev.TokenIDs, rng.Uint64N(1<<17))
		}
	}
	if refused {
		ev.BlockSize = blockSize / 2
	}
	p, err := kvevents.AppendBatch(nil, &kvevents.Batch{TS: 1, Events: []kvevents.Event{ev}}, kvevents.EncodeOptions{Shape: kvevents.ShapeMap})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// rawPub is a bare ZMQ publisher connected to kvindex's listen socket,
// speaking the engines' 3-frame protocol under any topic. It is an XPUB,
// the same as a PUB on the wire, so that it can wait for kvindex's
// subscription instead of losing what it sends before (slow joiner). Not
// safe for concurrent use (a ZMQ socket lives on one goroutine).
type rawPub struct{ sock *zmq.Socket }

func dialRawPub(zctx *zmq.Context, listen string, sndHWM int) (*rawPub, error) {
	s, err := zctx.NewSocket(zmq.XPUB)
	if err != nil {
		return nil, err
	}
	for _, set := range []func() error{
		func() error { return s.SetLinger(0) },
		func() error { return s.SetSndhwm(sndHWM) },
		func() error { return s.SetRcvtimeo(awaitBound) },
		func() error { return s.Connect(listen) },
	} {
		if err := set(); err != nil {
			s.Close()
			return nil, err
		}
	}
	return &rawPub{sock: s}, nil
}

// subscribed waits for kvindex's subscription.
func (p *rawPub) subscribed() error {
	if _, err := p.sock.RecvBytes(0); err != nil {
		return fmt.Errorf("no subscription from kvindex: %w", err)
	}
	return nil
}

func (p *rawPub) send(topic string, seq uint64, payload []byte) error {
	var sb [8]byte
	binary.BigEndian.PutUint64(sb[:], seq)
	_, err := p.sock.SendMessage(topic, sb[:], payload)
	return err
}

// newZMQContext is a ZMQ context closed when the test ends.
func newZMQContext(t testing.TB) *zmq.Context {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	_ = zctx.SetMaxSockets(1 << 14)
	t.Cleanup(func() { zctx.Term() })
	return zctx
}

// scrape fetches kvindex's /metrics: its size, how long it took, and the
// values of the series whose name starts with one of prefixes, by series
// (name and labels).
func scrape(t *testing.T, k *kvindexProc, prefixes ...string) (size int, took time.Duration, values map[string]float64) {
	t.Helper()
	start := time.Now()
	resp, err := (&http.Client{Timeout: awaitBound}).Get("http://" + k.httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	took = time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	values = map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(line, p) }) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			values[line[:i]] = v
		}
	}
	return len(body), took, values
}

// listenerSeries are the series the flood rows read.
var listenerSeries = []string{"kvindex_listener_", "kvindex_engines{"}

// memorySeries are the series that say where kvindex's memory is.
var memorySeries = []string{"process_resident_memory_bytes", "go_memstats_heap_inuse_bytes", "go_memstats_sys_bytes", "kvindex_index_bytes", "kvindex_listener_messages_total"}

// listenerValue sums a listener series over its endpoint label (one
// listen socket), for the label set rest (e.g. `reason="unproven"`).
func listenerValue(values map[string]float64, name, rest string) float64 {
	var sum float64
	for k, v := range values {
		if strings.HasPrefix(k, name+"{") && strings.Contains(k, rest) {
			sum += v
		}
	}
	return sum
}

// metricsBytesPerEngine is a generous allowance for one engine's series
// in /metrics (its health, connection, counters and index gauges, each
// with pod, rank and model labels: about 3 KB measured); metricsBase, for
// the rest.
const (
	metricsBytesPerEngine = 4 << 10
	metricsBase           = 256 << 10
	metricsEngines        = 1000 // serve's --metrics-engines default
)

// topicFlood: a bind-mode kvindex (--memory-budget 64MiB, so --max-engines
// follows from it) whose two real engines are named by exact allow rules,
// beside a glob rule over loopback; one PUB socket publishes well-formed
// batches under 8,000 invented topics matching the glob, in rounds of one
// batch per topic, for about ten seconds; half the topics send events the
// index refuses (junk), half random blocks it accepts. The real engines
// keep publishing and must stay ok, with every answer right; the junk's
// streams are dropped within seconds and free their slots; a third real
// engine, admitted only by the glob, joins after the flood and must get a
// slot; /metrics stays small (at most --metrics-engines engines' series);
// the peak RSS stays within the budget's process bound.
func topicFlood(t *testing.T) {
	const topics, rounds = 8000, 10
	listen := "tcp://" + testutil.FreeAddr(t)
	k := startKvindex(t, "--listen", listen, "--memory-budget", strconv.Itoa(floodsBudget),
		"--engine-allow", "pod-0=127.0.0.1", "--engine-allow", "pod-1=127.0.0.1", "--engine-allow", "*=127.0.0.1")
	engines := []*engine{
		newEngine(t, "pod-0", 1, engineOpts{connectTo: listen}),
		newEngine(t, "pod-1", 2, engineOpts{connectTo: listen}),
	}
	warmUp(t, k, engines)
	tr := newTraffic(1)
	tr.run(t, engines, 50)
	awaitOK(t, k, engines)

	stop := make(chan struct{})
	realDone := make(chan error, 1)
	go func() { // the real engines keep publishing throughout
		rt := newTraffic(9)
		for {
			select {
			case <-stop:
				realDone <- nil
				return
			default:
			}
			for _, e := range engines {
				if _, err := e.Process(rt.prompt(), nil); err != nil {
					realDone <- err
					return
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	zctx := newZMQContext(t)
	flooder, err := dialRawPub(zctx, listen, 0) // queue, do not drop: every topic reaches kvindex
	if err != nil {
		t.Fatal(err)
	}
	defer flooder.sock.Close()
	if err := flooder.subscribed(); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(8000, 1))
	junk, good := floodPayload(t, rng, 1, true), floodPayload(t, rng, 1, false)
	floodStart := time.Now()
	for r := range rounds {
		for i := range topics {
			p := good
			if i%2 == 0 {
				p = junk
			}
			if err := flooder.send(fmt.Sprintf("kv@flood-%04d@%s", i, model), uint64(r), p); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Until(floodStart.Add(time.Duration(r+1) * time.Second)))
	}
	floodEnd := time.Now()
	size, took, values := scrape(t, k, listenerSeries...)
	t.Logf("/metrics at the flood's end: %d bytes in %s; engines by state: ok %v, unconfirmed %v", size, took.Round(time.Millisecond),
		values[`kvindex_engines{state="ok"}`], values[`kvindex_engines{state="unconfirmed"}`])
	if bound := metricsBase + metricsEngines*metricsBytesPerEngine; size > bound {
		t.Errorf("/metrics is %d bytes at %d topics, over %d (%d engines' series of %d bytes and %d)", size, topics, bound, metricsEngines, metricsBytesPerEngine, metricsBase)
	}
	close(stop)
	if err := <-realDone; err != nil {
		t.Fatal(err)
	}
	if !allOK(t, k, engines) {
		t.Errorf("a named engine is not ok after the flood: %v", listPods(t, k))
	}

	// The junk's last streams go within the proving window (5 s, checked
	// every 1.25 s).
	var released time.Duration
	for deadline := time.Now().Add(awaitBound); ; {
		junkLeft := 0
		for key := range listPods(t, k) {
			var n int
			if _, err := fmt.Sscanf(key, "flood-%04d/0", &n); err == nil && n%2 == 0 {
				junkLeft++
			}
		}
		if junkLeft == 0 {
			released = time.Since(floodEnd)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d junk streams still held %s after the flood", junkLeft, awaitBound)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// A third real engine, admitted only by the glob, joins.
	joinStart := time.Now()
	third := newEngine(t, "pod-2", 3, engineOpts{connectTo: listen})
	engines = append(engines, third)
	warmUp(t, k, engines[2:])
	joined := time.Since(joinStart)
	tr.run(t, engines, 20)
	faultEnd := time.Now()
	tail(t, tr, engines)
	_, _, values = scrape(t, k, listenerSeries...)
	unproven := listenerValue(values, "kvindex_listener_forgotten_engines_total", `reason="unproven"`)
	displaced := listenerValue(values, "kvindex_listener_forgotten_engines_total", `reason="displaced"`)
	refused := listenerValue(values, "kvindex_listener_refused_engines_total", "")
	t.Logf("flood of %d topics x %d rounds: %d junk streams dropped unproven (the last %s after the flood), %d displaced, %d engine ranks refused; pod-2 admitted %s after joining",
		topics, rounds, int(unproven), released.Round(time.Millisecond), int(displaced), int(refused), joined.Round(time.Millisecond))
	if unproven == 0 {
		t.Errorf("no junk stream was dropped: the row tests nothing")
	}
	settle(t, k, faultEnd, engines, nil, floodsBudget)
	checkBound(t, k, floodsBudget)
}

// randomHashFlood: 1,000 pods, each its own ZMQ PUB socket connected to a
// bind-mode kvindex (--memory-budget 64MiB, a glob rule over loopback),
// publish well-formed BlockStored batches of random hashes as fast as they
// can, beside one healthy engine with a true cache (named by an exact
// rule). kvindex cannot verify the random hashes (fallback mode), so the
// budget sheds their entries first: the healthy engine stays ok, every
// answer about it is right, and the peak RSS stays within the process
// bound. One socket per pod, not many topics on few sockets: kvindex's
// listener keeps a receive queue per connection (up to RcvHWM messages
// each), outside the Go heap, so it admits only as many connections as
// its queues are sized for (--max-engines, beyond those of the healthy
// engine's address, which an exact rule names) and refuses the others at
// the handshake; the sockets refused never get kvindex's subscription and
// send nothing it reads.
func randomHashFlood(t *testing.T) {
	const pods, batches, blocks, workers = 1000, 60, 8, 8
	listen := "tcp://" + testutil.FreeAddr(t)
	k := startKvindex(t, "--listen", listen, "--memory-budget", strconv.Itoa(floodsBudget),
		"--engine-allow", "pod-0=127.0.0.1", "--engine-allow", "*=127.0.0.1")
	healthy := []*engine{newEngine(t, "pod-0", 1, engineOpts{connectTo: listen})}
	warmUp(t, k, healthy)
	tr := newTraffic(1)
	tr.run(t, healthy, 50)
	awaitOK(t, k, healthy)

	zctx := newZMQContext(t)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	var sent [workers]int
	// Each socket gets kvindex's subscription or is refused at the
	// handshake; the flood starts once kvindex has decided every one.
	var subscribed atomic.Int64
	decided := make(chan struct{})
	// The sockets stay open until the row ends: closing one drops what
	// it still queues, and kvindex would see the pod depart.
	release := make(chan struct{})
	var closed sync.WaitGroup
	var decide sync.Once
	t.Cleanup(func() {
		decide.Do(func() { close(decided) })
		close(release)
		closed.Wait()
	})
	for w := range workers {
		rng := rand.New(rand.NewPCG(uint64(w), 2))
		payloads := make([][]byte, 16)
		for i := range payloads {
			payloads[i] = floodPayload(t, rng, blocks, false)
		}
		wg.Add(1)
		closed.Add(1)
		go func() { // each worker owns its sockets: pods w, w+workers, ...
			defer closed.Done()
			var socks []*rawPub
			defer func() {
				<-release
				for _, s := range socks {
					s.sock.Close()
				}
			}()
			defer wg.Done()
			var topics []string
			for i := w; i < pods; i += workers {
				s, err := dialRawPub(zctx, listen, 1000) // libzmq's default: drop beyond it, as vLLM's PUB does
				if err != nil {
					errs <- err
					return
				}
				socks = append(socks, s)
				topics = append(topics, fmt.Sprintf("kv@hash-%04d@%s", i, model))
			}
			var admitted []int // of socks
			pending := make([]int, len(socks))
			for i := range pending {
				pending[i] = i
			}
			for len(pending) > 0 {
				var still []int
				for _, i := range pending {
					if _, err := socks[i].sock.RecvBytes(zmq.DONTWAIT); err == nil {
						admitted = append(admitted, i)
						subscribed.Add(1)
					} else {
						still = append(still, i)
					}
				}
				pending = still
				select {
				case <-decided:
					pending = nil
				case <-time.After(pollEvery):
				}
			}
			<-decided
			slices.Sort(admitted)
			for b := range batches {
				for _, i := range admitted {
					s := socks[i]
					if err := s.send(topics[i], uint64(b), payloads[(b+i)%len(payloads)]); err != nil {
						errs <- err
						return
					}
					sent[w]++
				}
			}
		}()
	}
	var refusedConns float64
	testutil.Await(t, awaitBound, "every flood connection admitted or refused", func() bool {
		_, _, v := scrape(t, k, "kvindex_listener_refused_connections_total")
		refusedConns = listenerValue(v, "kvindex_listener_refused_connections_total", `reason="full"`)
		// >=: a peer that sees the connection close before the refusal
		// reaches it retries, and is refused again.
		return int(refusedConns)+int(subscribed.Load()) >= pods
	})
	decide.Do(func() { close(decided) })
	go func() { // the healthy engine keeps publishing meanwhile
		wg.Wait()
		close(errs)
	}()
	peak, stopSampling := sampleMemory(t, k)
	rt := newTraffic(5)
	for running := true; running; {
		select {
		case err, ok := <-errs:
			if ok {
				t.Fatal(err)
			}
			running = false
		case <-time.After(5 * time.Millisecond): // an engine at work, not a flood of its own
			if _, err := healthy[0].Process(rt.prompt(), nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	total := 0
	for _, n := range sent {
		total += n
	}
	// kvindex has taken what it will of the flood once its count of
	// messages stands still.
	for last, deadline := -1.0, time.Now().Add(awaitBound); ; time.Sleep(500 * time.Millisecond) {
		_, _, v := scrape(t, k, "kvindex_listener_messages_total")
		n := listenerValue(v, "kvindex_listener_messages_total", "")
		if n == last {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kvindex still reading the flood %s after it ended", awaitBound)
		}
		last = n
	}
	faultEnd := time.Now()
	tail(t, tr, healthy)
	_, _, values := scrape(t, k, listenerSeries...)
	t.Logf("%d pods connect, %d admitted, %d connections refused at the handshake (max engines %d)", pods, subscribed.Load(), int(refusedConns), memlimit.MaxEngines(floodsBudget, zmqtransport.DefaultMaxEngines))
	if int(refusedConns) == 0 {
		t.Errorf("no flood connection was refused: the listen socket's queues are not bounded")
	}
	t.Logf("%d batches of %d random blocks sent by the %d pods admitted (max engines %d); engines by state: ok %v, unconfirmed %v, degraded %v, partial %v; listener messages %v, peers %v",
		total, blocks, int(subscribed.Load()), memlimit.MaxEngines(floodsBudget, zmqtransport.DefaultMaxEngines),
		values[`kvindex_engines{state="ok"}`], values[`kvindex_engines{state="unconfirmed"}`], values[`kvindex_engines{state="degraded"}`], values[`kvindex_engines{state="partial"}`],
		listenerValue(values, "kvindex_listener_messages_total", ""), listenerValue(values, "kvindex_listener_peers", ""))
	stopSampling()
	p := *peak
	t.Logf("at the highest RSS sampled, %s: %s mapped files; %s anonymous, of which the Go runtime holds at most %s (heap in use %s, the index %s), the rest, about %s, is the C heap (libzmq's receive queues: one per connection)",
		mib(int64(p["VmRSS"])), mib(int64(p["RssFile"])), mib(int64(p["RssAnon"])), mib(int64(p["go_memstats_sys_bytes"])),
		mib(int64(p["go_memstats_heap_inuse_bytes"])), mib(int64(p["kvindex_index_bytes"])), mib(int64(p["RssAnon"]-p["go_memstats_sys_bytes"])))
	settle(t, k, faultEnd, healthy, nil, floodsBudget)
	checkBound(t, k, floodsBudget)
	if !allOK(t, k, healthy) {
		t.Errorf("the healthy engine is not ok after the flood: %v", listPods(t, k)[podKey(healthy[0].name, 0)])
	}
}

// sampleMemory follows kvindex's resident set (VmRSS, cheap to read)
// until stop is called, and scrapes its memory series each time the
// resident set reaches a new high by 4 MiB: where the memory is when it
// peaks, at little cost to kvindex (a scrape renders every engine's
// series).
func sampleMemory(t *testing.T, k *kvindexProc) (peak *map[string]float64, stop func()) {
	t.Helper()
	peak = &map[string]float64{}
	done, quit := make(chan struct{}), make(chan struct{})
	status := fmt.Sprintf("/proc/%d/status", k.cmd.Process.Pid)
	go func() {
		defer close(done)
		hc := &http.Client{Timeout: awaitBound}
		var high int64
		for {
			select {
			case <-quit:
				return
			case <-time.After(100 * time.Millisecond):
			}
			b, err := os.ReadFile(status)
			if err != nil {
				return
			}
			kb := map[string]float64{}
			for _, line := range strings.Split(string(b), "\n") {
				name, rest, _ := strings.Cut(line, ":")
				if f := strings.Fields(rest); len(f) == 2 && f[1] == "kB" {
					n, _ := strconv.ParseFloat(f[0], 64)
					kb[name] = n * 1024
				}
			}
			rss := int64(kb["VmRSS"])
			if rss < high+4<<20 {
				continue
			}
			high = rss
			resp, err := hc.Get("http://" + k.httpAddr + "/metrics")
			if err != nil {
				continue
			}
			v := map[string]float64{"VmRSS": kb["VmRSS"], "RssFile": kb["RssFile"], "RssAnon": kb["RssAnon"]}
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				line := sc.Text()
				if slices.ContainsFunc(memorySeries, func(p string) bool { return strings.HasPrefix(line, p) }) {
					i := strings.LastIndexByte(line, ' ')
					if f, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
						name := line[:i]
						if j := strings.IndexByte(name, '{'); j > 0 {
							name = name[:j]
						}
						v[name] = f
					}
				}
			}
			resp.Body.Close()
			*peak = v
		}
	}()
	return peak, func() { close(quit); <-done }
}
