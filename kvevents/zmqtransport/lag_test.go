package zmqtransport_test

import (
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/enginesim/simzmq"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// A stream reports the engine's stamp of its last applied batch and how
// long after that stamp it was applied, by each side's own clock: fixed
// clocks here, so the lag is exact whatever the machine's speed.
func TestStreamLag(t *testing.T) {
	h, err := blockhash.New(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	engineClock := time.Unix(1_700_000_000, 250_000_000)
	tests := []struct {
		name string
		skew time.Duration // kvindex's clock minus the engine's
	}{
		{"behind", 30 * time.Second},
		{"engine clock ahead", -12 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eng, err := simzmq.New(enginesim.Config{Pod: "p", Model: "m", Hasher: h, CapacityBlocks: 64, Now: func() time.Time { return engineClock }},
				zmqtransport.PublisherConfig{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { eng.Close() })
			cfg := zmqtransport.SubscriberConfig{
				Engines: []zmqtransport.EngineConfig{{Name: "p", Model: "m", Endpoint: eng.PubEndpoint()}},
				Now:     func() time.Time { return engineClock.Add(tt.skew) },
			}
			sink := newMirrorSink()
			s, err := zmqtransport.NewSubscriber(cfg, sink, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			e := eng.EngineID()
			before, _ := streamStats(s, e)
			if before.LastBatchStampUnixNano != 0 || before.LastBatchLag != 0 {
				t.Errorf("before any batch: stamp %d, lag %v; want neither", before.LastBatchStampUnixNano, before.LastBatchLag)
			}
			// The PUB socket gives no sign of the subscription: send
			// until a batch is applied.
			tokens := 0
			testutil.Await(t, awaitBound, "a batch applied", func() bool {
				tokens++
				if _, err := eng.Process(testutil.Seq(tokens*1000, 32), nil); err != nil {
					t.Fatal(err)
				}
				st, _ := streamStats(s, e)
				return st.Batches > 0
			})
			st, _ := streamStats(s, e)
			if d := st.LastBatchStampUnixNano - engineClock.UnixNano(); d < -1000 || d > 1000 {
				t.Errorf("stamp = %v, want %v", time.Unix(0, st.LastBatchStampUnixNano), engineClock)
			}
			if d := st.LastBatchLag - tt.skew; d < -time.Microsecond || d > time.Microsecond {
				t.Errorf("lag = %v, want %v", st.LastBatchLag, tt.skew)
			}
		})
	}
}
