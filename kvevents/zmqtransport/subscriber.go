package zmqtransport

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/internal/memlimit"
	"github.com/kvindex/kvindex/kvevents"
)

// Defaults of SubscriberConfig.
const (
	DefaultReplayTimeout     = 2 * time.Second
	DefaultMaxBuffered       = 10_000
	DefaultReconnectIvl      = 100 * time.Millisecond
	DefaultReconnectIvlMax   = 5 * time.Second
	DefaultHeartbeatInterval = 10 * time.Second
	// DefaultRcvHWM is the SUB sockets' queue, in messages: the deepest
	// kvindex's memory model allows (memlimit.MaxRcvHWM says why).
	DefaultRcvHWM = memlimit.MaxRcvHWM
	// DefaultMaxEngines is 1,000 pods of 8 data-parallel ranks each.
	DefaultMaxEngines = 8000
	// DefaultForgetAfter is long enough for a network blip and a
	// connection's reconnect backoff, short enough that a fleet's churn
	// does not pile up departed engines.
	DefaultForgetAfter = 10 * time.Minute
)

// EngineConfig names one engine to connect to (connect mode).
type EngineConfig struct {
	// Name identifies the engine (EngineID.Pod); unique per Subscriber.
	Name string
	// Model is the model the engine serves (EngineID.Model).
	Model string
	// Endpoint is rank 0's PUB endpoint, e.g. "tcp://10.0.0.5:5557".
	Endpoint string
	// ReplayEndpoint is rank 0's replay ROUTER endpoint, e.g.
	// "tcp://10.0.0.5:5558"; "" if the engine has none (gaps then degrade
	// the stream instead of being replayed).
	ReplayEndpoint string
	// Ranks is the engine's data-parallel size (0 means 1). Rank r is read
	// from Endpoint's port + r and replayed from ReplayEndpoint's port + r,
	// as vLLM offsets them (see CheckLayout for the ports this takes).
	Ranks int
	// Topic is the SUB subscription: a byte prefix of the topics to accept
	// ("" accepts all).
	Topic string
}

