package zmqtransport

import (
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
)

// TestSubscriberBindModeRanks: vLLM's rank r connects to the listen port
// + r, so a listener for two ranks binds both ports and reads each rank
// from its own.
func TestSubscriberBindModeRanks(t *testing.T) {
	ep0, ep1 := freePortPair(t)
	sink := newRecSink()
	s := startSubscriber(t, SubscriberConfig{Listen: ep0, ListenRanks: 2}, sink)
	if got := s.ListenEndpoint(); got != ep0 {
		t.Fatalf("ListenEndpoint %q, want rank 0's %q", got, ep0)
	}
	for r, ep := range []string{ep0, ep1} {
		// The endpoint vLLM's rank r connects to, given ep0.
		if want, _ := offsetEndpoint(ep0, r); ep != want {
			t.Fatalf("rank %d: %s, want %s", r, ep, want)
		}
		p := newTestPublisher(t, pubOptions{connect: ep, noReplay: true, topic: "kv@pod-d@m"})
		p.waitSubscribed(1)
		p.publishN(3, r)
	}
	for r, ep := range []string{ep0, ep1} {
		e := kvevents.EngineID{Pod: "pod-d", Model: "m", DPRank: r}
		sink.waitApplied(t, e, 2)
		sink.wantCalls(t, e, seqRange(0, 3))
		if st := mustStream(t, s, e); st.Endpoint != ep || !st.Bind {
			t.Errorf("rank %d: stream %+v, want endpoint %s", r, st, ep)
		}
	}
}

