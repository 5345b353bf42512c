package enginesim

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"

	zmq "github.com/pebbe/zmq4"
)

// transport owns the engine's ZMQ context and sockets: the PUB socket
// (used under Engine.mu), and the replay ROUTER socket served by one
// goroutine that sleeps in zmq_poll until a request or the stop signal
// arrives.
type transport struct {
	e              *Engine
	ctx            *zmq.Context
	pub            *zmq.Socket
	pubEndpoint    string
	replay         *zmq.Socket // owned by the replay goroutine
	replayEndpoint string
	stopSend       *zmq.Socket // inproc PAIR: Close wakes the replay goroutine through it
	stopRecv       *zmq.Socket // owned by the replay goroutine
	done           chan struct{}
}

// pubHWM is vLLM's default high-water mark for the PUB socket.
const pubHWM = 100_000

func newTransport(e *Engine) (t *transport, err error) {
	ctx, err := zmq.NewContext()
	if err != nil {
		return nil, fmt.Errorf("enginesim: zmq context: %w", err)
	}
	t = &transport{e: e, ctx: ctx}
	defer func() {
		if err != nil {
			for _, s := range []*zmq.Socket{t.pub, t.replay, t.stopSend, t.stopRecv} {
				if s != nil {
					s.Close()
				}
			}
			ctx.Term()
			t = nil
		}
	}()
	cfg := &e.cfg
	if t.pub, err = t.socket(zmq.PUB, pubHWM); err != nil {
		return t, err
	}
	if t.pubEndpoint, err = bind(t.pub, "PUB", cfg.PubEndpoint); err != nil {
		return t, err
	}
	if cfg.ReplayEndpoint == "" {
		return t, nil
	}
	// A replay answers with up to BufferSteps messages at once; a high
	// enough HWM keeps the ROUTER from dropping any of them.
	if t.replay, err = t.socket(zmq.ROUTER, cfg.BufferSteps+16); err != nil {
		return t, err
	}
	if t.replayEndpoint, err = bind(t.replay, "replay ROUTER", cfg.ReplayEndpoint); err != nil {
		return t, err
	}
	// inproc names are per context, and the context is the engine's own.
	const stop = "inproc://enginesim-replay-stop"
	if t.stopRecv, err = t.socket(zmq.PAIR, 0); err != nil {
		return t, err
	}
	if err = t.stopRecv.Bind(stop); err != nil {
		return t, fmt.Errorf("enginesim: %w", err)
	}
	if t.stopSend, err = t.socket(zmq.PAIR, 0); err != nil {
		return t, err
	}
	if err = t.stopSend.Connect(stop); err != nil {
		return t, fmt.Errorf("enginesim: %w", err)
	}
	t.done = make(chan struct{})
	go t.serveReplay()
	return t, nil
}

// socket creates a socket with linger 0 (Close never waits for unsent
// messages) and, when hwm > 0, that send high-water mark.
func (t *transport) socket(typ zmq.Type, hwm int) (*zmq.Socket, error) {
	s, err := t.ctx.NewSocket(typ)
	if err != nil {
		return nil, fmt.Errorf("enginesim: %v socket: %w", typ, err)
	}
	if err := s.SetLinger(0); err != nil {
		s.Close()
		return nil, fmt.Errorf("enginesim: %v linger: %w", typ, err)
	}
	if hwm > 0 {
		if err := s.SetSndhwm(hwm); err != nil {
			s.Close()
			return nil, fmt.Errorf("enginesim: %v hwm: %w", typ, err)
		}
	}
	return s, nil
}

// bind binds s and returns the address a peer can connect to.
func bind(s *zmq.Socket, what, endpoint string) (string, error) {
	if err := s.Bind(endpoint); err != nil {
		return "", fmt.Errorf("enginesim: bind %s to %s: %w", what, endpoint, err)
	}
	got, err := s.GetLastEndpoint()
	if err != nil {
		return "", fmt.Errorf("enginesim: %s endpoint: %w", what, err)
	}
	return connectable(got), nil
}

