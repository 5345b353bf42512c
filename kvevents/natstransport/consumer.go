package natstransport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvindex/kvindex/kvevents"
)

// DefaultRelayTimeout is how long a consumer waits for a relay's
// heartbeat before it reports the relay's streams disconnected.
const DefaultRelayTimeout = 5 * time.Second

// recentPrints is how many (seq, print) pairs a consumer remembers per
// engine rank, to tell a re-published batch (same print) from another
// engine process's batch under a seq already applied.
const recentPrints = 256

// pullMessages is how many messages a consumer asks the server for at a
// time (it asks again once half are in). Catching up, the client's
// default of 500 leaves the handler waiting on the server more often;
// 2,000 records (about 2 MB buffered) applied faster in
// BenchmarkConsumerCatchUp (README.md), larger pulls no faster still.
const pullMessages = 2000

// maxBeats bounds the engine ranks a consumer tracks heartbeats of.
const maxBeats = 1 << 16

// ConsumerConfig configures a Consumer. A zero field takes its default.
type ConsumerConfig struct {
	Stream string // default DefaultStream
	Model  string // required: the consumer reads kvevents.<model>.>
	// StartSeq is the first stream sequence to read; 0 reads everything
	// the stream holds. After a snapshot restore it is the snapshot's
	// stream sequence + 1.
	StartSeq uint64
	// Resume seeds each engine rank's state with the position it had
	// when the snapshot was taken, so the batches after StartSeq continue
	// it rather than start it over.
	Resume       []kvevents.Position
	Flavor       kvevents.Flavor
	Limits       kvevents.Limits
	RelayTimeout time.Duration // default DefaultRelayTimeout
	// Auth, if set, makes the consumer apply only records, and heed only
	// heartbeats, that a relay with the same key signed (see Auth); the
	// others are dropped and counted (ConsumerStats.Forged).
	Auth *Auth
}

// ConsumerStats counts what a consumer read that belongs to no engine
// rank (per-rank counters are in Streams).
type ConsumerStats struct {
	Messages   uint64 // messages read
	Malformed  uint64 // bad subject or headers: dropped
	Redelivery uint64 // messages at or before AppliedSeq: dropped
	BadBeats   uint64 // undecodable heartbeats
	Forged     uint64 // records and heartbeats that failed authentication (ConsumerConfig.Auth): dropped
	AppliedSeq uint64
}

// Consumer reads one model's records from the stream with its own ordered
// consumer (no server-side state to share or clean up: each replica
// replays what it needs) and applies them to a kvevents.Sink, checking
// each engine rank's sequence as the ZMQ transport does.
type Consumer struct {
	js   jetstream.JetStream
	cfg  ConsumerConfig
	sink kvevents.Sink
	log  *slog.Logger
	dec  kvevents.Decoder

	// mu serialises message processing; Checkpoint holds it to park
	// ingest.
	mu      sync.Mutex
	batch   kvevents.Batch
	started bool
	closed  bool
	target  uint64 // last stream seq of the model at Start
	cc      jetstream.ConsumeContext
	hbSub   *nats.Subscription

	regMu sync.RWMutex // guards engines' membership (Streams reads it)
	eng   map[kvevents.EngineID]*engState
	// bySubject maps a record's subject to its engine rank's state
	// (guarded by mu), so that a record parses its subject only the first
	// time its rank is seen: parsing splits and unescapes, allocating, on
	// every message of a catch-up. It holds the ranks eng holds.
	bySubject map[string]*engState

	hbMu  sync.Mutex
	beats map[kvevents.EngineID]beat

	applied                                            atomic.Uint64
	messages, malformed, redelivered, badBeats, forged atomic.Uint64
	caughtUp                                           chan struct{}
	caughtOnce                                         sync.Once
}

type beat struct {
	at        time.Time
	connected bool
}

