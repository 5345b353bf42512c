package zmqtransport_test

import (
	"encoding/binary"
	"iter"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvindex/kvindex/internal/testutil/zmqtest"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// sliceSource is a ReplaySource over a fixed list of batches.
type sliceSource []zmqtest.Replayed

func (s sliceSource) Buffered(from uint64) iter.Seq2[uint64, []byte] {
	return func(yield func(uint64, []byte) bool) {
		for _, r := range s {
			if r.Seq >= from && !yield(r.Seq, r.Payload) {
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
	d := zmqtest.Dealer(t, p.ReplayEndpoint())
	var sb [8]byte
	binary.BigEndian.PutUint64(sb[:], 1)
	if _, err := d.SendMessage("", sb[:]); err != nil {
		t.Fatal(err)
	}
	if err := p.ServeReplay(sliceSource{{Seq: 0, Payload: []byte("p0")}, {Seq: 1, Payload: []byte("p1")}, {Seq: 2, Payload: []byte("p2")}}); err != nil {
		t.Fatal(err)
	}
	got := zmqtest.ReadReplay(t, d, "t", true)
	if len(got) != 2 || got[0].Seq != 1 || string(got[0].Payload) != "p1" || got[1].Seq != 2 || string(got[1].Payload) != "p2" {
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

// TestPublisherConnect: with Connect the PUB socket dials a bound SUB (the
// bind-mode deployment) and its batches arrive there, framed as usual.
func TestPublisherConnect(t *testing.T) {
	ctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	sub, err := ctx.NewSocket(zmq.SUB)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close(); ctx.Term() })
	for _, err := range []error{sub.SetLinger(0), sub.SetRcvtimeo(10 * time.Millisecond), sub.SetSubscribe(""), sub.Bind("tcp://127.0.0.1:*")} {
		if err != nil {
			t.Fatal(err)
		}
	}
	ep, err := sub.GetLastEndpoint()
	if err != nil {
		t.Fatal(err)
	}
	p, err := zmqtransport.NewPublisher(zmqtransport.PublisherConfig{Endpoint: ep, Connect: true, Topic: "kv@pod-a@m"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Endpoint() != ep {
		t.Errorf("Endpoint() = %q, want %q", p.Endpoint(), ep)
	}
	// A PUB drops what it sends before the subscription reaches it, so
	// publish until a batch arrives.
	deadline := time.Now().Add(zmqtest.RecvTimeout)
	for seq := uint64(0); ; seq++ {
		if err := p.Publish(seq, []byte("payload")); err != nil {
			t.Fatal(err)
		}
		msg, err := sub.RecvMessageBytes(0)
		if err == nil {
			if len(msg) != 3 || string(msg[0]) != "kv@pod-a@m" || len(msg[1]) != 8 || string(msg[2]) != "payload" {
				t.Fatalf("received %q", msg)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no batch arrived at the bound SUB")
		}
	}

	if _, err := zmqtransport.NewPublisher(zmqtransport.PublisherConfig{Connect: true}); err == nil {
		t.Error("Connect without an Endpoint was accepted")
	}
}
