package zmqtransport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"math"
	"strings"
	"sync"

	zmq "github.com/pebbe/zmq4"
)

// Defaults of PublisherConfig.
const (
	DefaultPubEndpoint = "tcp://127.0.0.1:*"
	// DefaultPubHWM is vLLM's high-water mark for the PUB socket.
	DefaultPubHWM = 100_000
	// DefaultReplayHWM covers a replay of vLLM's whole default buffer
	// (buffer_steps 10000) plus the end marker and a few spare.
	DefaultReplayHWM = 10_000 + 16
)

// PublisherConfig configures a Publisher. Zero values pick the defaults.
type PublisherConfig struct {
	// Endpoint is where the PUB socket binds (default DefaultPubEndpoint:
	// a free port, see Publisher.Endpoint). Endpoints are used as given:
	// vLLM adds the DP rank to both ports, so pass the offset ports for
	// rank > 0.
	Endpoint string
	// Connect makes the PUB socket connect to Endpoint instead of binding
	// it: the bind-mode deployment, where the subscriber binds one socket
	// that every engine connects to (vLLM connects for an endpoint without
	// a wildcard). Endpoint is then required, and the replay socket still
	// binds.
	Connect bool
	// ReplayEndpoint is where the replay ROUTER socket binds; "" means no
	// replay service.
	ReplayEndpoint string
	// Topic is the first frame of every message (vLLM's default is "").
	Topic string
	// ReplayWithTopic selects vLLM >= 0.26's replay layout, whose replies
	// carry the topic frame.
	ReplayWithTopic bool
	// PubHWM is the PUB socket's send high-water mark, in messages (default
	// DefaultPubHWM); beyond it a slow subscriber loses batches.
	PubHWM int
	// ReplayHWM is the ROUTER socket's send high-water mark (default
	// DefaultReplayHWM). A replay answers with up to a whole buffer at
	// once, so it should exceed the source's buffer length, or the ROUTER
	// drops the tail of a large replay.
	ReplayHWM int
}

// ReplaySource holds the batches a Publisher replays, as vLLM's publisher
// keeps its last buffer_steps batches. enginesim.Engine is one.
type ReplaySource interface {
	// Buffered returns the buffered batches with seq >= from, oldest
	// first.
	Buffered(from uint64) iter.Seq2[uint64, []byte]
}

// Publisher is the sending side of vLLM's KV-event transport
// (ZmqEventPublisher): a PUB socket sending each batch as the 3-frame
// message [topic, seq u64 big-endian, payload] and, optionally, a replay
// ROUTER socket. A replay request [identity, "", start_seq] is answered
// with every batch of the ReplaySource with seq >= start_seq, then the end
// marker (seq -1, empty payload), in the reply layout before vLLM v0.26
// ([identity, "", seq, payload]) or, with ReplayWithTopic, after it
// ([identity, "", topic, seq, payload]); requests of another shape are
// ignored, as vLLM ignores them. start_seq is read as vLLM reads it, a
// big-endian integer of any length.
//
// The replay socket is served by one goroutine, started by ServeReplay,
// that sleeps in zmq_poll until a request or Close arrives. Publish is
// safe for concurrent use.
type Publisher struct {
	cfg            PublisherConfig
	topic          []byte
	ctx            *zmq.Context
	pubEndpoint    string
	replayEndpoint string

	mu       sync.Mutex  // guards pub, closed, serving and the replay sockets before ServeReplay
	pub      *zmq.Socket // used under mu
	closed   bool
	serving  bool
	replay   *zmq.Socket // owned by the replay goroutine once serving
	stopSend *zmq.Socket // inproc PAIR: Close wakes the replay goroutine through it
	stopRecv *zmq.Socket // owned by the replay goroutine once serving
	done     chan struct{}
}

// errPublisherClosed is returned by a closed Publisher's methods.
var errPublisherClosed = errors.New("zmqtransport: publisher closed")

