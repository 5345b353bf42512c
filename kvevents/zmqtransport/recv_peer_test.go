package zmqtransport

import (
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// tcpPair returns a PUSH connected from source address src to a PULL
// bound on 127.0.0.1: the Peer-Address libzmq attaches exists on tcp only.
func tcpPair(tb testing.TB, src string) (send, recv *zmq.Socket) {
	tb.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		tb.Fatal(err)
	}
	recv, _ = zctx.NewSocket(zmq.PULL)
	send, _ = zctx.NewSocket(zmq.PUSH)
	for _, err := range []error{
		recv.SetLinger(0), send.SetLinger(0), recv.SetRcvhwm(0), send.SetSndhwm(0),
		recv.Bind("tcp://127.0.0.1:*"),
	} {
		if err != nil {
			tb.Fatal(err)
		}
	}
	ep, _ := recv.GetLastEndpoint()
	if err := send.Connect(fromAddr(src, ep)); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		send.Close()
		recv.Close()
		zctx.Term()
	})
	return send, recv
}

// TestReceiverPeerAddress: both receive paths report the source address
// once asked to, and only then.
func TestReceiverPeerAddress(t *testing.T) {
	for _, path := range []string{"cgo", "pebbe"} {
		t.Run(path, func(t *testing.T) {
			send, recv := tcpPair(t, "127.0.0.2")
			r := newReceiver()
			defer r.free()
			read := func() {
				t.Helper()
				poller := zmq.NewPoller()
				poller.Add(recv, zmq.POLLIN)
				if _, err := poller.Poll(waitTimeout); err != nil {
					t.Fatal(err)
				}
				var n int
				var err error
				if path == "cgo" {
					_, n, err = r.recv(recv)
				} else {
					r.peer = nil
					_, n, r.peer, err = recvMessagePeer(recv, r.frames)
				}
				if err != nil || n != 3 {
					t.Fatalf("receive: %d frames, %v", n, err)
				}
			}
			msg := []any{"kv@pod@m", seqBytes(1), "payload"}
			if _, err := send.SendMessage(msg...); err != nil {
				t.Fatal(err)
			}
			if path == "cgo" {
				read()
				if got := r.peerAddr(); got != nil {
					t.Fatalf("source address %q read without wantPeer", got)
				}
			}
			r.wantPeer()
			if _, err := send.SendMessage(msg...); err != nil {
				t.Fatal(err)
			}
			read()
			if got := string(r.peerAddr()); got != "127.0.0.2" {
				t.Fatalf("source address %q, want 127.0.0.2", got)
			}
		})
	}
}

// BenchmarkReceiverPeerAddress measures what reading each message's
// Peer-Address adds to the fast receive path: the time spent in recv per
// 3-frame message over loopback tcp, without and with wantPeer.
func BenchmarkReceiverPeerAddress(b *testing.B) {
	payload := frameOf(2000, 'p')
	for _, peer := range []bool{false, true} {
		name := "off"
		if peer {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			send, recv := tcpPair(b, "127.0.0.1")
			r := newReceiver()
			defer r.free()
			if peer {
				r.wantPeer()
			}
			go func() {
				for i := range b.N {
					if _, err := send.SendMessage("kv@pod@m", seqBytes(uint64(i)), payload); err != nil {
						return
					}
				}
			}()
			poller := zmq.NewPoller()
			poller.Add(recv, zmq.POLLIN)
			var inRecv time.Duration
			b.ResetTimer()
			for got := 0; got < b.N; {
				t0 := time.Now()
				_, _, err := r.recv(recv)
				d := time.Since(t0)
				if err != nil {
					if _, err := poller.Poll(waitTimeout); err != nil {
						b.Fatal(err)
					}
					continue
				}
				inRecv += d
				got++
			}
			b.ReportMetric(float64(inRecv.Nanoseconds())/float64(b.N), "recv-ns/msg")
		})
	}
}