// SubscriberConfig configures a Subscriber. Zero values pick the defaults.
type SubscriberConfig struct {
	// Engines are the engines to connect to at Start (connect mode).
	Engines []EngineConfig

	// Listen, if set, is an endpoint to bind one SUB socket to (bind
	// mode), e.g. "tcp://*:5557"; a port of "*" binds an ephemeral port
	// (one rank only), which ListenEndpoint reports.
	Listen string
	// ListenRanks is the largest data-parallel size of the engines that
	// connect to Listen (0 means 1). vLLM's rank r connects to the
	// configured port + r, so the listen socket binds that many
	// consecutive ports (one socket bound to each) and tells the ranks
	// apart by their batches' dp_rank.
	ListenRanks int
	// Topic is the listen socket's subscription prefix ("" accepts all).
	Topic string
	// TopicPattern extracts pod and model from the topics of a listen
	// socket; see LLMDTopicPattern (the default) for the syntax.
	TopicPattern string
	// Model is the model of bind-mode engines whose pattern has none.
	Model string
	// ReplayTemplate is the replay endpoint of bind-mode engines, with
	// placeholders: {addr}, the IP address the engine's events come from
	// (e.g. "tcp://{addr}:5558"), or {pod} (and optionally {model}), taken
	// from its topic; rank r replays on its port + r. "" means no replay:
	// gaps degrade the stream. With {pod} in the host, whoever reaches
	// the listen socket chooses where kvindex connects to (a topic
	// kv@10.9.9.9@m makes it dial 10.9.9.9), so with EngineAllow the
	// host must be {addr}.
	ReplayTemplate string
	// EngineAllow, if not empty, says which source addresses may speak
	// for which pods in bind mode (see AllowRule). A connection from an
	// address no rule names is refused at the ZMQ handshake (through a
	// ZAP handler; ListenerStats.RefusedHandshakes), and a message whose
	// source address no rule allows for the pod its topic names is
	// dropped before it reaches any stream (ListenerStats.
	// RefusedSources). A pod named by an IP address must also come from
	// that address. It needs a tcp Listen endpoint, and a ReplayTemplate
	// whose host is {addr}.
	EngineAllow []AllowRule
	// EngineAllowDynamic: the rules change at run time (SetEngineAllow,
	// e.g. as engine pods are discovered), so they are enforced even
	// while EngineAllow is empty, which then refuses every engine. Same
	// requirements as EngineAllow. They are enforced on each message's
	// source only, not at the handshake: libzmq never retries a peer
	// refused there, and an engine may connect before the rules admit
	// it (every engine does, when kvindex restarts); so its connections
	// are not capped either (MaxEngines).
	EngineAllowDynamic bool
	// MaxEngines caps the streams (engine ranks) a listen socket
	// discovers from topics: each costs a sequencer, a replay socket and
	// metrics series, and topics are whatever peers send. Further engines
	// are refused (kvevents.ListenerStats.RefusedEngines) and their
	// messages dropped until a slot frees: a stream is removed, gives its
	// slot back for want of an accepted batch in its first seconds, or,
	// silent for seconds, gives it to a newcomer. The cap applies to the
	// engines admitted through a glob EngineAllow rule (or to all,
	// without rules): one whose pod an exact rule names (as discovery's
	// rules do), or named by the IP address it speaks from, is never
	// refused for lack of slots. With EngineAllow, it also caps the
	// connections to the listen socket, each with its own receive queue
	// of RcvHWM messages, from addresses no exact rule ties to a pod
	// (listen_conns.go; ListenerStats.RefusedConnections). Default
	// DefaultMaxEngines.
	MaxEngines int
	// ForgetAfter: in bind mode, an engine rank whose connection has
	// been gone this long (or a resumed one whose engine never showed up)
	// is forgotten: its stream removed and its entries reset
	// (Sink.Reset with ResetRemoved), so that the engines of pods that
	// went away neither linger in answers nor hold --max-engines slots.
	// If it publishes again it returns as a new engine. 0 means
	// DefaultForgetAfter; negative, never.
	ForgetAfter time.Duration

	// Resume are positions a Checkpoint of an earlier process reported,
	// whose entries the Sink holds again (restored from a snapshot): each
	// such stream starts from its position under kvevents.HealthRestored
	// and asks its engine to confirm it (see kvevents.Health), by a
	// replay from the position's seq: on connecting (connect mode) or on
	// the engine's first batch (bind mode). A position whose pod is not a
	// configured engine belongs to the listen socket: its stream exists
	// from Start (listed by Streams as restored, not connected) and takes
	// the engine's batches once its topic shows up. Positions of engines
	// that are not configured and never appear stay restored.
	Resume []kvevents.Position

	// Flavor selects the payload decoder (vLLM or SGLang).
	Flavor kvevents.Flavor
	// Limits bounds what the decoder accepts (zero: its defaults).
	Limits kvevents.Limits

	// ReplayTimeout is how long a replay may stay silent (no reply, no
	// end marker) before it is given up and the stream degraded.
	ReplayTimeout time.Duration
	// MaxBuffered bounds the live batches held per stream while a replay
	// is outstanding; beyond it the replay is given up.
	MaxBuffered int
	// ReconnectIvl and ReconnectIvlMax bound the reconnect backoff:
	// libzmq's while TCP connects fail, the subscriber's own after
	// connections closed before the ZMQ handshake.
	ReconnectIvl, ReconnectIvlMax time.Duration
	// RcvHWM is the receive high-water mark of SUB sockets, in messages
	// per connected peer (default DefaultRcvHWM); beyond it the peer's PUB
	// queues, then drops (seen as gaps). Replay DEALERs take at least
	// DefaultReplayHWM, so a whole replay fits.
	RcvHWM int
	// MaxMsgSize caps one frame's size in bytes; a peer sending a larger
	// one is disconnected by libzmq as soon as it reads the frame's
	// header, before buffering it. The default is the decoder's payload
	// limit (Limits.MaxPayload): the payload is a frame of its own (libzmq
	// checks each frame, so no framing overhead adds to it), and a larger
	// payload would be refused by the decoder anyway.
	MaxMsgSize int64
	// HeartbeatInterval is the ZMTP heartbeat interval on SUB sockets, so
	// a silently dead connection is noticed (after three intervals) and
	// re-established. Negative disables heartbeats.
	HeartbeatInterval time.Duration
	// Pollers is the number of I/O loops serving connect-mode engines
	// (default GOMAXPROCS).
	Pollers int
	// Now is the wall clock for LastEventUnixNano and the lag behind the
	// engines' batch stamps (default time.Now).
	Now func() time.Time
}

