package zmqtransport

import (
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
)

// fromAddr returns a connect endpoint to the listen endpoint ep whose
// connection starts at source address src (zmq_connect's
// "tcp://SOURCE;DESTINATION" form): the loopback network 127/8 gives a
// test many source addresses on one host.
func fromAddr(src, ep string) string {
	return "tcp://" + src + ":0;" + strings.TrimPrefix(ep, "tcp://")
}

// listenerStats returns s's listener counters, failing without a listener.
func listenerStats(t testing.TB, s *Subscriber) kvevents.ListenerStats {
	t.Helper()
	ls, ok := s.ListenerStats()
	if !ok {
		t.Fatal("no listener")
	}
	return ls
}

// TestListenerRefusesImpersonation: an engine allowed for pod-b that
// claims pod-a's topic, with seq 0 and blocks of its own, changes nothing
// of pod-a's and is counted; an address no rule names is refused at the
// handshake. The control row shows the same attack succeed without rules.
func TestListenerRefusesImpersonation(t *testing.T) {
	for _, tt := range []struct {
		name  string
		rules []AllowRule
	}{
		{"allow rules", []AllowRule{allowRule("pod-a=127.0.0.1"), allowRule("pod-b=127.0.0.2")}},
		{"no rules", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sink := newRecSink()
			s := startSubscriber(t, SubscriberConfig{Listen: "tcp://127.0.0.1:*", EngineAllow: tt.rules}, sink)
			ep := s.ListenEndpoint()
			podA := kvevents.EngineID{Pod: "pod-a", Model: "m"}
			podB := kvevents.EngineID{Pod: "pod-b", Model: "m"}

			legit := newTestPublisher(t, pubOptions{connect: fromAddr("127.0.0.1", ep), topic: "kv@pod-a@m", noReplay: true})
			legit.waitSubscribed(1)
			legit.publishN(5, 0)
			sink.waitApplied(t, podA, 4)

			attacker := newTestPublisher(t, pubOptions{connect: fromAddr("127.0.0.2", ep), noReplay: true})
			attacker.waitSubscribed(1) // its address passed the handshake (pod-b's)
			attacker.sendRaw([]byte("kv@pod-a@m"), seqBytes(0), encodeTestBatch(t, 666, 0, kvevents.ShapeArray))
			attacker.sendRaw([]byte("kv@pod-b@m"), seqBytes(0), encodeTestBatch(t, 0, 0, kvevents.ShapeArray))
			sink.waitApplied(t, podB, 0) // its own pod's message was taken: the one before it was read

			legit.publishN(10, 0)
			sink.waitApplied(t, podA, 9)
			ls := listenerStats(t, s)
			if tt.rules == nil {
				// The attack as it works without rules: pod-a was reset
				// and took the attacker's batch.
				if !slices.ContainsFunc(sink.entries(podA), func(e sinkEntry) bool { return e.reset == kvevents.ResetRestart }) || ls.RefusedSources != 0 {
					t.Fatalf("without rules pod-a got %v, listener %+v; want the impersonation to reset it", sink.entries(podA), ls)
				}
				return
			}
			sink.wantCalls(t, podA, seqRange(0, 10))
			sink.checkHashes(t, podA)
			st := mustStream(t, s, podA)
			if st.Restarts != 0 || st.Resets != 0 || st.Health != kvevents.HealthOK && st.Health != kvevents.HealthUnconfirmed {
				t.Fatalf("pod-a stats %+v; want untouched by the impersonation", st)
			}
			if ls.RefusedSources != 1 || ls.RefusedHandshakes != 0 {
				t.Fatalf("listener %+v; want 1 refused source, no refused handshake", ls)
			}

			// An address no rule names does not get past the handshake.
			outsider := newTestPublisher(t, pubOptions{connect: fromAddr("127.0.0.3", ep), topic: "kv@pod-c@m", noReplay: true})
			testutil.Await(t, waitTimeout, "the outsider refused at the handshake", func() bool { return listenerStats(t, s).RefusedHandshakes >= 1 })
			outsider.publishN(3, 0)
			legit.publishN(11, 0)
			sink.waitApplied(t, podA, 10)
			if _, ok := streamOf(s, kvevents.EngineID{Pod: "pod-c", Model: "m"}); ok {
				t.Fatal("the refused outsider has a stream")
			}
			if ls := listenerStats(t, s); ls.RefusedSources != 1 {
				t.Fatalf("listener %+v; the outsider's messages reached the listener", ls)
			}
		})
	}
}

// decoy listens on a TCP address and counts the connections it accepts:
// a stand-in for a host kvindex must never dial.
func decoy(t *testing.T, addr string) (port int, accepted *atomic.Int64, first <-chan struct{}) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	accepted = new(atomic.Int64)
	ch := make(chan struct{})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			if accepted.Add(1) == 1 {
				close(ch)
			}
			c.Close()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port, accepted, ch
}