// engState is one engine rank's sequence state (guarded by Consumer.mu)
// and counters (atomic: Streams reads them without the lock).
type engState struct {
	id        kvevents.EngineID
	has       bool // last is set
	last      uint64
	lastPrint uint64
	recent    [recentPrints]struct{ seq, print uint64 }
	nRecent   int
	first     uint64 // print of the batch under seq 0, when seen (0: not)
	own       kvevents.Health
	relay     kvevents.Health
	// told, toldHealth: the health last passed to a kvevents.HealthSink.
	told       bool
	toldHealth kvevents.Health

	batches, events, decodeErrors, unknownEvents atomic.Uint64
	gaps, lost, duplicates, restarts, resets     atomic.Uint64
	lastSeq                                      atomic.Uint64
	lastEvent                                    atomic.Int64
	clock                                        kvevents.BatchClock
	health                                       atomic.Uint32
}

// NewConsumer returns a consumer applying cfg.Model's records to sink.
func NewConsumer(js jetstream.JetStream, cfg ConsumerConfig, sink kvevents.Sink, log *slog.Logger) (*Consumer, error) {
	if js == nil || sink == nil {
		return nil, errors.New("natstransport: consumer needs a JetStream context and a sink")
	}
	if cfg.Model == "" {
		return nil, errors.New("natstransport: consumer needs a model")
	}
	if cfg.RelayTimeout < 0 {
		return nil, fmt.Errorf("natstransport: negative relay timeout %v", cfg.RelayTimeout)
	}
	if cfg.Stream == "" {
		cfg.Stream = DefaultStream
	}
	if cfg.RelayTimeout == 0 {
		cfg.RelayTimeout = DefaultRelayTimeout
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Consumer{
		js: js, cfg: cfg, sink: sink,
		log:       log.With(slog.String("model", cfg.Model), slog.String("stream", cfg.Stream)),
		dec:       kvevents.Decoder{Flavor: cfg.Flavor, Limits: cfg.Limits},
		eng:       map[kvevents.EngineID]*engState{},
		bySubject: map[string]*engState{},
		beats:     map[kvevents.EngineID]beat{},
		caughtUp:  make(chan struct{}),
	}
	if cfg.StartSeq > 0 {
		// What a restored index holds: everything before StartSeq.
		c.applied.Store(cfg.StartSeq - 1)
	}
	for _, p := range cfg.Resume {
		if p.Engine.Model != cfg.Model {
			continue
		}
		st := c.state(p.Engine)
		st.has, st.last, st.lastPrint = true, p.Seq, p.Print
		st.remember(p.Seq, p.Print)
		st.own = p.Health
		st.lastSeq.Store(p.Seq)
		st.publishHealth()
	}
	return c, nil
}

// Start subscribes to the relays' heartbeats and starts reading the
// stream from StartSeq.
func (c *Consumer) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started || c.closed {
		return errors.New("natstransport: consumer already started or closed")
	}
	c.started = true
	s, err := c.js.Stream(ctx, c.cfg.Stream)
	if err != nil {
		return fmt.Errorf("natstransport: stream %s: %w", c.cfg.Stream, err)
	}
	filter := ModelFilter(c.cfg.Model)
	// CaughtUp's target: the model's last record now.
	last, err := s.GetLastMsgForSubject(ctx, filter)
	switch {
	case err == nil:
		c.target = last.Sequence
	case errors.Is(err, jetstream.ErrMsgNotFound):
		c.target = 0
	default:
		info, ierr := s.Info(ctx)
		if ierr != nil {
			return fmt.Errorf("natstransport: stream %s: %w", c.cfg.Stream, err)
		}
		c.target = info.State.LastSeq
	}
	if c.cfg.StartSeq > 0 {
		if info, err := s.Info(ctx); err == nil && info.State.FirstSeq > c.cfg.StartSeq {
			c.log.Warn("natstransport: the stream no longer holds the records from the start sequence (max age or bytes); streams resumed across the loss will report gaps",
				slog.Uint64("start_seq", c.cfg.StartSeq), slog.Uint64("first_seq", info.State.FirstSeq))
		}
	}
	if c.target == 0 || c.target < c.cfg.StartSeq {
		c.caughtOnce.Do(func() { close(c.caughtUp) })
	}
	c.hbSub, err = c.js.Conn().Subscribe(HeartbeatPrefix+"."+EscapeToken(c.cfg.Model)+".*", c.onHeartbeat)
	if err != nil {
		return fmt.Errorf("natstransport: heartbeat subscription: %w", err)
	}
	occ := jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverAllPolicy}
	if c.cfg.StartSeq > 0 {
		occ.DeliverPolicy, occ.OptStartSeq = jetstream.DeliverByStartSequencePolicy, c.cfg.StartSeq
	}
	cons, err := s.OrderedConsumer(ctx, occ)
	if err != nil {
		_ = c.hbSub.Unsubscribe()
		return fmt.Errorf("natstransport: ordered consumer: %w", err)
	}
	c.cc, err = cons.Consume(c.onMessage, jetstream.PullMaxMessages(pullMessages),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			c.log.Debug("natstransport: consumer", slog.Any("err", err))
		}))
	if err != nil {
		_ = c.hbSub.Unsubscribe()
		return fmt.Errorf("natstransport: consume: %w", err)
	}
	c.log.Info("natstransport: consuming", slog.Uint64("start_seq", c.cfg.StartSeq), slog.Uint64("caught_up_at", c.target),
		slog.Int("resumed", len(c.cfg.Resume)))
	return nil
}