func (c *SubscriberConfig) setDefaults() {
	if c.ReplayTimeout <= 0 {
		c.ReplayTimeout = DefaultReplayTimeout
	}
	if c.MaxBuffered <= 0 {
		c.MaxBuffered = DefaultMaxBuffered
	}
	if c.ReconnectIvl <= 0 {
		c.ReconnectIvl = DefaultReconnectIvl
	}
	if c.ReconnectIvlMax <= 0 {
		c.ReconnectIvlMax = DefaultReconnectIvlMax
	}
	c.ReconnectIvlMax = max(c.ReconnectIvlMax, c.ReconnectIvl)
	if c.RcvHWM <= 0 {
		c.RcvHWM = DefaultRcvHWM
	}
	if c.MaxMsgSize <= 0 {
		c.MaxMsgSize = int64(cmp.Or(max(c.Limits.MaxPayload, 0), kvevents.DefaultLimits().MaxPayload))
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.ListenRanks <= 0 {
		c.ListenRanks = 1
	}
	if c.MaxEngines <= 0 {
		c.MaxEngines = DefaultMaxEngines
	}
	if c.ForgetAfter == 0 {
		c.ForgetAfter = DefaultForgetAfter
	}
	if c.Pollers <= 0 {
		c.Pollers = runtime.GOMAXPROCS(0)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

func (c *EngineConfig) validate() error {
	if c.Name == "" {
		return configerr.New("Engines", "%v without a name", configerr.Field("Engines"))
	}
	if c.Endpoint == "" {
		return configerr.New("Engines", "%v %q has no endpoint", configerr.Field("Engines"), c.Name)
	}
	if c.Ranks <= 0 {
		c.Ranks = 1
	}
	if c.Ranks > kvevents.MaxDPRank {
		return configerr.New("Engines", "%v %q: %d ranks exceed %d", configerr.Field("Engines"), c.Name, c.Ranks, kvevents.MaxDPRank)
	}
	for _, ep := range []string{c.Endpoint, c.ReplayEndpoint} {
		if ep == "" {
			continue
		}
		if err := CheckConnectEndpoint(ep, c.Ranks); err != nil {
			return configerr.New("Engines", "%v %q: %w", configerr.Field("Engines"), c.Name, err)
		}
	}
	return nil
}

// Subscriber receives KV events from engines over ZMQ and calls its
// kvevents.Sink with each engine's batches in sequence order, exactly once,
// replayed batches included.
//
// It reads engines in either of the two topologies vLLM supports:
//
//   - connect mode (SubscriberConfig.Engines, AddEngine): each engine binds
//     its PUB socket (vLLM's default "tcp://*:5557") and the subscriber
//     connects one SUB socket per engine and data-parallel rank. Rank r
//     publishes on port+r and replays on replay_port+r. A batch's own
//     dp_rank, when present, overrides the port's rank (see
//     kvevents.StreamStats.RankMismatches).
//   - bind mode (SubscriberConfig.Listen): the subscriber binds one SUB
//     socket, on one port per rank (ListenRanks), and every engine connects
//     its PUB to it (llm-d's deployment). Engines are told apart by their
//     topic (TopicPattern, by default kv@<pod>@<model>) and, within an
//     engine, by the batch's dp_rank.
//
// Each (engine, rank) stream has its own kvevents.Sequencer: a gap is
// replayed from the engine's replay socket over a DEALER, from the last
// applied batch, whose print proves the engine the same process; a
// reconnect (bind mode: a batch on a new connection) is verified the same
// way; another engine process (an unknown batch under an applied seq, or
// a verifying replay without the last applied batch) becomes
// Sink.Reset(ResetRestart) before its own batches; a stream with no
// history asks for the engine's replay buffer on connecting (or on its
// first batch), recovering blocks stored before kvindex started. When a
// gap cannot be replayed the stream is marked degraded and carries on
// without resetting (see kvevents.StreamStats.Health).
//
// Streams are served by a few I/O loops, each a goroutine that owns its
// sockets and waits in zmq_poll; a stream lives on one loop, so its Sink
// calls are serial. Connect-mode engines are spread over up to
// SubscriberConfig.Pollers loops; a listen socket has a loop of its own.
// Engines are independent: a stopped engine leaves only its own socket
// idle while it is reconnected in the background (backoff ReconnectIvl to
// ReconnectIvlMax).
//
// Sink calls for one EngineID never overlap; calls for different engines
// may. The events passed to Sink.Apply are valid only during the call
// (their slices are reused for the next batch). A Sink may call Streams
// and ListenerStats but no other method of the Subscriber.
type Subscriber struct {
	cfg   SubscriberConfig
	sink  kvevents.Sink
	psink kvevents.PayloadSink // sink, when it wants payloads; else nil
	log   *slog.Logger
	topic *topicPattern
	allow *allowList // EngineAllow compiled; nil without rules
	zctx  *zmq.Context
	epoch time.Time // origin of the monotonic clock for replay deadlines

	// proveWithin and displaceAfter are the listener's slot timings
	// (slots.go): the constants, but for tests.
	proveWithin, displaceAfter time.Duration
	names                      atomic.Uint64

	mu       sync.Mutex // lifecycle, engines, loops; never held by a loop goroutine
	started  bool
	closed   bool
	loops    []*ioLoop
	engines  map[string]*engine
	listener *listener

	listenerView atomic.Pointer[listener] // for the lock-free getters

	trimStop, trimDone chan struct{} // the trimmer goroutine (see capArenas)

	regMu   sync.Mutex                              // identities, the stats registry, resume; loops take it briefly
	resume  map[kvevents.EngineID]kvevents.Position // SubscriberConfig.Resume, each taken by its stream
	owners  map[kvevents.EngineID]*stream
	streams map[*streamCounters]struct{}
}

// engine is one connect-mode engine: a stream per rank on one loop.
type engine struct {
	cfg     EngineConfig
	loop    *ioLoop
	streams []*stream
}

// NewSubscriber validates cfg and returns a Subscriber that has not yet
// opened any socket; call Start (or Run). log may be nil.
func NewSubscriber(cfg SubscriberConfig, sink kvevents.Sink, log *slog.Logger) (*Subscriber, error) {
	if sink == nil {
		return nil, errors.New("zmqtransport: nil Sink")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg.setDefaults()
	cfg.Engines = slices.Clone(cfg.Engines)
	seen := map[string]bool{}
	for i := range cfg.Engines {
		if err := cfg.Engines[i].validate(); err != nil {
			return nil, err
		}
		if seen[cfg.Engines[i].Name] {
			return nil, configerr.New("Engines", "%v %q configured twice", configerr.Field("Engines"), cfg.Engines[i].Name)
		}
		seen[cfg.Engines[i].Name] = true
	}
	if err := CheckLayout(cfg.Engines); err != nil {
		return nil, configerr.New("Engines", "%v: %w", configerr.Field("Engines"), err)
	}
	if cfg.Listen != "" {
		if err := CheckBindEndpoint(cfg.Listen, cfg.ListenRanks); err != nil {
			return nil, configerr.New("Listen", "%v %w", configerr.Field("Listen"), err)
		}
	}
	if len(cfg.Engines) == 0 && cfg.Listen == "" {
		// Engines may still be added at run time (discovery).
		log.Debug("zmqtransport: subscriber starts without engines")
	}
	tp, err := compileTopicPattern(cfg.TopicPattern)
	if err != nil {
		return nil, configerr.New("TopicPattern", "%v: %w", configerr.Field("TopicPattern"), err)
	}
	if cfg.ReplayTemplate != "" {
		if err := CheckReplayTemplate(cfg.ReplayTemplate, cfg.ListenRanks); err != nil {
			return nil, configerr.New("ReplayTemplate", "%v: %w", configerr.Field("ReplayTemplate"), err)
		}
	}
	allow, err := compileAllowList(cfg.EngineAllow)
	if err != nil {
		return nil, configerr.New("EngineAllow", "%v: %w", configerr.Field("EngineAllow"), err)
	}
	if allow == nil && cfg.EngineAllowDynamic {
		allow = &allowList{exact: map[string][]netip.Prefix{}}
	}
	if err := checkSourceBinding(cfg, allow != nil); err != nil {
		return nil, err
	}
	cfg.EngineAllow = slices.Clone(cfg.EngineAllow)
	resume := make(map[kvevents.EngineID]kvevents.Position, len(cfg.Resume))
	for _, p := range cfg.Resume {
		resume[p.Engine] = p
	}
	cfg.Resume = nil // resume is the one copy
	return &Subscriber{
		resume: resume,
		cfg:    cfg,
		sink:   sink,
		psink:  payloadSink(sink),
		log:    log,
		topic:  tp,
		allow:  allow,
		epoch:  time.Now(),

		proveWithin:   proveWithin,
		displaceAfter: displaceAfter,
		engines:       map[string]*engine{},
		owners:        map[kvevents.EngineID]*stream{},
		streams:       map[*streamCounters]struct{}{},
	}, nil
}

// checkSourceBinding checks what source addresses need: a tcp listen
// socket (libzmq names no source address on ipc or inproc) for {addr}
// and allow rules, and, with rules, a replay template that dials the
// source's address rather than a host a topic chose.
func checkSourceBinding(cfg SubscriberConfig, rules bool) error {
	tcp := strings.HasPrefix(cfg.Listen, "tcp://")
	switch {
	case rules && cfg.Listen == "":
		return configerr.New("EngineAllow", "%v applies to a listen socket (bind mode) only", configerr.Field("EngineAllow"))
	case rules && !tcp:
		return configerr.New("EngineAllow", "%v needs a tcp %v endpoint, not %q: only tcp connections have a source address", configerr.Field("EngineAllow"), configerr.Field("Listen"), cfg.Listen)
	case strings.Contains(cfg.ReplayTemplate, "{addr}") && cfg.Listen != "" && !tcp:
		return configerr.New("ReplayTemplate", "%v: {addr} needs a tcp %v endpoint, not %q: only tcp connections have a source address", configerr.Field("ReplayTemplate"), configerr.Field("Listen"), cfg.Listen)
	case rules && cfg.ReplayTemplate != "":
		if err := CheckSourceReplayTemplate(cfg.ReplayTemplate); err != nil {
			return configerr.New("ReplayTemplate", "%v: %w", configerr.Field("ReplayTemplate"), err)
		}
	}
	return nil
}

// Start opens the sockets and starts the I/O loops. A bind error of the
// listen socket is returned; connect-mode engines never fail to start on
// account of their engine being down (libzmq keeps reconnecting).
func (s *Subscriber) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("zmqtransport: subscriber closed")
	}
	if s.started {
		return errors.New("zmqtransport: subscriber already started")
	}
	capArenas() // before libzmq's I/O thread allocates
	zctx, err := zmq.NewContext()
	if err != nil {
		return fmt.Errorf("zmqtransport: zmq context: %w", err)
	}
	s.trimStop, s.trimDone = make(chan struct{}), make(chan struct{})
	// Departed engines are looked for at a quarter of ForgetAfter (at
	// most every trimEvery), so one is forgotten within 1.25 ForgetAfter;
	// unproven streams at a quarter of proveWithin, so one is dropped
	// within 1.25 proveWithin of its first message.
	sweep := trimEvery
	if s.cfg.ForgetAfter > 0 {
		sweep = min(sweep, max(s.cfg.ForgetAfter/4, 10*time.Millisecond))
	}
	if s.cfg.Listen != "" {
		sweep = min(sweep, max(s.proveWithin/4, 10*time.Millisecond))
	}
	go trimmer(s.trimStop, s.trimDone, sweep, s.sweepListener)
	// libzmq's default of 1023 sockets is too few for a large fleet: each
	// stream uses up to four (SUB, DEALER, monitor pair).
	_ = zctx.SetMaxSockets(1 << 16)
	s.zctx = zctx
	s.started = true
	if s.cfg.Listen != "" {
		if err := s.startListener(); err != nil {
			s.shutdownLocked()
			return err
		}
	}
	for _, ec := range s.cfg.Engines {
		if err := s.addEngineLocked(ec); err != nil {
			s.shutdownLocked()
			return err
		}
	}
	return nil
}

// Run starts the subscriber, blocks until ctx is done, then closes it.
func (s *Subscriber) Run(ctx context.Context) error {
	if err := s.Start(); err != nil {
		return err
	}
	<-ctx.Done()
	return s.Close()
}

// Close stops every I/O loop, closes every socket and returns once no
// goroutine of the subscriber is left. It does not reset any engine.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	return s.shutdownLocked()
}

func (s *Subscriber) shutdownLocked() error {
	s.closed = true
	loops := s.loops
	if s.listener != nil {
		loops = append(slices.Clone(loops), s.listener.loop)
	}
	for _, l := range loops {
		l.stop()
	}
	if s.trimStop != nil {
		close(s.trimStop)
		<-s.trimDone
		s.trimStop = nil
	}
	s.loops, s.listener, s.engines = nil, nil, map[string]*engine{}
	if s.zctx == nil {
		return nil
	}
	err := s.zctx.Term()
	s.zctx = nil
	return err
}

// AddEngine starts reading one more engine (connect mode). Before Start it
// only joins the configuration.
func (s *Subscriber) AddEngine(cfg EngineConfig) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("zmqtransport: subscriber closed")
	}
	others := s.cfg.Engines
	if s.started {
		others = others[:0:0]
		for _, e := range s.engines {
			others = append(others, e.cfg)
		}
	}
	for _, ec := range others {
		if ec.Name == cfg.Name {
			return fmt.Errorf("zmqtransport: engine %q already configured", cfg.Name)
		}
	}
	if err := CheckLayout(append(slices.Clone(others), cfg)); err != nil {
		return err
	}
	if !s.started {
		s.cfg.Engines = append(s.cfg.Engines, cfg)
		return nil
	}
	return s.addEngineLocked(cfg)
}

