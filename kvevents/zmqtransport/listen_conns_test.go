package zmqtransport

import (
	"fmt"
	"testing"

	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
)

// TestListenerConnectionCap: the listen socket's receive queues (one per
// connection) are bounded by bounding the connections. With MaxEngines 3
// and a glob rule, three glob-admitted peers connect; the next two are
// refused at the handshake and counted. A named engine (exact rule, single
// address) still connects and is followed at the cap, and so does a second
// connection from its address (namedConnsPerRank), but not a third. When a
// glob peer leaves, a newcomer takes its place. Rows: the glob peers from
// one source address (counted per address, many connections each) or each
// from its own.
func TestListenerConnectionCap(t *testing.T) {
	const maxEngines, extra = 3, 2
	for _, tt := range []struct {
		name string
		src  func(i int) string // the source address of glob peer i
	}{
		{"one source address", func(int) string { return "127.0.0.2" }},
		{"a source address each", func(i int) string { return fmt.Sprintf("127.0.0.%d", 10+i) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sink := newRecSink()
			s := startSubscriber(t, SubscriberConfig{
				Listen:      "tcp://127.0.0.1:*",
				MaxEngines:  maxEngines,
				EngineAllow: []AllowRule{allowRule("named=127.0.0.9"), allowRule("*=127.0.0.0/8")},
			}, sink)
			ep := s.ListenEndpoint()
			glob := func(i int) *testPublisher {
				return newTestPublisher(t, pubOptions{connect: fromAddr(tt.src(i), ep), topic: fmt.Sprintf("kv@glob-%d@m", i), noReplay: true})
			}
			// A refused peer may be refused more than once: libzmq retries
			// a peer that saw its connection close before the refusal
			// arrived. So refusals are counted at least, peers exactly.
			awaitRefused := func(want uint64, peers int64) {
				t.Helper()
				testutil.Await(t, waitTimeout, fmt.Sprintf("%d connections refused, %d peers", want, peers), func() bool {
					ls := listenerStats(t, s)
					return ls.RefusedConnections >= want && ls.Peers == peers
				})
			}

			var admitted []*testPublisher
			for i := range maxEngines {
				p := glob(i)
				p.waitSubscribed(1) // admitted: the subscription reached it
				admitted = append(admitted, p)
			}
			var refused []*testPublisher
			for i := range extra {
				refused = append(refused, glob(maxEngines+i))
			}
			awaitRefused(extra, maxEngines)
			if ls := listenerStats(t, s); ls.RefusedHandshakes != 0 {
				t.Fatalf("listener %+v: the cap's refusals counted as unnamed sources", ls)
			}

			// The named engine is admitted at the cap, and followed.
			named := newTestPublisher(t, pubOptions{connect: fromAddr("127.0.0.9", ep), topic: "kv@named@m", noReplay: true})
			named.waitSubscribed(1)
			named.publishN(3, 0)
			sink.waitApplied(t, kvevents.EngineID{Pod: "named", Model: "m"}, 2)
			// Its address has one more connection beyond the cap, not two.
			second := newTestPublisher(t, pubOptions{connect: fromAddr("127.0.0.9", ep), topic: "kv@named@m", noReplay: true})
			second.waitSubscribed(1)
			refused = append(refused, newTestPublisher(t, pubOptions{connect: fromAddr("127.0.0.9", ep), topic: "kv@named@m", noReplay: true}))
			awaitRefused(extra+1, maxEngines+2)

			// A glob peer leaves; a newcomer takes its place. The refused
			// peers go first: one that saw its connection close before the
			// refusal arrived retries, and could take the freed place.
			for _, p := range refused {
				p.Close()
			}
			admitted[0].Close()
			testutil.Await(t, waitTimeout, "the peer's departure seen", func() bool { return listenerStats(t, s).Peers == maxEngines+1 })
			glob(maxEngines + extra).waitSubscribed(1)
			if ls := listenerStats(t, s); ls.RefusedConnections < extra+1 || ls.Peers != maxEngines+2 {
				t.Fatalf("listener %+v; want at least %d refused connections and %d peers", ls, extra+1, maxEngines+2)
			}
		})
	}
}