func (c *Consumer) onMessage(msg jetstream.Msg) {
	md, err := msg.Metadata()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.messages.Add(1)
	if err != nil {
		c.bad("natstransport: message without JetStream metadata dropped", msg.Subject(), err)
		return
	}
	seq := md.Sequence.Stream
	if seq <= c.applied.Load() {
		// The ordered consumer never redelivers; should it after a
		// recreation, nothing is applied twice.
		c.redelivered.Add(1)
		return
	}
	c.process(msg.Subject(), msg.Headers(), msg.Data())
	c.applied.Store(seq)
	if seq >= c.target || md.NumPending == 0 {
		c.caughtOnce.Do(func() {
			close(c.caughtUp)
			c.log.Info("natstransport: caught up", slog.Uint64("stream_seq", seq))
		})
	}
}

func (c *Consumer) bad(msg, subject string, err error) {
	n := c.malformed.Add(1)
	if logEvery(n) {
		c.log.Warn(msg, slog.String("subject", subject), slog.Any("err", err), slog.Uint64("count", n))
	}
}

// authentic reports whether a message passes ConsumerConfig.Auth
// (always, without one); a forgery is counted and logged.
func (c *Consumer) authentic(what, subject string, h nats.Header, data []byte) bool {
	if c.cfg.Auth == nil {
		return true
	}
	err := c.cfg.Auth.Verify(subject, h, data)
	if err == nil {
		return true
	}
	if n := c.forged.Add(1); logEvery(n) {
		c.log.Warn("natstransport: "+what+" refused: not signed with kvindex's key; dropped", slog.String("subject", subject), slog.Any("err", err), slog.Uint64("count", n))
	}
	return false
}

