package simzmq

import (
	"errors"
	"fmt"
	"sync"

	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// Engine is a simulated vLLM engine (an enginesim.Engine) whose KV
// events go out over ZMQ through its own Publisher, byte for byte as a
// vLLM engine sends them: live on the PUB socket, and from the engine's
// replay buffer on the replay socket. All of enginesim.Engine's methods
// but Restart are promoted.
type Engine struct {
	*enginesim.Engine
	pcfg zmqtransport.PublisherConfig
	out  *switchPub
}

// switchPub is the engine's enginesim.Publisher: the current process's
// Publisher, none while Restart replaces it (batches go nowhere, as from a
// process nobody hears yet).
type switchPub struct {
	mu  sync.Mutex
	pub *zmqtransport.Publisher
}

func (s *switchPub) Publish(seq uint64, payload []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pub == nil {
		return nil
	}
	return s.pub.Publish(seq, payload)
}

func (s *switchPub) current() *zmqtransport.Publisher {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pub
}

func (s *switchPub) swap(p *zmqtransport.Publisher) *zmqtransport.Publisher {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.pub
	s.pub = p
	return old
}

// New binds a Publisher configured by pcfg and builds an engine
// that publishes through it and answers its replay requests. cfg.Publisher
// must be nil: it is set to the new Publisher. A zero pcfg.ReplayHWM is
// sized to the engine's replay buffer.
func New(cfg enginesim.Config, pcfg zmqtransport.PublisherConfig) (*Engine, error) {
	if cfg.Publisher != nil {
		return nil, errors.New("simzmq: enginesim.Config.Publisher is set; New sets it")
	}
	if pcfg.ReplayHWM <= 0 {
		steps := cfg.BufferSteps
		if steps <= 0 {
			steps = enginesim.DefaultBufferSteps
		}
		pcfg.ReplayHWM = steps + 16
	}
	out := &switchPub{}
	cfg.Publisher = out
	e, err := enginesim.New(cfg)
	if err != nil {
		return nil, err
	}
	s := &Engine{Engine: e, pcfg: pcfg, out: out}
	pub, err := s.open()
	if err != nil {
		return nil, err
	}
	// A restarted process binds the ports the first one got.
	if !pcfg.Connect {
		s.pcfg.Endpoint = pub.Endpoint()
	}
	s.pcfg.ReplayEndpoint = pub.ReplayEndpoint()
	out.swap(pub)
	return s, nil
}

// open binds (or connects) a Publisher and serves the engine's replay
// buffer on it.
func (s *Engine) open() (*zmqtransport.Publisher, error) {
	pub, err := zmqtransport.NewPublisher(s.pcfg)
	if err != nil {
		return nil, err
	}
	if err := pub.ServeReplay(s.Engine); err != nil {
		pub.Close()
		return nil, err
	}
	return pub, nil
}

// Restart simulates a new engine process as vLLM's is: the old process's
// sockets close (its subscribers see the connection drop), the cache and
// the replay buffer empty, the sequence starts again at 0, and the new
// process binds (or connects from) the same endpoints. Nothing is
// published (vLLM announces no AllBlocksCleared on start). Batches
// processed meanwhile go nowhere.
func (s *Engine) Restart() error {
	if old := s.out.swap(nil); old != nil {
		if err := old.Close(); err != nil {
			return fmt.Errorf("simzmq: closing the old process's sockets: %w", err)
		}
	}
	s.Engine.Restart()
	pub, err := s.open()
	if err != nil {
		return fmt.Errorf("simzmq: the new process's sockets: %w", err)
	}
	s.out.swap(pub)
	return nil
}

// PubEndpoint returns the connectable address of the engine's PUB socket,
// e.g. "tcp://127.0.0.1:40123".
func (s *Engine) PubEndpoint() string { return s.pcfg.Endpoint }

// ReplayEndpoint returns the connectable address of the engine's replay
// socket, or "" when it has none.
func (s *Engine) ReplayEndpoint() string { return s.pcfg.ReplayEndpoint }

// Publisher returns the engine's current Publisher (nil during Restart).
func (s *Engine) Publisher() *zmqtransport.Publisher { return s.out.current() }

// Close stops the engine, then its replay service, and closes the
// sockets. It is safe to call more than once.
func (s *Engine) Close() error {
	s.Engine.Close()
	if pub := s.out.swap(nil); pub != nil {
		return pub.Close()
	}
	return nil
}