// connectable turns a wildcard bind address into one a local peer can
// connect to.
func connectable(ep string) string {
	if rest, ok := strings.CutPrefix(ep, "tcp://0.0.0.0:"); ok {
		return "tcp://127.0.0.1:" + rest
	}
	if rest, ok := strings.CutPrefix(ep, "tcp://[::]:"); ok {
		return "tcp://[::1]:" + rest
	}
	return ep
}

// send publishes one batch as [topic, seq, payload]. Callers hold e.mu.
func (t *transport) send(topic []byte, seq uint64, payload []byte) error {
	var sb [8]byte
	binary.BigEndian.PutUint64(sb[:], seq)
	if _, err := t.pub.SendBytes(topic, zmq.SNDMORE); err != nil {
		return fmt.Errorf("enginesim: publish: %w", err)
	}
	if _, err := t.pub.SendBytes(sb[:], zmq.SNDMORE); err != nil {
		return fmt.Errorf("enginesim: publish: %w", err)
	}
	if _, err := t.pub.SendBytes(payload, 0); err != nil {
		return fmt.Errorf("enginesim: publish: %w", err)
	}
	return nil
}

// close stops the replay goroutine, closes every socket and terminates
// the context. The engine is marked closed before, so no Process can be
// using the PUB socket.
func (t *transport) close() error {
	if t.stopSend != nil {
		_, err := t.stopSend.SendBytes(nil, 0)
		if err == nil {
			<-t.done
		}
		t.stopSend.Close()
		if err != nil {
			// The goroutine cannot be woken: terminating the context
			// makes its poll fail, and it exits.
			t.pub.Close()
			t.ctx.Term()
			<-t.done
			return fmt.Errorf("enginesim: stopping replay: %w", err)
		}
	}
	t.pub.Close()
	return t.ctx.Term()
}

// endSeq is the replay end marker, -1 as 8 signed big-endian bytes.
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

func (t *transport) serveReplay() {
	defer close(t.done)
	defer t.stopRecv.Close()
	defer t.replay.Close()
	poller := zmq.NewPoller()
	poller.Add(t.replay, zmq.POLLIN)
	poller.Add(t.stopRecv, zmq.POLLIN)
	for {
		polled, err := poller.Poll(-1)
		if err != nil {
			return // the context is being terminated
		}
		for _, p := range polled {
			if p.Socket == t.stopRecv {
				return
			}
			t.answerReplays()
		}
	}
}

// answerReplays serves every pending request: [identity, "", start_seq]
// gets every buffered batch with seq >= start_seq, then the end marker.
// Requests of another shape are ignored, as vLLM does.
func (t *transport) answerReplays() {
	withTopic := t.e.cfg.ReplayWithTopic
	topic := t.e.topic
	for {
		msg, err := t.replay.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			return // nothing more pending
		}
		if len(msg) != 3 {
			continue
		}
		id := msg[0]
		var sb [8]byte
		for _, en := range t.e.since(startSeq(msg[2])) {
			binary.BigEndian.PutUint64(sb[:], en.seq)
			if withTopic {
				_, err = t.replay.SendMessage(id, "", topic, sb[:], en.payload)
			} else {
				_, err = t.replay.SendMessage(id, "", sb[:], en.payload)
			}
			if err != nil {
				break // the peer is gone or the context is closing
			}
		}
		if withTopic {
			t.replay.SendMessage(id, "", "", endSeq, "")
		} else {
			t.replay.SendMessage(id, "", endSeq, "")
		}
	}
}

// startSeq reads a start sequence as vLLM does (int.from_bytes(b, "big"):
// any length); a value beyond 64 bits saturates.
func startSeq(b []byte) uint64 {
	var v uint64
	for _, c := range b {
		if v>>56 != 0 {
			return math.MaxUint64
		}
		v = v<<8 | uint64(c)
	}
	return v
}
