package zmqtransport

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
)

// startTunedSubscriber starts a subscriber whose slot timings (slots.go)
// are set by the test: the constants are seconds, which a test need not
// wait.
func startTunedSubscriber(t testing.TB, cfg SubscriberConfig, sink kvevents.Sink, prove, displace time.Duration) *Subscriber {
	t.Helper()
	s, err := NewSubscriber(cfg, sink, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	s.proveWithin, s.displaceAfter = prove, displace
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// newTestIndex is a real index, whose verdicts (kvevents.VerdictSink)
// decide which streams prove themselves.
func newTestIndex(t testing.TB) *indexer.Index {
	t.Helper()
	h, err := blockhash.New(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	ix, err := indexer.New(indexer.Options{Hasher: h})
	if err != nil {
		t.Fatal(err)
	}
	return ix
}

// indexPods lists the pods the index knows.
func indexPods(ix *indexer.Index) []string {
	var pods []string
	for _, e := range ix.Engines() {
		pods = append(pods, e.Engine.Pod)
	}
	return pods
}

// junkPayload encodes a decodable batch the index accepts nothing of.
func junkPayload(t testing.TB, kind string, seq uint64) []byte {
	t.Helper()
	b := testBatch(seq, 0)
	switch kind {
	case "refused events":
		// 16 tokens for one block of 8: the index refuses it as malformed.
		b.Events[0].BlockSize = 8
	case "empty batches":
		b.Events = nil
	default:
		t.Fatalf("unknown junk %q", kind)
	}
	p, err := kvevents.AppendBatch(nil, b, kvevents.EncodeOptions{Shape: kvevents.ShapeArray})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestListenerUnprovenReleaseSlots: junk under invented topics (decodable
// batches the index refuses, or that carry nothing) fills every slot and
// is refused beyond; within the proving window the junk streams are
// dropped, their entries with them, and a real engine then gets a slot
// and keeps it.
func TestListenerUnprovenReleaseSlots(t *testing.T) {
	const maxEngines, topics = 3, 5
	for _, kind := range []string{"refused events", "empty batches"} {
		t.Run(kind, func(t *testing.T) {
			ix := newTestIndex(t)
			s := startTunedSubscriber(t, SubscriberConfig{
				Listen: "tcp://127.0.0.1:*", MaxEngines: maxEngines,
				EngineAllow: []AllowRule{allowRule("*=127.0.0.1")},
			}, ix, 300*time.Millisecond, time.Hour)
			ep := s.ListenEndpoint()
			junk := newTestPublisher(t, pubOptions{connect: fromAddr("127.0.0.1", ep), noReplay: true})
			junk.waitSubscribed(1)
			for i := range topics {
				junk.sendRaw([]byte(fmt.Sprintf("kv@junk-%d@m", i)), seqBytes(0), junkPayload(t, kind, 0))
			}
			testutil.Await(t, waitTimeout, "the junk refused at the cap", func() bool {
				return listenerStats(t, s).RefusedEngines == topics-maxEngines
			})
			if n := len(s.Streams()); n != maxEngines {
				t.Fatalf("%d streams, want the cap, %d", n, maxEngines)
			}
			testutil.Await(t, waitTimeout, "the junk streams dropped", func() bool {
				return len(s.Streams()) == 0
			})
			if ls := listenerStats(t, s); ls.UnprovenEngines != maxEngines || ls.DisplacedEngines != 0 {
				t.Fatalf("listener %+v; want %d unproven engines dropped, none displaced", ls, maxEngines)
			}
			if pods := indexPods(ix); len(pods) != 0 {
				t.Fatalf("the index still knows %v after the junk was dropped", pods)
			}

			// A real engine joins: its batches are accepted, so it keeps
			// its slot past the window, while junk sent after it goes.
			real := newTestPublisher(t, pubOptions{connect: fromAddr("127.0.0.1", ep), topic: "kv@real@m", noReplay: true})
			real.waitSubscribed(1)
			real.publishN(3, 0)
			e := kvevents.EngineID{Pod: "real", Model: "m"}
			testutil.Await(t, waitTimeout, "the real engine's batches applied", func() bool {
				st, ok := streamOf(s, e)
				return ok && st.LastSeq == 2
			})
			junk.sendRaw([]byte("kv@junk-late@m"), seqBytes(0), junkPayload(t, kind, 0))
			testutil.Await(t, waitTimeout, "the late junk dropped", func() bool {
				return listenerStats(t, s).UnprovenEngines == maxEngines+1
			})
			st := mustStream(t, s, e)
			if st.Health != kvevents.HealthOK || st.Resets != 0 {
				t.Fatalf("real engine %+v; want ok and never reset", st)
			}
			if got := indexPods(ix); !slices.Equal(got, []string{"real"}) {
				t.Fatalf("the index knows %v, want [real]", got)
			}
		})
	}
}

// TestListenerNamedEngineAtCap: with every slot taken by engines a glob
// admits, an engine whose pod an exact rule names, and one named by the
// address it speaks from, still get streams; a further glob-admitted
// engine, and the named pod under a second model, are refused.
func TestListenerNamedEngineAtCap(t *testing.T) {
	const maxEngines = 2
	sink := newRecSink()
	s := startTunedSubscriber(t, SubscriberConfig{
		Listen: "tcp://127.0.0.1:*", MaxEngines: maxEngines,
		EngineAllow: []AllowRule{allowRule("*=127.0.0.0/8"), allowRule("named=127.0.0.2")},
	}, sink, time.Hour, time.Hour)
	ep := s.ListenEndpoint()
	glob := newTestPublisher(t, pubOptions{connect: fromAddr("127.0.0.1", ep), noReplay: true})
	glob.waitSubscribed(1)
	for i := range maxEngines + 1 {
		glob.sendRaw([]byte(fmt.Sprintf("kv@glob-%d@m", i)), seqBytes(0), encodeTestBatch(t, 0, 0, kvevents.ShapeArray))
	}
	testutil.Await(t, waitTimeout, "the third glob engine refused", func() bool {
		return listenerStats(t, s).RefusedEngines == 1
	})

	for _, tt := range []struct {
		src, topic string
		id         kvevents.EngineID
	}{
		{"127.0.0.2", "kv@named@m", kvevents.EngineID{Pod: "named", Model: "m"}},
		{"127.0.0.3", "kv@127.0.0.3@m", kvevents.EngineID{Pod: "127.0.0.3", Model: "m"}},
	} {
		p := newTestPublisher(t, pubOptions{connect: fromAddr(tt.src, ep), topic: tt.topic, noReplay: true})
		p.waitSubscribed(1)
		p.publishN(2, 0)
		sink.waitApplied(t, tt.id, 1)
	}

	// The named pod under another model takes a slot, and there is none.
	other := newTestPublisher(t, pubOptions{connect: fromAddr("127.0.0.2", ep), topic: "kv@named@m2", noReplay: true})
	other.waitSubscribed(1)
	other.publishN(1, 0)
	testutil.Await(t, waitTimeout, "the named pod's second model refused", func() bool {
		return listenerStats(t, s).RefusedEngines == 2
	})
	var pods []string
	for _, st := range s.Streams() {
		pods = append(pods, st.Engine.String())
	}
	want := []string{"127.0.0.3", "glob-0", "glob-1", "named"}
	if !slices.Equal(pods, want) {
		t.Fatalf("streams %v, want %v", pods, want)
	}
}

// TestListenerDisplacesSilent: at the cap, a newcomer admitted by a glob
// takes the slot of the glob-admitted engine heard least recently once
// that one has been silent for the displacement time; the displaced
// engine's entries are dropped (reset as removed), the other keeps its
// slot.
func TestListenerDisplacesSilent(t *testing.T) {
	sink := newRecSink()
	s := startTunedSubscriber(t, SubscriberConfig{
		Listen: "tcp://127.0.0.1:*", MaxEngines: 2,
		EngineAllow: []AllowRule{allowRule("*=127.0.0.1")},
	}, sink, time.Hour, 200*time.Millisecond)
	p := newTestPublisher(t, pubOptions{connect: fromAddr("127.0.0.1", s.ListenEndpoint()), noReplay: true})
	p.waitSubscribed(1)
	id := func(i int) kvevents.EngineID { return kvevents.EngineID{Pod: fmt.Sprint("pod-", i), Model: "m"} }
	send := func(i int, seq uint64) {
		p.sendRaw([]byte(fmt.Sprintf("kv@pod-%d@m", i)), seqBytes(seq), encodeTestBatch(t, seq, 0, kvevents.ShapeArray))
	}
	send(0, 0)
	send(1, 0)
	send(1, 1) // pod-1 heard last
	sink.waitApplied(t, id(1), 1)
	// pod-2 is refused until pod-0 has been silent long enough.
	seq := uint64(0)
	testutil.Await(t, waitTimeout, "pod-2 admitted", func() bool {
		send(2, seq)
		seq++
		_, ok := streamOf(s, id(2))
		return ok
	})
	testutil.Await(t, waitTimeout, "pod-0 displaced", func() bool {
		_, ok := streamOf(s, id(0))
		return !ok
	})
	sink.wantCalls(t, id(0), []string{"0", "reset:removed"})
	if _, ok := streamOf(s, id(1)); !ok {
		t.Fatal("pod-1, heard after pod-0, lost its slot")
	}
	if ls := listenerStats(t, s); ls.DisplacedEngines != 1 || ls.UnprovenEngines != 0 {
		t.Fatalf("listener %+v; want 1 displaced engine", ls)
	}
}