// NewPublisher binds the PUB socket and, if cfg.ReplayEndpoint is set, the
// replay ROUTER socket. Replay requests wait in the ROUTER until
// ServeReplay names what to answer them with.
func NewPublisher(cfg PublisherConfig) (p *Publisher, err error) {
	if cfg.Connect && cfg.Endpoint == "" {
		return nil, errors.New("zmqtransport: PublisherConfig.Connect needs an Endpoint to connect to")
	}
	if cfg.Endpoint == "" {
		cfg.Endpoint = DefaultPubEndpoint
	}
	if cfg.PubHWM <= 0 {
		cfg.PubHWM = DefaultPubHWM
	}
	if cfg.ReplayHWM <= 0 {
		cfg.ReplayHWM = DefaultReplayHWM
	}
	ctx, err := zmq.NewContext()
	if err != nil {
		return nil, fmt.Errorf("zmqtransport: zmq context: %w", err)
	}
	p = &Publisher{cfg: cfg, topic: []byte(cfg.Topic), ctx: ctx}
	defer func() {
		if err != nil {
			for _, s := range []*zmq.Socket{p.pub, p.replay, p.stopSend, p.stopRecv} {
				if s != nil {
					s.Close()
				}
			}
			ctx.Term()
			p = nil
		}
	}()
	if p.pub, err = p.socket(zmq.PUB, cfg.PubHWM); err != nil {
		return p, err
	}
	if cfg.Connect {
		if err = p.pub.Connect(cfg.Endpoint); err != nil {
			return p, fmt.Errorf("zmqtransport: connect PUB to %s: %w", cfg.Endpoint, err)
		}
		p.pubEndpoint = cfg.Endpoint
	} else if p.pubEndpoint, err = bind(p.pub, "PUB", cfg.Endpoint); err != nil {
		return p, err
	}
	if cfg.ReplayEndpoint == "" {
		return p, nil
	}
	if p.replay, err = p.socket(zmq.ROUTER, cfg.ReplayHWM); err != nil {
		return p, err
	}
	if p.replayEndpoint, err = bind(p.replay, "replay ROUTER", cfg.ReplayEndpoint); err != nil {
		return p, err
	}
	// inproc names are per context, and the context is the publisher's
	// own.
	const stop = "inproc://zmqtransport-replay-stop"
	if p.stopRecv, err = p.socket(zmq.PAIR, 0); err != nil {
		return p, err
	}
	if err = p.stopRecv.Bind(stop); err != nil {
		return p, fmt.Errorf("zmqtransport: %w", err)
	}
	if p.stopSend, err = p.socket(zmq.PAIR, 0); err != nil {
		return p, err
	}
	if err = p.stopSend.Connect(stop); err != nil {
		return p, fmt.Errorf("zmqtransport: %w", err)
	}
	return p, nil
}

// socket creates a socket with linger 0 (Close never waits for unsent
// messages) and, when hwm > 0, that send high-water mark.
func (p *Publisher) socket(typ zmq.Type, hwm int) (*zmq.Socket, error) {
	s, err := p.ctx.NewSocket(typ)
	if err != nil {
		return nil, fmt.Errorf("zmqtransport: %v socket: %w", typ, err)
	}
	if err := s.SetLinger(0); err != nil {
		s.Close()
		return nil, fmt.Errorf("zmqtransport: %v linger: %w", typ, err)
	}
	if hwm > 0 {
		if err := s.SetSndhwm(hwm); err != nil {
			s.Close()
			return nil, fmt.Errorf("zmqtransport: %v hwm: %w", typ, err)
		}
	}
	return s, nil
}