// process applies one record. Callers hold mu.
func (c *Consumer) process(subject string, h nats.Header, data []byte) {
	if !c.authentic("record", subject, h, data) {
		return
	}
	st := c.bySubject[subject]
	var id kvevents.EngineID
	if st == nil {
		var err error
		id, err = ParseSubject(subject)
		if err == nil && id.Model != c.cfg.Model {
			err = fmt.Errorf("model %q, want %q", id.Model, c.cfg.Model)
		}
		if err != nil {
			c.bad("natstransport: record with a bad subject dropped", subject, err)
			return
		}
	}
	rec, err := ParseHeader(h)
	if err != nil {
		c.bad("natstransport: record with bad headers dropped", subject, err)
		return
	}
	if st == nil {
		// A rank is registered by its first well-formed record only.
		st = c.state(id)
		c.bySubject[subject] = st
	}
	st.relay = rec.Health
	defer c.tellHealth(st)
	defer st.publishHealth()
	switch rec.Kind {
	case KindReset:
		c.resetEngine(st, rec.Reason, "reset record")
		if rec.Reason == kvevents.ResetRemoved {
			c.regMu.Lock()
			delete(c.eng, st.id)
			c.regMu.Unlock()
			delete(c.bySubject, subject)
		}
	case KindHole:
		st.gaps.Add(1)
		addSaturating(&st.lost, span(rec.From, rec.To))
		st.own = kvevents.HealthDegraded
		if !st.has || rec.To > st.last {
			st.has, st.last, st.lastPrint = true, rec.To, 0
			st.lastSeq.Store(rec.To)
		}
		c.logEngine(slog.LevelWarn, st, "natstransport: relay dropped batches (hole record)",
			slog.Uint64("from", rec.From), slog.Uint64("to", rec.To))
	case KindBatch:
		c.batchRecord(st, rec, data)
	}
}

// batchRecord checks a batch's place in its engine's sequence and applies
// it. Callers hold mu.
func (c *Consumer) batchRecord(st *engState, rec Record, data []byte) {
	if st.has {
		switch {
		case rec.Seq == st.last+1:
		case rec.Seq > st.last+1:
			st.gaps.Add(1)
			addSaturating(&st.lost, rec.Seq-st.last-1)
			st.own = kvevents.HealthDegraded
			c.logEngine(slog.LevelWarn, st, "natstransport: sequence gap",
				slog.Uint64("expected", st.last+1), slog.Uint64("got", rec.Seq))
		default: // rec.Seq <= st.last
			p, known := st.printOf(rec.Seq)
			switch {
			case known && p == rec.Print:
				st.duplicates.Add(1)
				return
			case known || rec.Seq == 0:
				st.restarts.Add(1)
				c.resetEngine(st, kvevents.ResetRestart, "sequence went back to a batch not applied")
			default:
				// Too old to compare: a re-publish from beyond the
				// remembered window (a relay replaying an engine's
				// buffer after the duplicate window). A new engine
				// process starts at 0, or comes after a reset record.
				st.duplicates.Add(1)
				c.logEngine(slog.LevelInfo, st, "natstransport: late batch dropped (before the last applied, print not remembered)",
					slog.Uint64("seq", rec.Seq), slog.Uint64("last", st.last))
				return
			}
		}
	}
	if !st.has {
		// A fresh stream: complete from its first batch, else joined
		// mid-stream (the stream's MaxAge took the beginning).
		st.own = kvevents.HealthOK
		if rec.Seq != 0 {
			st.own = kvevents.HealthUnconfirmed
			c.logEngine(slog.LevelInfo, st, "natstransport: joined mid-stream; earlier blocks unknown", slog.Uint64("seq", rec.Seq))
		}
	}
	st.has, st.last, st.lastPrint = true, rec.Seq, rec.Print
	st.remember(rec.Seq, rec.Print)
	st.lastSeq.Store(rec.Seq)
	if err := c.dec.Decode(data, &c.batch); err != nil {
		n := st.decodeErrors.Add(1)
		st.own = kvevents.HealthDegraded
		if logEvery(n) {
			c.logEngine(slog.LevelWarn, st, "natstransport: undecodable batch dropped", slog.Uint64("seq", rec.Seq), slog.Any("err", err))
		}
		return
	}
	cleared := 0
	for i := range c.batch.Events {
		if c.batch.Events[i].Kind == kvevents.AllBlocksCleared {
			cleared++
		}
	}
	st.batches.Add(1)
	st.events.Add(uint64(len(c.batch.Events)))
	if c.batch.Skipped > 0 {
		st.unknownEvents.Add(uint64(c.batch.Skipped))
	}
	now := time.Now().UnixNano()
	st.lastEvent.Store(now)
	st.clock.Note(c.batch.TS, now)
	c.sink.Apply(st.id, rec.Seq, c.batch.Events)
	if cleared > 0 {
		st.resets.Add(uint64(cleared))
		st.own = kvevents.HealthOK // the engine's state is known again: empty, then this batch
	}
}

