package natstransport_test

import (
	"math"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/natstransport"
)

// A replica reports, per engine, how long after the engine stamped its
// last batch it applied it: here an engine whose clock runs 30 s behind,
// so the lag is 30 s give or take the record's trip through NATS, which
// the tolerance dwarfs.
func TestReplicaReportsLag(t *testing.T) {
	const behind = 30 * time.Second
	const tolerance = 10 * time.Second
	ns := startNATS(t)
	_, js := connect(t, ns.url())
	ensureStream(t, js)
	id := kvevents.EngineID{Model: testModel, Pod: "vllm-0.pod"}
	var made []batch
	e, err := enginesim.New(enginesim.Config{
		Pod: id.Pod, Model: id.Model, Hasher: blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 16}),
		CapacityBlocks: 96, Publisher: &collector{id: id, out: &made},
		Now: func() time.Time { return time.Now().Add(-behind) },
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := e.Process(testutil.Seq(1000*i, 32), nil); err != nil {
			t.Fatal(err)
		}
	}
	relay := startRelay(t, js, natstransport.RelayConfig{})
	feed(relay, made)
	awaitPublished(t, relay, uint64(len(made)))
	r := startReplica(t, js, natstransport.ConsumerConfig{}, nil)
	var st kvevents.StreamStats
	testutil.Await(t, awaitBound, "the replica applied every batch", func() bool {
		for _, st = range r.c.Streams() {
			if st.Engine == id && st.Batches == uint64(len(made)) {
				return true
			}
		}
		return false
	})
	if st.LastBatchStampUnixNano == 0 {
		t.Fatal("no stamp recorded")
	}
	if d := st.LastBatchLag - behind; math.Abs(d.Seconds()) > tolerance.Seconds() {
		t.Errorf("lag %v, want %v ± %v", st.LastBatchLag, behind, tolerance)
	}
}