// A listener for several ranks fails to start when any rank's port is
// taken, naming that port.
func TestSubscriberBindModeRankPortTaken(t *testing.T) {
	ep0, ep1 := freePortPair(t)
	busy, err := net.Listen("tcp", strings.TrimPrefix(ep1, "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	s, err := NewSubscriber(SubscriberConfig{Listen: ep0, ListenRanks: 2}, newRecSink(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Start(); err == nil || !strings.Contains(err.Error(), "bind "+ep1+" (rank 1's port)") {
		t.Fatalf("Start: %v, want an error naming rank 1's port %s", err, ep1)
	}
}

// AddEngine refuses an engine whose ports collide with a configured one's,
// before and after Start.
func TestSubscriberAddEngineLayout(t *testing.T) {
	s, err := NewSubscriber(SubscriberConfig{Engines: []EngineConfig{
		{Name: "a", Model: "m", Endpoint: "tcp://127.0.0.1:1", ReplayEndpoint: "tcp://127.0.0.1:11", Ranks: 2},
	}}, newRecSink(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	clash := EngineConfig{Name: "b", Model: "m", Endpoint: "tcp://127.0.0.1:2"}
	for _, phase := range []string{"before Start", "after Start"} {
		var le *LayoutError
		if err := s.AddEngine(clash); !errors.As(err, &le) || le.Engine != "b" || !strings.Contains(le.Detail, `engine "a" uses it for rank 1's events`) {
			t.Errorf("%s: AddEngine: %v, want a LayoutError for b", phase, err)
		}
		if phase == "before Start" {
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.AddEngine(EngineConfig{Name: "c", Model: "m", Endpoint: "tcp://127.0.0.1:3"}); err != nil {
		t.Errorf("AddEngine of a free port: %v", err)
	}
}

// acceptAndClose is a TCP server that is no ZMQ publisher: it accepts
// every connection and closes it at once, counting them.
func acceptAndClose(t *testing.T) (endpoint string, accepts *atomic.Int64, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepts = &atomic.Int64{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepts.Add(1)
			c.Close()
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			ln.Close()
			<-done
		})
	}
	t.Cleanup(stop)
	return "tcp://127.0.0.1:" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), accepts, stop
}

// logLines collects log lines, safe for concurrent writers.
type logLines struct{ testutil.SyncBuffer }

// matching returns the lines containing every one of subs.
func (l *logLines) matching(subs ...string) []string {
	var out []string
	for _, line := range strings.Split(l.String(), "\n") {
		ok := line != ""
		for _, s := range subs {
			ok = ok && strings.Contains(line, s)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}

// startLogged starts a subscriber logging into the returned lines.
func startLogged(t *testing.T, cfg SubscriberConfig, sink kvevents.Sink) (*Subscriber, *logLines) {
	t.Helper()
	logs := &logLines{}
	s, err := NewSubscriber(cfg, sink, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		if t.Failed() {
			t.Logf("subscriber logs:\n%s", strings.Join(logs.matching(), "\n"))
		}
	})
	return s, logs
}

// An endpoint that accepts TCP but speaks no ZMQ is retried with a
// growing backoff, not at libzmq's fixed reconnect interval, and never
// counts as connected; once a publisher binds there, it is read.
func TestSubscriberBacksOffFromNonZMQPeer(t *testing.T) {
	ep, accepts, stop := acceptAndClose(t)
	sink := newRecSink()
	s, logs := startLogged(t, SubscriberConfig{
		Engines:      []EngineConfig{{Name: "x", Model: "m", Endpoint: ep}},
		ReconnectIvl: 10 * time.Millisecond, ReconnectIvlMax: 500 * time.Millisecond,
	}, sink)
	e := kvevents.EngineID{Pod: "x", Model: "m"}
	testutil.Await(t, waitTimeout, "three connection attempts", func() bool { return accepts.Load() >= 3 })

	// The rate over a window: libzmq alone reconnects every 10-20 ms
	// here, about a hundred times in the window; the backoff (10 ms
	// doubling to 500 ms) allows under ten. A loaded machine only lowers
	// the count.
	const window = 2 * time.Second
	before := accepts.Load()
	time.Sleep(window)
	if n := accepts.Load() - before; n > 25 {
		t.Errorf("%d connection attempts in %v, want a backoff (at most 25)", n, window)
	}
	if st, _ := streamOf(s, e); st.Connected {
		t.Error("a peer that never completed the ZMQ handshake counts as connected")
	}
	if got := logs.matching(`msg="zmqtransport: connected"`); len(got) != 0 {
		t.Errorf("%d connected lines for a peer that speaks no ZMQ: %q", len(got), got)
	}
	refused := logs.matching("connection closed before the ZMQ handshake", "endpoint="+ep, " count=", " retry_in=")
	if len(refused) < 3 {
		t.Errorf("%d lines about the refused connections, want one per attempt with its count: %q", len(refused), refused)
	}

	// A ZMQ publisher taking the port over is read at the next attempt.
	stop()
	pub := newTestPublisher(t, pubOptions{pubAt: ep, noReplay: true})
	waitReady(t, s, e)
	pub.waitSubscribed(1)
	pub.publishN(3, 0)
	sink.waitApplied(t, e, 2)
	sink.wantCalls(t, e, seqRange(0, 3))
}

// However often a peer refuses, the log stays short: the first few
// refusals, then one in a thousand, each line with the running count.
func TestSubscriberRefusalLogRateLimited(t *testing.T) {
	ep, accepts, stop := acceptAndClose(t)
	s, logs := startLogged(t, SubscriberConfig{
		Engines:      []EngineConfig{{Name: "x", Model: "m", Endpoint: ep}},
		ReconnectIvl: time.Millisecond, ReconnectIvlMax: time.Millisecond,
	}, newRecSink())
	testutil.Await(t, waitTimeout, "50 connection attempts", func() bool { return accepts.Load() >= 50 })
	s.Close()
	stop()
	n := accepts.Load()
	lines := logs.matching("endpoint=" + ep)
	if limit := 1 + 10 + int(n/1000) + 1; len(lines) > limit {
		t.Errorf("%d log lines for %d refused connections, want at most %d", len(lines), n, limit)
	}
	if counted := logs.matching("connection closed before the ZMQ handshake", " count="); len(counted) < 10 {
		t.Errorf("%d refusal lines with a count, want the first 10", len(counted))
	}
}
