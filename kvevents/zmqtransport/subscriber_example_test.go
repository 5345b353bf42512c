package zmqtransport_test

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/enginesim/simzmq"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// printSink prints what it is given and reports each applied seq.
type printSink struct{ applied chan uint64 }

func (p printSink) Apply(e kvevents.EngineID, seq uint64, events []kvevents.Event) {
	for _, ev := range events {
		fmt.Printf("%s seq %d: %s of %d blocks\n", e, seq, ev.Kind, len(ev.Hashes))
	}
	p.applied <- seq
}

func (p printSink) Reset(e kvevents.EngineID, reason kvevents.ResetReason) {
	fmt.Printf("%s reset: %s\n", e, reason)
}

// A subscriber joining an engine that has already published recovers the
// engine's replay buffer as soon as it connects.
func ExampleSubscriber() {
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 16})
	eng, err := simzmq.New(enginesim.Config{
		Pod: "pod-a", Model: "llama", Hasher: h, CapacityBlocks: 64,
	}, zmqtransport.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer eng.Close()
	prompt := make([]uint64, 64) // four blocks
	for i := range prompt {
		prompt[i] = uint64(i)
	}
	// Before the subscriber exists: 4 blocks stored, then a prefix hit
	// (no event), then 2 cached blocks and 1 new one.
	eng.Process(prompt, nil)
	eng.Process(prompt[:48], nil)
	eng.Process(append(prompt[:32:32], 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7), nil)

	sink := printSink{applied: make(chan uint64, 16)}
	s, err := zmqtransport.NewSubscriber(zmqtransport.SubscriberConfig{
		Engines: []zmqtransport.EngineConfig{{
			Name: "pod-a", Model: "llama", Endpoint: eng.PubEndpoint(), ReplayEndpoint: eng.ReplayEndpoint(),
		}},
	}, sink, slog.New(slog.DiscardHandler))
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := s.Start(); err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	for seq := uint64(0); seq < 2; {
		select {
		case seq = <-sink.applied:
			seq++
		case <-time.After(10 * time.Second):
			fmt.Println("timed out")
			return
		}
	}
	st := s.Streams()[0]
	fmt.Printf("%s: %d batches, %d events, last seq %d\n", st.Engine, st.Batches, st.Events, st.LastSeq)
	// Output:
	// pod-a seq 0: BlockStored of 4 blocks
	// pod-a seq 1: BlockStored of 1 blocks
	// pod-a: 2 batches, 2 events, last seq 1
}