// resetEngine forgets an engine's blocks and sequence. Callers hold mu.
func (c *Consumer) resetEngine(st *engState, reason kvevents.ResetReason, why string) {
	st.resets.Add(1)
	if reason == kvevents.ResetRestart {
		c.logEngine(slog.LevelWarn, st, "natstransport: engine restarted; resetting its blocks", slog.String("why", why), slog.Uint64("last", st.last))
	} else {
		c.logEngine(slog.LevelInfo, st, "natstransport: engine reset", slog.String("reason", string(reason)))
	}
	c.sink.Reset(st.id, reason)
	st.has, st.last, st.lastPrint, st.nRecent, st.first = false, 0, 0, 0, 0
	st.own = kvevents.HealthOK
}

func (c *Consumer) logEngine(level slog.Level, st *engState, msg string, attrs ...slog.Attr) {
	if !c.log.Enabled(context.Background(), level) {
		return
	}
	base := []slog.Attr{slog.String("pod", st.id.Pod), slog.Int("dp_rank", st.id.DPRank)}
	c.log.LogAttrs(context.Background(), level, msg, append(base, attrs...)...)
}

func (c *Consumer) state(id kvevents.EngineID) *engState {
	c.regMu.RLock()
	st := c.eng[id]
	c.regMu.RUnlock()
	if st != nil {
		return st
	}
	st = &engState{id: id}
	c.regMu.Lock()
	c.eng[id] = st
	c.regMu.Unlock()
	return st
}

func (st *engState) remember(seq, print uint64) {
	if seq == 0 {
		st.first = print
	}
	st.recent[seq%recentPrints] = struct{ seq, print uint64 }{seq, print}
	st.nRecent = min(st.nRecent+1, recentPrints)
}

func (st *engState) printOf(seq uint64) (uint64, bool) {
	if seq == 0 && st.first != 0 {
		return st.first, true
	}
	if st.nRecent == 0 {
		return 0, false
	}
	e := st.recent[seq%recentPrints]
	if e.seq != seq || e.print == 0 {
		return 0, false
	}
	return e.print, true
}

// publishHealth makes the stream's health, the worse of the relay's view
// and the consumer's own, visible to Streams.
func (st *engState) publishHealth() {
	st.health.Store(uint32(max(st.own, st.relay)))
}

// tellHealth passes a change of the engine's health to a sink that wants
// it (kvevents.HealthSink), from the goroutine that applies its records;
// a change a heartbeat brought is passed on with the next record.
func (c *Consumer) tellHealth(st *engState) {
	h := kvevents.Health(st.health.Load())
	if hs, ok := c.sink.(kvevents.HealthSink); ok && (!st.told || h != st.toldHealth) {
		st.told, st.toldHealth = true, h
		hs.Health(st.id, h)
	}
}

func (c *Consumer) onHeartbeat(m *nats.Msg) {
	if !c.authentic("heartbeat", m.Subject, m.Header, m.Data) {
		return
	}
	var hb Heartbeat
	if err := json.Unmarshal(m.Data, &hb); err != nil {
		if n := c.badBeats.Add(1); logEvery(n) {
			c.log.Warn("natstransport: undecodable heartbeat", slog.String("subject", m.Subject), slog.Any("err", err))
		}
		return
	}
	now := time.Now()
	c.hbMu.Lock()
	defer c.hbMu.Unlock()
	for _, s := range hb.Streams {
		id := kvevents.EngineID{Model: c.cfg.Model, Pod: s.Pod, DPRank: s.Rank}
		if _, known := c.beats[id]; !known && len(c.beats) >= maxBeats {
			// Heartbeats are unauthenticated chatter: they must not
			// grow the consumer without bound.
			continue
		}
		c.beats[id] = beat{at: now, connected: s.Connected}
	}
}

