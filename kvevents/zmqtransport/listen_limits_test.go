package zmqtransport

import (
	"fmt"
	"testing"

	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
)

// TestListenerMaxEngines floods a listen socket with more engines (topics)
// than MaxEngines allows: the first three get streams, the others are
// refused and counted once each, however many messages they send, until
// removing a pod makes room.
func TestListenerMaxEngines(t *testing.T) {
	sink := newRecSink()
	s := startSubscriber(t, SubscriberConfig{Listen: "tcp://127.0.0.1:*", MaxEngines: 3}, sink)
	p := newTestPublisher(t, pubOptions{connect: s.ListenEndpoint(), noReplay: true})
	p.waitSubscribed(1)
	id := func(i int) kvevents.EngineID { return kvevents.EngineID{Pod: fmt.Sprint("pod-", i), Model: "m"} }
	send := func(i int, seq uint64) {
		p.sendRaw([]byte(fmt.Sprintf("kv@pod-%d@m", i)), seqBytes(seq), encodeTestBatch(t, seq, 0, kvevents.ShapeArray))
	}
	for seq := range uint64(2) {
		for i := range 5 {
			send(i, seq)
		}
	}
	// Messages are handled in order: once pod-4's second message was
	// counted, everything before it was handled.
	testutil.Await(t, waitTimeout, "10 messages", func() bool {
		ls, _ := s.ListenerStats()
		return ls.Messages == 10
	})
	for i := range 3 {
		sink.wantCalls(t, id(i), []string{"0", "1"})
	}
	if got := len(s.Streams()); got != 3 {
		t.Fatalf("%d streams, want 3: %+v", got, s.Streams())
	}
	ls, _ := s.ListenerStats()
	if ls.RefusedEngines != 2 {
		t.Fatalf("listener stats %+v; want 2 refused engines", ls)
	}
	for _, i := range []int{3, 4} {
		if calls := sink.entries(id(i)); len(calls) != 0 {
			t.Fatalf("refused %s reached the sink: %v", id(i), calls)
		}
	}

	// Removing a pod frees a stream for a refused engine.
	if !s.RemoveEngine("pod-0") {
		t.Fatal("pod-0 not removed")
	}
	send(3, 2)
	sink.waitApplied(t, id(3), 2)
	send(4, 2)
	testutil.Await(t, waitTimeout, "12 messages", func() bool {
		ls, _ := s.ListenerStats()
		return ls.Messages == 12
	})
	if got := len(s.Streams()); got != 3 {
		t.Fatalf("%d streams, want 3: %+v", got, s.Streams())
	}
	if ls, _ := s.ListenerStats(); ls.RefusedEngines != 2 {
		t.Fatalf("listener stats %+v; want still 2 refused engines (pod-4 counted once)", ls)
	}
	if calls := sink.entries(id(4)); len(calls) != 0 {
		t.Fatalf("refused %s reached the sink: %v", id(4), calls)
	}
}
