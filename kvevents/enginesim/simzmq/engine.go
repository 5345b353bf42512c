package simzmq

import (
	"errors"

	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// Engine is a simulated vLLM engine (an enginesim.Engine) whose KV
// events go out over ZMQ through its own Publisher, byte for byte as a
// vLLM engine sends them: live on the PUB socket, and from the engine's
// replay buffer on the replay socket. All of enginesim.Engine's methods
// are promoted.
type Engine struct {
	*enginesim.Engine
	pub *zmqtransport.Publisher
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
	pub, err := zmqtransport.NewPublisher(pcfg)
	if err != nil {
		return nil, err
	}
	cfg.Publisher = pub
	e, err := enginesim.New(cfg)
	if err != nil {
		pub.Close()
		return nil, err
	}
	if err := pub.ServeReplay(e); err != nil {
		pub.Close()
		return nil, err
	}
	return &Engine{Engine: e, pub: pub}, nil
}

// PubEndpoint returns the connectable address of the engine's PUB socket,
// e.g. "tcp://127.0.0.1:40123".
func (s *Engine) PubEndpoint() string { return s.pub.Endpoint() }

// ReplayEndpoint returns the connectable address of the engine's replay
// socket, or "" when it has none.
func (s *Engine) ReplayEndpoint() string { return s.pub.ReplayEndpoint() }

// Publisher returns the engine's Publisher.
func (s *Engine) Publisher() *zmqtransport.Publisher { return s.pub }

// Close stops the engine, then its replay service, and closes the
// sockets. It is safe to call more than once.
func (s *Engine) Close() error {
	s.Engine.Close()
	return s.pub.Close()
}
