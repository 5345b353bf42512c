package zmqtransport_test

import (
	"bytes"
	"log/slog"
	"testing"
	"time"

	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// payloadSink records each payload it is handed, and the events beside it.
type payloadSink struct {
	got chan []byte
}

func (p payloadSink) Apply(kvevents.EngineID, uint64, []kvevents.Event) {
	panic("Apply called on a PayloadSink")
}

func (p payloadSink) Reset(kvevents.EngineID, kvevents.ResetReason) {}

func (p payloadSink) ApplyPayload(_ kvevents.EngineID, _ uint64, payload []byte, events []kvevents.Event) {
	if len(events) != 1 || events[0].Kind != kvevents.BlockStored {
		payload = nil // the test sees a mismatch
	}
	p.got <- bytes.Clone(payload)
}

// A Sink that wants payloads gets every batch's bytes exactly as the
// engine sent them, instead of Apply.
func TestPayloadSinkGetsPayloadUnchanged(t *testing.T) {
	pub, err := zmqtransport.NewPublisher(zmqtransport.PublisherConfig{Endpoint: "tcp://127.0.0.1:*"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	var payloads [][]byte
	for i := range 3 {
		b := kvevents.Batch{TS: float64(i), Events: []kvevents.Event{{
			Kind: kvevents.BlockStored, Hashes: []uint64{uint64(100 + i)}, BlockSize: 16,
			TokenIDs: make([]uint64, 16),
		}}}
		p, err := kvevents.AppendBatch(nil, &b, kvevents.EncodeOptions{Shape: kvevents.ShapeArray})
		if err != nil {
			t.Fatal(err)
		}
		payloads = append(payloads, p)
	}
	sink := payloadSink{got: make(chan []byte, len(payloads))}
	s, err := zmqtransport.NewSubscriber(zmqtransport.SubscriberConfig{
		Engines: []zmqtransport.EngineConfig{{Name: "pod-a", Model: "m", Endpoint: pub.Endpoint()}},
	}, sink, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// PUB drops what it sends before the subscription arrives: publish
	// seq 0 until the first batch is delivered, then the rest.
	first := false
	for !first {
		if err := pub.Publish(0, payloads[0]); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-sink.got:
			if !bytes.Equal(got, payloads[0]) {
				t.Fatalf("payload 0: got %x, want %x", got, payloads[0])
			}
			first = true
		case <-time.After(50 * time.Millisecond):
		}
	}
	for seq := 1; seq < len(payloads); seq++ {
		if err := pub.Publish(uint64(seq), payloads[seq]); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-sink.got:
			if !bytes.Equal(got, payloads[seq]) {
				t.Fatalf("payload %d: got %x, want %x", seq, got, payloads[seq])
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("batch %d not delivered", seq)
		}
	}
}