// bind binds s and returns the address a peer can connect to.
func bind(s *zmq.Socket, what, endpoint string) (string, error) {
	if err := s.Bind(endpoint); err != nil {
		return "", fmt.Errorf("zmqtransport: bind %s to %s: %w", what, endpoint, err)
	}
	got, err := s.GetLastEndpoint()
	if err != nil {
		return "", fmt.Errorf("zmqtransport: %s endpoint: %w", what, err)
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

// Endpoint returns the connectable address of the PUB socket, e.g.
// "tcp://127.0.0.1:40123", or with Connect the address it connects to.
func (p *Publisher) Endpoint() string { return p.pubEndpoint }

// ReplayEndpoint returns the connectable address of the replay socket, or
// "" when the publisher has none.
func (p *Publisher) ReplayEndpoint() string { return p.replayEndpoint }

// Topic returns the topic frame of every message.
func (p *Publisher) Topic() string { return p.cfg.Topic }

// Publish sends one batch as [topic, seq, payload]. A PUB socket never
// blocks: a subscriber beyond its high-water mark, or not yet subscribed,
// misses the batch.
func (p *Publisher) Publish(seq uint64, payload []byte) error {
	var sb [8]byte
	binary.BigEndian.PutUint64(sb[:], seq)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errPublisherClosed
	}
	if _, err := p.pub.SendBytes(p.topic, zmq.SNDMORE); err != nil {
		return fmt.Errorf("zmqtransport: publish: %w", err)
	}
	if _, err := p.pub.SendBytes(sb[:], zmq.SNDMORE); err != nil {
		return fmt.Errorf("zmqtransport: publish: %w", err)
	}
	if _, err := p.pub.SendBytes(payload, 0); err != nil {
		return fmt.Errorf("zmqtransport: publish: %w", err)
	}
	return nil
}

// ServeReplay starts answering replay requests from src, including those
// that arrived since NewPublisher. It does nothing without a replay
// socket, and may be called once.
func (p *Publisher) ServeReplay(src ReplaySource) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		return errPublisherClosed
	case p.serving:
		return errors.New("zmqtransport: publisher already serves replays")
	case p.replay == nil:
		return nil
	}
	p.serving = true
	p.done = make(chan struct{})
	// The go statement orders the sockets' setup before their use by the
	// goroutine, the memory barrier libzmq asks for when a socket
	// changes threads.
	go p.serveReplay(src)
	return nil
}

// Close stops the replay goroutine, closes every socket and terminates
// the context. It is safe to call more than once; Publish fails after it.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if p.serving {
		_, err := p.stopSend.SendBytes(nil, 0)
		if err == nil {
			<-p.done
		}
		p.stopSend.Close()
		if err != nil {
			// The goroutine cannot be woken: terminating the context
			// makes its poll fail, and it exits.
			p.pub.Close()
			p.ctx.Term()
			<-p.done
			return fmt.Errorf("zmqtransport: stopping replay: %w", err)
		}
	} else {
		for _, s := range []*zmq.Socket{p.replay, p.stopSend, p.stopRecv} {
			if s != nil {
				s.Close()
			}
		}
	}
	p.pub.Close()
	return p.ctx.Term()
}

// replayEndFrame is the replay end marker, -1 as 8 signed big-endian bytes.
var replayEndFrame = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

func (p *Publisher) serveReplay(src ReplaySource) {
	defer close(p.done)
	defer p.stopRecv.Close()
	defer p.replay.Close()
	poller := zmq.NewPoller()
	poller.Add(p.replay, zmq.POLLIN)
	poller.Add(p.stopRecv, zmq.POLLIN)
	for {
		polled, err := poller.Poll(-1)
		if err != nil {
			return // the context is being terminated
		}
		for _, s := range polled {
			if s.Socket == p.stopRecv {
				return
			}
			p.answerReplays(src)
		}
	}
}

// answerReplays serves every pending request: [identity, "", start_seq]
// gets every buffered batch with seq >= start_seq, then the end marker.
// Requests of another shape are ignored, as vLLM does.
func (p *Publisher) answerReplays(src ReplaySource) {
	withTopic := p.cfg.ReplayWithTopic
	for {
		msg, err := p.replay.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			return // nothing more pending
		}
		if len(msg) != 3 {
			continue
		}
		id := msg[0]
		var sb [8]byte
		for seq, payload := range src.Buffered(startSeq(msg[2])) {
			binary.BigEndian.PutUint64(sb[:], seq)
			if withTopic {
				_, err = p.replay.SendMessage(id, "", p.topic, sb[:], payload)
			} else {
				_, err = p.replay.SendMessage(id, "", sb[:], payload)
			}
			if err != nil {
				break // the peer is gone or the context is closing
			}
		}
		if withTopic {
			p.replay.SendMessage(id, "", "", replayEndFrame, "")
		} else {
			p.replay.SendMessage(id, "", replayEndFrame, "")
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
