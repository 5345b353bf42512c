package zmqtransport

import (
	"bytes"
	"fmt"
	"testing"

	zmq "github.com/pebbe/zmq4"
)

// pairSockets returns a connected inproc PAIR couple.
func pairSockets(t *testing.T) (send, recv *zmq.Socket) {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	recv, _ = zctx.NewSocket(zmq.PAIR)
	send, _ = zctx.NewSocket(zmq.PAIR)
	if err := recv.Bind("inproc://rx"); err != nil {
		t.Fatal(err)
	}
	if err := send.Connect("inproc://rx"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		send.Close()
		recv.Close()
		zctx.Term()
	})
	return send, recv
}

func frameOf(n int, fill byte) []byte { return bytes.Repeat([]byte{fill}, n) }

// TestReceiver sends messages of every shape through a real socket and
// reads them with both receive paths: the one-call cgo receiver and
// pebbe's API.
func TestReceiver(t *testing.T) {
	tests := []struct {
		name   string
		frames [][]byte
	}{
		{"typical", [][]byte{[]byte("kv@pod@m"), seqBytes(7), frameOf(2000, 'p')}},
		{"empty frames", [][]byte{{}, {}, {}}},
		{"larger than the initial buffer", [][]byte{{}, seqBytes(1), frameOf(100_000, 'x')}},
		{"larger than the kept buffer", [][]byte{{}, seqBytes(2), frameOf(3<<20, 'y')}},
		{"one frame", [][]byte{frameOf(5, 'a')}},
		{"more frames than kept", func() [][]byte {
			var f [][]byte
			for i := range 11 {
				f = append(f, frameOf(i*100, byte('a'+i)))
			}
			return f
		}()},
	}
	for _, path := range []string{"cgo", "pebbe"} {
		t.Run(path, func(t *testing.T) {
			send, recv := pairSockets(t)
			r := newReceiver()
			defer r.free()
			read := func() ([][]byte, int, error) {
				if path == "cgo" {
					return r.recv(recv)
				}
				return recvMessage(recv, r.frames)
			}
			if _, _, err := read(); !isEAGAIN(err) {
				t.Fatalf("empty socket: error %v, want EAGAIN", err)
			}
			for _, tt := range tests {
				parts := make([]any, len(tt.frames))
				for i, f := range tt.frames {
					parts[i] = f
				}
				if _, err := send.SendMessage(parts...); err != nil {
					t.Fatal(err)
				}
				got, n, err := read()
				if err != nil {
					t.Fatalf("%s: %v", tt.name, err)
				}
				if n != len(tt.frames) {
					t.Fatalf("%s: %d frames, want %d", tt.name, n, len(tt.frames))
				}
				want := tt.frames[:min(len(tt.frames), maxFrames)]
				if len(got) != len(want) {
					t.Fatalf("%s: kept %d frames, want %d", tt.name, len(got), len(want))
				}
				for i := range want {
					if !bytes.Equal(got[i], want[i]) {
						t.Fatalf("%s: frame %d differs (%d bytes, want %d)", tt.name, i, len(got[i]), len(want[i]))
					}
				}
			}
			if len(r.buf) > rxKeep {
				t.Fatalf("receive buffer kept at %d bytes, bound %d", len(r.buf), rxKeep)
			}
		})
	}
	if rawLayout.Load() != 1 {
		t.Fatal("pebbe's socket layout was not confirmed: every receive takes the slow path")
	}
}

func TestReceiverAllocations(t *testing.T) {
	send, recv := pairSockets(t)
	r := newReceiver()
	defer r.free()
	msg := [][]byte{[]byte("topic"), seqBytes(1), frameOf(1500, 'p')}
	allocs := testing.AllocsPerRun(100, func() {
		for _, f := range msg[:2] {
			send.SendBytes(f, zmq.SNDMORE)
		}
		send.SendBytes(msg[2], 0)
		if _, n, err := r.recv(recv); err != nil || n != 3 {
			panic(fmt.Sprint(n, err))
		}
	})
	// The sends allocate in pebbe; the receive must not.
	if allocs > 0 {
		t.Fatalf("%.1f allocations per send+receive, want 0", allocs)
	}
}

// TestReceiverLetsGoOfLargeMessages checks that a message larger than
// rxKeep is not kept once handled: the I/O loops call recv until EAGAIN,
// and that call must drop every reference to the large buffer.
func TestReceiverLetsGoOfLargeMessages(t *testing.T) {
	tests := []struct {
		name  string
		sizes []int // payload frame sizes, sent one message each
	}{
		{"one large", []int{3 << 20}},
		{"large then small", []int{3 << 20, 2000}},
		{"small then large", []int{2000, 60 << 20}},
		{"just over the kept size", []int{rxKeep + 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			send, recv := pairSockets(t)
			r := newReceiver()
			defer r.free()
			for _, size := range tt.sizes {
				if _, err := send.SendMessage([]byte("kv@pod@m"), seqBytes(1), frameOf(size, 'z')); err != nil {
					t.Fatal(err)
				}
				frames, n, err := r.recv(recv)
				if err != nil || n != 3 || len(frames[2]) != size {
					t.Fatalf("%d-byte message: %d frames, err %v", size, n, err)
				}
			}
			if _, _, err := r.recv(recv); !isEAGAIN(err) {
				t.Fatalf("drained socket: error %v, want EAGAIN", err)
			}
			// Small messages may stay (the reused buffer, up to rxKeep,
			// and the last one's frames, which alias it).
			if got := r.retained(); got > 2*rxKeep {
				t.Fatalf("receiver keeps %d bytes after the messages were handled, want at most %d", got, 2*rxKeep)
			}
		})
	}
}
