package zmqtransport_test

import (
	"encoding/binary"
	"iter"
	"testing"

	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// sliceSource is a ReplaySource over a fixed list of batches.
type sliceSource []replayed

func (s sliceSource) Buffered(from uint64) iter.Seq2[uint64, []byte] {
	return func(yield func(uint64, []byte) bool) {
		for _, r := range s {
			if r.seq >= from && !yield(r.seq, r.payload) {
				return
			}
		}
	}
}

// TestPublisherReplayWaitsForSource: a request that reaches the ROUTER
// before ServeReplay is answered once it is called, from its source.
func TestPublisherReplayWaitsForSource(t *testing.T) {
	p, err := zmqtransport.NewPublisher(zmqtransport.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*", Topic: "t", ReplayWithTopic: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	d := dealerAt(t, p.ReplayEndpoint())
	var sb [8]byte
	binary.BigEndian.PutUint64(sb[:], 1)
	if _, err := d.SendMessage("", sb[:]); err != nil {
		t.Fatal(err)
	}
	if err := p.ServeReplay(sliceSource{{0, []byte("p0")}, {1, []byte("p1")}, {2, []byte("p2")}}); err != nil {
		t.Fatal(err)
	}
	got := readReplay(t, d, "t", true)
	if len(got) != 2 || got[0].seq != 1 || string(got[0].payload) != "p1" || got[1].seq != 2 || string(got[1].payload) != "p2" {
		t.Fatalf("replay from 1: %v", got)
	}
	if err := p.ServeReplay(sliceSource{}); err == nil {
		t.Fatal("a second ServeReplay succeeded")
	}
}

// TestPublisherLifecycle: Publish works until Close and fails after it;
// Close is idempotent; ServeReplay without a replay socket does nothing.
func TestPublisherLifecycle(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   zmqtransport.PublisherConfig
		serve bool
	}{
		{"no replay", zmqtransport.PublisherConfig{}, true},
		{"replay, never served", zmqtransport.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"}, false},
		{"replay, served", zmqtransport.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := zmqtransport.NewPublisher(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if (p.ReplayEndpoint() != "") != (tc.cfg.ReplayEndpoint != "") || p.Endpoint() == "" {
				t.Fatalf("endpoints %q, %q", p.Endpoint(), p.ReplayEndpoint())
			}
			if tc.serve {
				if err := p.ServeReplay(sliceSource{}); err != nil {
					t.Fatal(err)
				}
			}
			if err := p.Publish(0, []byte("x")); err != nil {
				t.Fatal(err)
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			if err := p.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			if err := p.Publish(1, []byte("x")); err == nil {
				t.Fatal("Publish after Close succeeded")
			}
			if err := p.ServeReplay(sliceSource{}); err == nil {
				t.Fatal("ServeReplay after Close succeeded")
			}
		})
	}
}
