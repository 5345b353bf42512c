// Package zmqtest holds the ZMQ test helpers that several test packages
// share: a replay client, as a consumer of vLLM's replay socket speaks it.
package zmqtest

import (
	"encoding/binary"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// RecvTimeout bounds every receive, so a missing message fails the test
// instead of hanging it.
const RecvTimeout = 10 * time.Second

// Replayed is one batch received over replay.
type Replayed struct {
	Seq     uint64
	Payload []byte
}

// Dealer connects a DEALER, on its own context, to a replay endpoint; it
// is closed when the test ends.
func Dealer(t testing.TB, endpoint string) *zmq.Socket {
	t.Helper()
	ctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	d, err := ctx.NewSocket(zmq.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{d.SetLinger(0), d.SetRcvtimeo(RecvTimeout), d.Connect(endpoint)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { d.Close(); ctx.Term() })
	return d
}

// Request asks for every batch from start.
func Request(t testing.TB, d *zmq.Socket, start uint64) {
	t.Helper()
	var sb [8]byte
	binary.BigEndian.PutUint64(sb[:], start)
	if _, err := d.SendMessage("", sb[:]); err != nil {
		t.Fatal(err)
	}
}

// ReadReplay reads one replay answer up to its end marker, checking the
// reply layout: with withTopic, each reply carries topic (the end marker an
// empty one).
func ReadReplay(t testing.TB, d *zmq.Socket, topic string, withTopic bool) []Replayed {
	t.Helper()
	var out []Replayed
	for {
		f, err := d.RecvMessageBytes(0)
		if err != nil {
			t.Fatalf("replay receive: %v", err)
		}
		if len(f) == 0 || len(f[0]) != 0 {
			t.Fatalf("reply without the empty delimiter: %x", f)
		}
		f = f[1:]
		if withTopic {
			if len(f) != 3 {
				t.Fatalf("reply of %d frames after the delimiter, want 3 (topic layout): %x", len(f), f)
			}
			end := len(f[1]) == 8 && binary.BigEndian.Uint64(f[1]) == 1<<64-1
			if (end && len(f[0]) != 0) || (!end && string(f[0]) != topic) {
				t.Fatalf("reply topic %q", f[0])
			}
			f = f[1:]
		} else if len(f) != 2 {
			t.Fatalf("reply of %d frames after the delimiter, want 2: %x", len(f), f)
		}
		if len(f[0]) != 8 {
			t.Fatalf("sequence frame %x", f[0])
		}
		seq := binary.BigEndian.Uint64(f[0])
		if seq == 1<<64-1 {
			if len(f[1]) != 0 {
				t.Fatalf("end marker with payload %x", f[1])
			}
			return out
		}
		out = append(out, Replayed{seq, f[1]})
	}
}