// Streams implements the API server's stream source: one entry per engine
// rank the consumer has records (or a resumed position) of. Connected is
// false while the rank's relay has been silent for RelayTimeout, or says
// it has lost the engine.
func (c *Consumer) Streams() []kvevents.StreamStats {
	c.regMu.RLock()
	out := make([]kvevents.StreamStats, 0, len(c.eng))
	for _, st := range c.eng {
		stamp, lag := st.clock.Load()
		out = append(out, kvevents.StreamStats{
			Engine:            st.id,
			Endpoint:          "nats:" + BatchSubject(st.id),
			Batches:           st.batches.Load(),
			Events:            st.events.Load(),
			DecodeErrors:      st.decodeErrors.Load(),
			UnknownEvents:     st.unknownEvents.Load(),
			Gaps:              st.gaps.Load(),
			LostBatches:       st.lost.Load(),
			Duplicates:        st.duplicates.Load(),
			Restarts:          st.restarts.Load(),
			Resets:            st.resets.Load(),
			LastSeq:           st.lastSeq.Load(),
			LastEventUnixNano: st.lastEvent.Load(),
			Health:            kvevents.Health(st.health.Load()),

			LastBatchStampUnixNano: stamp,
			LastBatchLag:           lag,
		})
	}
	c.regMu.RUnlock()
	now := time.Now()
	c.hbMu.Lock()
	for i := range out {
		b, ok := c.beats[out[i].Engine]
		out[i].Connected = ok && b.connected && now.Sub(b.at) < c.cfg.RelayTimeout
	}
	c.hbMu.Unlock()
	slices.SortFunc(out, func(a, b kvevents.StreamStats) int { return compareEngineIDs(a.Engine, b.Engine) })
	return out
}

// Stats returns the counters of what belongs to no engine rank.
func (c *Consumer) Stats() ConsumerStats {
	return ConsumerStats{
		Messages: c.messages.Load(), Malformed: c.malformed.Load(), Redelivery: c.redelivered.Load(),
		BadBeats: c.badBeats.Load(), Forged: c.forged.Load(), AppliedSeq: c.applied.Load(),
	}
}

// CaughtUp is closed once the consumer has applied the model's records
// up to the last one the stream held at Start (at once if it held none
// from StartSeq on).
func (c *Consumer) CaughtUp() <-chan struct{} { return c.caughtUp }

// AppliedSeq is the stream sequence of the last message processed: the
// index sequence (a snapshot taken now resumes from AppliedSeq+1).
func (c *Consumer) AppliedSeq() uint64 { return c.applied.Load() }

// Checkpoint parks message processing, calls fn with AppliedSeq and the
// position of every engine rank, consistent with what the sink has
// applied, then lets processing go on. fn should copy what it needs
// (write the index snapshot to a buffer) and return; it must not call the
// Consumer.
func (c *Consumer) Checkpoint(fn func(streamSeq uint64, pos []kvevents.Position) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errors.New("natstransport: checkpoint of a closed consumer")
	}
	c.regMu.RLock()
	pos := make([]kvevents.Position, 0, len(c.eng))
	for id, st := range c.eng {
		if st.has {
			pos = append(pos, kvevents.Position{Engine: id, Seq: st.last, Print: st.lastPrint, Health: kvevents.Health(st.health.Load())})
		}
	}
	c.regMu.RUnlock()
	slices.SortFunc(pos, func(a, b kvevents.Position) int { return compareEngineIDs(a.Engine, b.Engine) })
	return fn(c.applied.Load(), pos)
}

// Close stops reading; once it returns the sink is not called again.
func (c *Consumer) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	cc, sub := c.cc, c.hbSub
	c.mu.Unlock()
	if cc != nil {
		cc.Stop()
		<-cc.Closed()
	}
	if sub != nil {
		if err := sub.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, nats.ErrBadSubscription) {
			return err
		}
	}
	return nil
}