// TestListenerReplayForgery: a topic naming another host (kv@127.0.0.3@m)
// never makes kvindex dial it once the replay template dials {addr}; the
// control row shows a {pod} template doing so.
func TestListenerReplayForgery(t *testing.T) {
	for _, tt := range []struct {
		name     string
		host     string // the replay template's host
		rules    []AllowRule
		wantDial bool
	}{
		{"allow rules and {addr}", "{addr}", []AllowRule{allowRule("*=127.0.0.1")}, false},
		{"{addr} without rules", "{addr}", nil, false},
		{"{pod} without rules", "{pod}", nil, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// The decoy takes port P on 127.0.0.3; the engine replays on
			// P at its own address, 127.0.0.1.
			p, accepted, dialed := decoy(t, "127.0.0.3:0")
			port := strconv.Itoa(p)
			sink := newRecSink()
			s := startSubscriber(t, SubscriberConfig{
				Listen: "tcp://127.0.0.1:*", EngineAllow: tt.rules,
				ReplayTemplate: "tcp://" + tt.host + ":" + port,
			}, sink)
			legit := newTestPublisher(t, pubOptions{
				connect: fromAddr("127.0.0.1", s.ListenEndpoint()), topic: "kv@pod-x@m",
				replayAt: "tcp://127.0.0.1:" + port,
			})
			legit.waitSubscribed(1)
			forged := kvevents.EngineID{Pod: "127.0.0.3", Model: "m"}
			legit.sendRaw([]byte("kv@127.0.0.3@m"), seqBytes(0), encodeTestBatch(t, 0, 0, kvevents.ShapeArray))
			if tt.wantDial {
				select {
				case <-dialed:
					return
				case <-time.After(waitTimeout):
					t.Fatal("the {pod} template never dialed the topic's host: the test cannot see a forgery")
				}
			}
			legit.dropLive(1) // a gap, replayed from the engine's address
			legit.publishN(3, 0)
			podX := kvevents.EngineID{Pod: "pod-x", Model: "m"}
			sink.waitApplied(t, podX, 2)
			sink.wantCalls(t, podX, seqRange(0, 3))
			if st := mustStream(t, s, podX); st.ReplaysOK != 1 || st.ReplayEndpoint != "tcp://127.0.0.1:"+port {
				t.Fatalf("pod-x stats %+v; want its gap replayed from tcp://127.0.0.1:%s", st, port)
			}
			if tt.rules != nil {
				if ls := listenerStats(t, s); ls.RefusedSources != 1 {
					t.Fatalf("listener %+v; want the forged topic refused", ls)
				}
				if _, ok := streamOf(s, forged); ok {
					t.Fatal("the forged topic has a stream")
				}
			} else {
				// Accepted as a pod, but its replay goes to where its
				// events came from.
				legit.sendRaw([]byte("kv@127.0.0.3@m"), seqBytes(2), encodeTestBatch(t, 2, 0, kvevents.ShapeArray))
				testutil.Await(t, waitTimeout, "the forged pod's replay request", func() bool { return legit.replays.Load() >= 2 })
				if got, want := mustStream(t, s, forged).ReplayEndpoint, "tcp://127.0.0.1:"+port; got != want {
					t.Fatalf("forged pod replays at %q, want %q", got, want)
				}
			}
			if n := accepted.Load(); n != 0 {
				t.Fatalf("kvindex dialed the topic's host %d times", n)
			}
		})
	}
}

// SetEngineAllow changes the rules of a running listener: with
// EngineAllowDynamic and no rules an engine connects but its messages are
// refused; once a rule names its pod, its messages on the same connection
// are taken (libzmq would not retry a connection refused at the
// handshake); once the rules drop it again, they are refused.
func TestSetEngineAllow(t *testing.T) {
	sink := newRecSink()
	s := startSubscriber(t, SubscriberConfig{Listen: "tcp://127.0.0.1:*", EngineAllowDynamic: true}, sink)
	ep := s.ListenEndpoint()
	podA := kvevents.EngineID{Pod: "pod-a", Model: "m"}

	pub := newTestPublisher(t, pubOptions{connect: fromAddr("127.0.0.1", ep), topic: "kv@pod-a@m", noReplay: true})
	pub.waitSubscribed(1)
	pub.publishN(3, 0)
	testutil.Await(t, waitTimeout, "refused by source without rules", func() bool { return listenerStats(t, s).RefusedSources >= 3 })
	if _, ok := streamOf(s, podA); ok {
		t.Fatal("pod-a has a stream without a rule")
	}

	if err := s.SetEngineAllow([]AllowRule{allowRule("pod-a=127.0.0.1")}); err != nil {
		t.Fatal(err)
	}
	pub.publishN(8, 0)
	sink.waitApplied(t, podA, 7)

	// pod-b's rule only: pod-a's next batches are refused by source.
	if err := s.SetEngineAllow([]AllowRule{allowRule("pod-b=127.0.0.1")}); err != nil {
		t.Fatal(err)
	}
	before := listenerStats(t, s).RefusedSources
	pub.publishN(11, 0)
	testutil.Await(t, waitTimeout, "pod-a's batches refused", func() bool { return listenerStats(t, s).RefusedSources >= before+3 })
	if a := sink.applied(podA); len(a) == 0 || a[len(a)-1] != 7 {
		t.Errorf("pod-a applied %v; want nothing past seq 7 once its rule is gone", a)
	}
	if ls := listenerStats(t, s); ls.RefusedHandshakes != 0 {
		t.Errorf("listener %+v: dynamic rules refused a handshake", ls)
	}

	if err := s.SetEngineAllow([]AllowRule{{Pod: "x"}}); err == nil {
		t.Error("a rule without a network: no error")
	}
}

// A subscriber built without rules cannot take them later: its listen
// socket has no handshake check.
func TestSetEngineAllowWithoutRules(t *testing.T) {
	s := startSubscriber(t, SubscriberConfig{Listen: "tcp://127.0.0.1:*"}, newRecSink())
	if err := s.SetEngineAllow([]AllowRule{allowRule("pod-a=127.0.0.1")}); err == nil {
		t.Error("no error")
	}
}