func (s *Subscriber) addEngineLocked(cfg EngineConfig) error {
	if _, ok := s.engines[cfg.Name]; ok {
		return fmt.Errorf("zmqtransport: engine %q already configured", cfg.Name)
	}
	l, err := s.pickLoop()
	if err != nil {
		return err
	}
	e := &engine{cfg: cfg, loop: l}
	err = l.call(func() error {
		for r := range cfg.Ranks {
			st, err := s.openConnectStream(l, cfg, r)
			if err != nil {
				for _, st := range e.streams {
					st.close()
					s.release(st)
				}
				e.streams = nil
				return err
			}
			e.streams = append(e.streams, st)
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.engines[cfg.Name] = e
	s.log.Info("zmqtransport: engine added", "pod", cfg.Name, "model", cfg.Model,
		"endpoint", cfg.Endpoint, "replay", cfg.ReplayEndpoint, "ranks", cfg.Ranks)
	return nil
}

// pickLoop returns the loop for a new engine: a new loop while fewer than
// Pollers exist, else the one serving the fewest engines.
func (s *Subscriber) pickLoop() (*ioLoop, error) {
	if len(s.loops) < s.cfg.Pollers {
		l, err := newIOLoop(s, "engines-"+strconv.Itoa(len(s.loops)))
		if err != nil {
			return nil, err
		}
		s.loops = append(s.loops, l)
		return l, nil
	}
	load := make(map[*ioLoop]int, len(s.loops))
	for _, e := range s.engines {
		load[e.loop]++
	}
	best := s.loops[0]
	for _, l := range s.loops[1:] {
		if load[l] < load[best] {
			best = l
		}
	}
	return best, nil
}

// RemoveEngine stops reading the named engine and resets each of its ranks
// (Sink.Reset with ResetRemoved) once its last batch has been applied. In
// bind mode it forgets the streams discovered for that pod (they return if
// the pod keeps publishing). It reports whether anything was removed.
func (s *Subscriber) RemoveEngine(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started || s.closed {
		n := len(s.cfg.Engines)
		s.cfg.Engines = slices.DeleteFunc(s.cfg.Engines, func(ec EngineConfig) bool { return ec.Name == name })
		return len(s.cfg.Engines) != n
	}
	removed := false
	if e, ok := s.engines[name]; ok {
		delete(s.engines, name)
		s.cfg.Engines = slices.DeleteFunc(s.cfg.Engines, func(ec EngineConfig) bool { return ec.Name == name })
		_ = e.loop.call(func() error {
			for _, st := range e.streams {
				st.remove()
			}
			return nil
		})
		removed = true
	}
	if ln := s.listener; ln != nil {
		var n int
		_ = ln.loop.call(func() error {
			n = ln.removePod(name)
			return nil
		})
		removed = removed || n > 0
	}
	if removed {
		s.log.Info("zmqtransport: engine removed", "pod", name)
	}
	return removed
}

// SetEngineAllow replaces the engine allow rules (bind mode), on a
// Subscriber built with rules or with EngineAllowDynamic. Connections
// stay; their messages are judged by the new rules from the next one on.
// An empty list refuses every engine. On a Subscriber built with static
// rules, the handshake check keeps the rules it started with: libzmq
// does not retry a refused peer, so use EngineAllowDynamic for rules
// that admit new addresses.
func (s *Subscriber) SetEngineAllow(rules []AllowRule) error {
	a, err := compileAllowList(rules)
	if err != nil {
		return err
	}
	if a == nil {
		a = &allowList{exact: map[string][]netip.Prefix{}}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return errors.New("zmqtransport: subscriber closed")
	case s.allow == nil:
		return errors.New("zmqtransport: engine allow rules cannot be set on a subscriber built without them (set EngineAllow or EngineAllowDynamic)")
	}
	s.allow = a
	s.cfg.EngineAllow = slices.Clone(rules)
	if ln := s.listener; ln != nil {
		return ln.loop.call(func() error {
			ln.allow = a
			// The verdicts cached per route were the old rules'.
			for _, rt := range ln.routes {
				rt.srcOK, rt.srcBad = "", ""
			}
			return nil
		})
	}
	return nil
}

// ListenEndpoint returns the listen socket's bound endpoint (rank 0's
// port), with an ephemeral port resolved ("" without a listen socket or
// before Start).
func (s *Subscriber) ListenEndpoint() string {
	ln := s.listenerView.Load()
	if ln == nil {
		return ""
	}
	return ln.ctr.snapshot().Endpoint
}

// Streams returns a snapshot of every stream's counters, sorted by pod,
// rank and model. It takes no lock that the I/O loops hold for long. Each
// field is read atomically, but not all of a stream's fields at one
// instant: a snapshot taken while a batch or replay reply is being handled
// may show part of its effect.
func (s *Subscriber) Streams() []kvevents.StreamStats {
	s.regMu.Lock()
	out := make([]kvevents.StreamStats, 0, len(s.streams))
	for c := range s.streams {
		out = append(out, c.snapshot())
	}
	s.regMu.Unlock()
	slices.SortFunc(out, compareStreams)
	return out
}

// ListenerStats returns the listen socket's counters; ok is false without
// a listen socket.
func (s *Subscriber) ListenerStats() (ls kvevents.ListenerStats, ok bool) {
	ln := s.listenerView.Load()
	if ln == nil {
		return kvevents.ListenerStats{}, false
	}
	return ln.ctr.snapshot(), true
}

// claim makes st the owner of id, so no two streams ever call the Sink for
// the same engine; it fails if another stream owns id.
func (s *Subscriber) claim(id kvevents.EngineID, st *stream) bool {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	if o, ok := s.owners[id]; ok && o != st {
		return false
	}
	s.owners[id] = st
	return true
}

// register publishes st's counters to Streams.
func (s *Subscriber) register(st *stream) {
	s.regMu.Lock()
	s.streams[st.ctr] = struct{}{}
	s.regMu.Unlock()
}

// rename moves st's ownership from its current identity to id.
func (s *Subscriber) rename(st *stream, id kvevents.EngineID) bool {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	if o, ok := s.owners[id]; ok && o != st {
		return false
	}
	if s.owners[st.id] == st {
		delete(s.owners, st.id)
	}
	s.owners[id] = st
	return true
}

// takeResume returns the resumed position of id, once: a stream that is
// removed and comes back starts fresh (its engine was reset).
func (s *Subscriber) takeResume(id kvevents.EngineID) (kvevents.Position, bool) {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	p, ok := s.resume[id]
	delete(s.resume, id)
	return p, ok
}

// resumeIDs returns the engines of the positions not yet taken.
func (s *Subscriber) resumeIDs() []kvevents.EngineID {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	ids := make([]kvevents.EngineID, 0, len(s.resume))
	for id := range s.resume {
		ids = append(ids, id)
	}
	return ids
}

// release forgets st's identity and counters.
func (s *Subscriber) release(st *stream) {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	if s.owners[st.id] == st {
		delete(s.owners, st.id)
	}
	delete(s.streams, st.ctr)
}

// mono returns monotonic nanoseconds for replay deadlines.
func (s *Subscriber) mono() int64 { return int64(time.Since(s.epoch)) }

// inprocName returns a fresh inproc endpoint name in the subscriber's
// context.
func (s *Subscriber) inprocName(kind string) string {
	return "inproc://zmqtransport-" + kind + "-" + strconv.FormatUint(s.names.Add(1), 10)
}

// newSocket creates a socket with the options every kvindex socket wants:
// no linger (shutdown never waits on unsent data), a deep receive queue,
// reconnect backoff, a frame size cap.
func (s *Subscriber) newSocket(t zmq.Type) (*zmq.Socket, error) {
	sock, err := s.zctx.NewSocket(t)
	if err != nil {
		return nil, fmt.Errorf("zmqtransport: new %v socket: %w", t, err)
	}
	set := []error{sock.SetLinger(0)}
	if t == zmq.SUB || t == zmq.DEALER {
		set = append(set,
			sock.SetRcvhwm(s.rcvHWM(t)),
			sock.SetReconnectIvl(s.cfg.ReconnectIvl),
			sock.SetReconnectIvlMax(s.cfg.ReconnectIvlMax),
			sock.SetMaxmsgsize(s.cfg.MaxMsgSize),
		)
	}
	if t == zmq.SUB && s.cfg.HeartbeatInterval > 0 {
		set = append(set,
			sock.SetHeartbeatIvl(s.cfg.HeartbeatInterval),
			sock.SetHeartbeatTimeout(3*s.cfg.HeartbeatInterval),
		)
	}
	if err := errors.Join(set...); err != nil {
		sock.Close()
		return nil, fmt.Errorf("zmqtransport: socket options: %w", err)
	}
	return sock, nil
}

// rcvHWM is a socket type's receive high-water mark: a replay answers
// with up to the engine's whole buffer at once, which the DEALER must
// hold, or the tail of the replay would be lost.
func (s *Subscriber) rcvHWM(t zmq.Type) int {
	if t == zmq.DEALER {
		return max(s.cfg.RcvHWM, DefaultReplayHWM)
	}
	return s.cfg.RcvHWM
}

// openSUB creates a SUB socket subscribed to topic and a monitor reporting
// its connection events, then attaches the socket (Connect or Bind). The
// monitor exists before the attachment, or the first event would be lost.
func (s *Subscriber) openSUB(topic string, events zmq.Event, attach func(*zmq.Socket) error) (sub, mon *zmq.Socket, err error) {
	sub, err = s.newSocket(zmq.SUB)
	if err != nil {
		return nil, nil, err
	}
	if err := sub.SetSubscribe(topic); err != nil {
		sub.Close()
		return nil, nil, fmt.Errorf("zmqtransport: subscribe: %w", err)
	}
	if mon, err = s.openMonitor(sub, events); err != nil {
		sub.Close()
		return nil, nil, err
	}
	if err := attach(sub); err != nil {
		closeMonitored(sub, mon)
		return nil, nil, err
	}
	return sub, mon, nil
}

// openMonitor makes libzmq report sock's connection events on a PAIR
// socket it returns.
func (s *Subscriber) openMonitor(sock *zmq.Socket, events zmq.Event) (*zmq.Socket, error) {
	addr := s.inprocName("monitor")
	if err := sock.Monitor(addr, events); err != nil {
		return nil, fmt.Errorf("zmqtransport: socket monitor: %w", err)
	}
	mon, err := s.zctx.NewSocket(zmq.PAIR)
	if err != nil {
		return nil, fmt.Errorf("zmqtransport: monitor socket: %w", err)
	}
	if err := errors.Join(mon.SetLinger(0), mon.Connect(addr)); err != nil {
		mon.Close()
		return nil, fmt.Errorf("zmqtransport: monitor socket: %w", err)
	}
	return mon, nil
}

// closeMonitored stops sock's monitor and closes both sockets.
func closeMonitored(sock, mon *zmq.Socket) {
	if sock != nil {
		_ = sock.Monitor("", 0)
		sock.Close()
	}
	if mon != nil {
		mon.Close()
	}
}

// Checkpoint parks every I/O loop between two messages, so that no Sink
// call is in flight and each stream's position is exactly what its Sink
// has applied; calls fn with the positions of the streams that have one
// (they applied at least one batch, or were resumed and not reset since:
// a position whose engine has not shown up yet is carried forward),
// sorted by engine; then lets the loops go on. Ingest
// waits while fn runs, so fn should only copy what it needs (write the
// index snapshot to a buffer or a file) and leave slow work (fsync) for
// after it returns. fn must not call the Subscriber.
func (s *Subscriber) Checkpoint(fn func([]kvevents.Position) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started || s.closed {
		return errors.New("zmqtransport: checkpoint of a subscriber that is not running")
	}
	loops := slices.Clone(s.loops)
	if s.listener != nil {
		loops = append(loops, s.listener.loop)
	}
	release := make(chan struct{})
	defer close(release)
	var parked sync.WaitGroup
	for _, l := range loops {
		parked.Add(1)
		if !l.post(func() { parked.Done(); <-release }) {
			parked.Done()
		}
	}
	parked.Wait()
	// Every loop is parked (or stopped): the streams' sequencers are
	// quiet, and the channel operations above order their last writes
	// before these reads.
	s.regMu.Lock()
	pos := make([]kvevents.Position, 0, len(s.owners))
	for id, st := range s.owners {
		if seq, print, h, ok := st.seq.Position(); ok {
			pos = append(pos, kvevents.Position{Engine: id, Seq: seq, Print: print, Health: h})
		}
	}
	s.regMu.Unlock()
	slices.SortFunc(pos, func(a, b kvevents.Position) int { return compareEngineIDs(a.Engine, b.Engine) })
	return fn(pos)
}

// sweepListener asks the listener, if any, to drop its unproven streams
// (slots.go) and to forget its departed engines (SubscriberConfig.
// ForgetAfter). Called from the trimmer goroutine.
func (s *Subscriber) sweepListener() {
	ln := s.listenerView.Load()
	if ln == nil {
		return
	}
	ln.loop.post(func() {
		now := s.mono()
		ln.dropUnproven(now)
		if s.cfg.ForgetAfter >= 0 {
			ln.forgetDeparted(now)
		}
	})
}

// payloadSink returns sink as a PayloadSink when it is one, so that the
// delivery path asks once rather than per batch.
func payloadSink(sink kvevents.Sink) kvevents.PayloadSink {
	ps, _ := sink.(kvevents.PayloadSink)
	return ps
}
