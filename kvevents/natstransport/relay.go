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
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvindex/kvindex/kvevents"
)

// Relay defaults.
const (
	// DefaultRelayBuffer is how many bytes of records a relay holds while
	// NATS is away before it drops batches (and records a hole).
	DefaultRelayBuffer int64 = 64 << 20
	// DefaultHeartbeat is the interval of a relay's heartbeats.
	DefaultHeartbeat = time.Second
	// DefaultPublishTimeout bounds the wait for one publish's ack before
	// it is retried.
	DefaultPublishTimeout = 5 * time.Second
	// DefaultCloseTimeout bounds how long Close keeps publishing what is
	// still buffered.
	DefaultCloseTimeout = 5 * time.Second
)

// recordOverhead is what a record is charged beyond its payload in the
// buffer: its headers and bookkeeping, roughly.
const recordOverhead = 256

// RelayConfig configures a Relay. A zero field takes its default.
type RelayConfig struct {
	Stream    string // the stream name, for log lines; the subjects decide where records go
	Model     string // the model every engine of this relay serves (the subject's model token)
	MaxBuffer int64  // bytes held while NATS is away (default DefaultRelayBuffer)
	Heartbeat time.Duration
	// Auth, if set, signs every record and heartbeat (see Auth): the
	// replicas, given the same key, apply only what such relays wrote.
	Auth *Auth
	// PodIPs maps pod names to their IPs, sent with each record when
	// known (the consumer side's engine allow rules key on them).
	PodIPs map[string]string

	PublishTimeout time.Duration // default DefaultPublishTimeout
	CloseTimeout   time.Duration // default DefaultCloseTimeout
	// ID names this relay process in heartbeats and in the ids of its
	// reset and hole records (default: a random NUID).
	ID string
	// Tracer, if set, records a span for each record published
	// (SpanPublish), from its first attempt to JetStream's ack; nil: no
	// spans.
	Tracer trace.Tracer
}

// SpanPublish is one record's publishing, retries included.
const SpanPublish = "kvindex.relay.publish"

// RelayStats is a snapshot of a relay's counters.
type RelayStats struct {
	ID string
	// Published counts records JetStream acknowledged (batches, resets,
	// holes), Duplicates among them those it already held (a re-publish
	// after a reconnect or a relay restart).
	Published, Duplicates uint64
	Batches               uint64 // batches handed to the relay
	BufferedBytes         int64  // bytes of records waiting for their ack
	BufferedRecords       int
	DroppedBatches        uint64 // batches dropped because the buffer was full
	Holes                 uint64 // hole records queued for dropped batches
	PublishErrors         uint64 // publish attempts that failed (each is retried)
	NATSConnected         bool
}

// Relay is a kvevents.PayloadSink that publishes every batch it is given,
// unchanged, to JetStream. ApplyPayload only queues: one publisher
// goroutine drains the queue in order, one publish in flight, each
// waiting for its ack. That keeps each engine's batches in sequence
// order in the stream across reconnects (a batch retried after a lost ack
// can never land behind its successor); JetStream's dedupe by Nats-Msg-Id
// makes the retry of a batch that was in fact stored a no-op.
type Relay struct {
	js    jetstream.JetStream
	cfg   RelayConfig
	log   *slog.Logger
	model string

	streamsFn atomic.Pointer[func() []kvevents.StreamStats]

	mu      sync.Mutex
	queue   []*record // FIFO; queue[0] is being published
	bytes   int64
	holes   map[kvevents.EngineID]*hole // dropped batches not yet announced
	streams map[kvevents.EngineID]*relayStream
	ctrlN   uint64
	started bool
	closing bool
	wake    chan struct{}

	cancel    context.CancelFunc
	pubDone   chan struct{}
	hbDone    chan struct{}
	closeOnce sync.Once

	published, duplicates, batches atomic.Uint64
	dropped, holesQueued, pubErrs  atomic.Uint64
	buffered                       atomic.Int64
	bufferedRecs                   atomic.Int64
}

type record struct {
	engine kvevents.EngineID
	kind   Kind
	seq    uint64
	msg    *nats.Msg
	size   int64
}

type hole struct{ from, to uint64 }

// relayStream is what a relay knows of one engine rank.
type relayStream struct {
	lastSeq   uint64 // last batch acked
	published bool
	health    kvevents.Health // from the ZMQ subscriber's Streams
	connected bool
	podIP     string
}

// NewRelay returns a relay publishing to js. It publishes nothing until
// Start; batches given before are queued.
func NewRelay(js jetstream.JetStream, cfg RelayConfig, log *slog.Logger) (*Relay, error) {
	if js == nil {
		return nil, errors.New("natstransport: relay needs a JetStream context")
	}
	if cfg.Model == "" {
		return nil, errors.New("natstransport: relay needs a model")
	}
	if cfg.MaxBuffer < 0 || cfg.Heartbeat < 0 || cfg.PublishTimeout < 0 || cfg.CloseTimeout < 0 {
		return nil, errors.New("natstransport: negative relay buffer, heartbeat or timeout")
	}
	if cfg.Stream == "" {
		cfg.Stream = DefaultStream
	}
	if cfg.MaxBuffer == 0 {
		cfg.MaxBuffer = DefaultRelayBuffer
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.PublishTimeout == 0 {
		cfg.PublishTimeout = DefaultPublishTimeout
	}
	if cfg.CloseTimeout == 0 {
		cfg.CloseTimeout = DefaultCloseTimeout
	}
	if cfg.ID == "" {
		cfg.ID = nuid.Next()
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Relay{
		js: js, cfg: cfg, model: cfg.Model,
		log:     log.With(slog.String("relay", cfg.ID), slog.String("model", cfg.Model)),
		holes:   map[kvevents.EngineID]*hole{},
		streams: map[kvevents.EngineID]*relayStream{},
		wake:    make(chan struct{}, 1),
	}, nil
}

// ID returns the relay's id (RelayConfig.ID or the generated one).
func (r *Relay) ID() string { return r.cfg.ID }

// SetStreams gives the relay its ZMQ subscriber's Streams: the health and
// connection of each engine rank, sent in record headers and heartbeats.
func (r *Relay) SetStreams(f func() []kvevents.StreamStats) {
	r.streamsFn.Store(&f)
	r.refreshStreams()
}

// refreshStreams copies health and connection from the ZMQ side.
func (r *Relay) refreshStreams() {
	fp := r.streamsFn.Load()
	if fp == nil || *fp == nil {
		return
	}
	stats := (*fp)()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range stats {
		id := s.Engine
		id.Model = r.model
		st := r.streamLocked(id)
		st.health, st.connected = s.Health, s.Connected
	}
}

func (r *Relay) streamLocked(id kvevents.EngineID) *relayStream {
	st := r.streams[id]
	if st == nil {
		st = &relayStream{connected: true, podIP: r.cfg.PodIPs[id.Pod]}
		r.streams[id] = st
	}
	return st
}

// Apply implements kvevents.Sink for a transport that does not hand over
// payloads: the events are encoded again (vLLM's array layout).
func (r *Relay) Apply(engine kvevents.EngineID, seq uint64, events []kvevents.Event) {
	b := kvevents.Batch{Events: events}
	payload, err := kvevents.AppendBatch(nil, &b, kvevents.EncodeOptions{Shape: kvevents.ShapeArray})
	if err != nil {
		r.log.Warn("natstransport: batch not encodable; dropped", slog.String("pod", engine.Pod), slog.Uint64("seq", seq), slog.Any("err", err))
		return
	}
	r.ApplyPayload(engine, seq, payload, events)
}

// ApplyPayload implements kvevents.PayloadSink: it queues the batch
// (copied) and returns. When the queue holds MaxBuffer bytes the batch is
// dropped instead, and the engine's hole grows; the hole is published
// before that engine's next batch (or when the queue has drained).
func (r *Relay) ApplyPayload(engine kvevents.EngineID, seq uint64, payload []byte, _ []kvevents.Event) {
	engine.Model = r.model
	r.batches.Add(1)
	size := int64(len(payload)) + recordOverhead
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.streamLocked(engine)
	if h := r.holes[engine]; h != nil {
		if r.bytes+recordOverhead+size > r.cfg.MaxBuffer {
			h.to = max(h.to, seq)
			r.dropped.Add(1)
			return
		}
		r.queueHoleLocked(engine, st, h)
	} else if r.bytes+size > r.cfg.MaxBuffer {
		r.holes[engine] = &hole{from: seq, to: seq}
		n := r.dropped.Add(1)
		r.log.Warn("natstransport: relay buffer full; dropping batches until it drains",
			slog.String("pod", engine.Pod), slog.Int("dp_rank", engine.DPRank), slog.Uint64("seq", seq),
			slog.Int64("buffered_bytes", r.bytes), slog.Uint64("dropped_total", n))
		return
	}
	print := kvevents.BatchPrint(payload)
	rec := Record{Kind: KindBatch, Seq: seq, Print: print, Health: st.health, PodIP: st.podIP, Relay: r.cfg.ID}
	msg := &nats.Msg{Subject: BatchSubject(engine), Header: rec.Header(), Data: slices.Clone(payload)}
	msg.Header.Set(jetstream.MsgIDHeader, MsgID(engine, seq, print))
	r.pushLocked(&record{engine: engine, kind: KindBatch, seq: seq, msg: msg, size: size})
}

// Reset implements kvevents.Sink: a reset record is queued whatever the
// buffer holds (it is small, and losing it would keep stale blocks), and a
// pending hole of the engine is forgotten (the reset supersedes it).
func (r *Relay) Reset(engine kvevents.EngineID, reason kvevents.ResetReason) {
	engine.Model = r.model
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.holes, engine)
	st := r.streamLocked(engine)
	r.pushLocked(r.controlLocked(engine, st, Record{Kind: KindReset, Reason: reason}))
	if reason == kvevents.ResetRemoved {
		delete(r.streams, engine)
	}
}

func (r *Relay) queueHoleLocked(engine kvevents.EngineID, st *relayStream, h *hole) {
	delete(r.holes, engine)
	r.log.Warn("natstransport: announcing dropped batches as a hole",
		slog.String("pod", engine.Pod), slog.Int("dp_rank", engine.DPRank),
		slog.Uint64("from", h.from), slog.Uint64("to", h.to))
	r.pushLocked(r.controlLocked(engine, st, Record{Kind: KindHole, From: h.from, To: h.to}))
	// Counted once queued, so that whoever reads Stats().Holes and then
	// BufferedRecords sees the hole among the buffered records until it
	// is published.
	r.holesQueued.Add(1)
}

func (r *Relay) controlLocked(engine kvevents.EngineID, st *relayStream, rec Record) *record {
	r.ctrlN++
	rec.Health, rec.PodIP, rec.Relay = st.health, st.podIP, r.cfg.ID
	msg := &nats.Msg{Subject: BatchSubject(engine), Header: rec.Header()}
	msg.Header.Set(jetstream.MsgIDHeader, controlMsgID(r.cfg.ID, r.ctrlN))
	return &record{engine: engine, kind: rec.Kind, msg: msg, size: recordOverhead}
}

func (r *Relay) pushLocked(rec *record) {
	if r.cfg.Auth != nil {
		r.cfg.Auth.Sign(rec.msg)
	}
	r.queue = append(r.queue, rec)
	r.bytes += rec.size
	r.buffered.Store(r.bytes)
	r.bufferedRecs.Store(int64(len(r.queue)))
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Start starts the publisher and the heartbeats. ctx bounds them; Close
// stops them.
func (r *Relay) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started || r.closing {
		return errors.New("natstransport: relay already started or closed")
	}
	r.started = true
	ctx, r.cancel = context.WithCancel(ctx)
	r.pubDone, r.hbDone = make(chan struct{}), make(chan struct{})
	go r.publishLoop(ctx)
	go r.heartbeatLoop(ctx)
	return nil
}

// next returns the record at the head of the queue, waiting for one; nil
// once closing with nothing left, or when ctx ends.
func (r *Relay) next(ctx context.Context) *record {
	for {
		r.mu.Lock()
		if len(r.queue) == 0 && len(r.holes) > 0 {
			// Drained: announce what was dropped now rather than at the
			// engine's next batch, which may never come.
			for _, id := range sortedHoles(r.holes) {
				r.queueHoleLocked(id, r.streamLocked(id), r.holes[id])
			}
		}
		if len(r.queue) > 0 {
			rec := r.queue[0]
			r.mu.Unlock()
			return rec
		}
		closing := r.closing
		r.mu.Unlock()
		if closing {
			return nil
		}
		select {
		case <-r.wake:
		case <-ctx.Done():
			return nil
		}
	}
}

func sortedHoles(m map[kvevents.EngineID]*hole) []kvevents.EngineID {
	ids := make([]kvevents.EngineID, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, compareEngineIDs)
	return ids
}

// pop removes the acknowledged head record.
func (r *Relay) pop(rec *record) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queue[0] = nil
	r.queue = r.queue[1:]
	if len(r.queue) == 0 {
		r.queue = nil // let the backing array go after a burst
	}
	r.bytes -= rec.size
	r.buffered.Store(r.bytes)
	r.bufferedRecs.Store(int64(len(r.queue)))
	if rec.kind == KindBatch {
		if st := r.streams[rec.engine]; st != nil {
			st.lastSeq, st.published = rec.seq, true
		}
	}
}

func (r *Relay) publishLoop(ctx context.Context) {
	defer close(r.pubDone)
	for {
		rec := r.next(ctx)
		if rec == nil {
			return
		}
		if !r.publish(ctx, rec) {
			return
		}
		r.pop(rec)
	}
}

// publish sends rec until JetStream acknowledges it; false when ctx ends
// first.
func (r *Relay) publish(ctx context.Context, rec *record) (ok bool) {
	if r.cfg.Tracer != nil {
		var span trace.Span
		ctx, span = r.cfg.Tracer.Start(ctx, SpanPublish, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
			attribute.String("messaging.destination.name", rec.msg.Subject), attribute.String("kvindex.kind", rec.kind.String()),
			attribute.Int64("kvindex.seq", int64(rec.seq)), attribute.Int("messaging.message.body.size", len(rec.msg.Data))))
		defer func() {
			if !ok {
				span.SetStatus(codes.Error, "stopped before JetStream acknowledged the record")
			}
			span.End()
		}()
	}
	backoff := 10 * time.Millisecond
	for {
		pctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
		ack, err := r.js.PublishMsg(pctx, rec.msg)
		cancel()
		if err == nil {
			r.published.Add(1)
			if ack.Duplicate {
				r.duplicates.Add(1)
			}
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		trace.SpanFromContext(ctx).RecordError(err) // a no-op without a span
		if n := r.pubErrs.Add(1); logEvery(n) {
			r.log.Warn("natstransport: publish failed; retrying", slog.String("subject", rec.msg.Subject),
				slog.String("kind", rec.kind.String()), slog.Uint64("seq", rec.seq), slog.Any("err", err),
				slog.Uint64("errors_total", n))
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// Heartbeat is what a relay announces on core NATS every
// RelayConfig.Heartbeat, on HeartbeatSubject(model, relay id).
type Heartbeat struct {
	Relay   string            `json:"relay"`
	Model   string            `json:"model"`
	Streams []HeartbeatStream `json:"streams"`
}

// HeartbeatStream is one engine rank in a Heartbeat.
type HeartbeatStream struct {
	Pod       string `json:"pod"`
	Rank      int    `json:"rank"`
	LastSeq   uint64 `json:"last_seq"`  // last batch JetStream acknowledged
	Published bool   `json:"published"` // LastSeq is set
	Health    string `json:"health"`    // the ZMQ side's health
	Connected bool   `json:"connected"` // the ZMQ side has the engine
}

func (r *Relay) heartbeat() Heartbeat {
	r.mu.Lock()
	defer r.mu.Unlock()
	hb := Heartbeat{Relay: r.cfg.ID, Model: r.model, Streams: make([]HeartbeatStream, 0, len(r.streams))}
	for id, st := range r.streams {
		hb.Streams = append(hb.Streams, HeartbeatStream{Pod: id.Pod, Rank: id.DPRank, LastSeq: st.lastSeq,
			Published: st.published, Health: st.health.String(), Connected: st.connected})
	}
	slices.SortFunc(hb.Streams, func(a, b HeartbeatStream) int {
		return compareEngineIDs(kvevents.EngineID{Pod: a.Pod, DPRank: a.Rank}, kvevents.EngineID{Pod: b.Pod, DPRank: b.Rank})
	})
	return hb
}

func (r *Relay) heartbeatLoop(ctx context.Context) {
	defer close(r.hbDone)
	t := time.NewTicker(r.cfg.Heartbeat)
	defer t.Stop()
	subj := HeartbeatSubject(r.model, r.cfg.ID)
	nc := r.js.Conn()
	for {
		r.refreshStreams()
		// Not while disconnected: the client would buffer stale
		// heartbeats and deliver them in a burst on reconnect.
		if nc.IsConnected() {
			data, err := json.Marshal(r.heartbeat())
			if err == nil {
				msg := &nats.Msg{Subject: subj, Data: data}
				if r.cfg.Auth != nil {
					r.cfg.Auth.Sign(msg)
				}
				err = nc.PublishMsg(msg)
			}
			if err != nil {
				r.log.Debug("natstransport: heartbeat not sent", slog.Any("err", err))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Stats returns the relay's counters.
func (r *Relay) Stats() RelayStats {
	return RelayStats{
		ID:              r.cfg.ID,
		Published:       r.published.Load(),
		Duplicates:      r.duplicates.Load(),
		Batches:         r.batches.Load(),
		BufferedBytes:   r.buffered.Load(),
		BufferedRecords: int(r.bufferedRecs.Load()),
		DroppedBatches:  r.dropped.Load(),
		Holes:           r.holesQueued.Load(),
		PublishErrors:   r.pubErrs.Load(),
		NATSConnected:   r.js.Conn().IsConnected(),
	}
}

// Collectors returns the relay's kvindex_relay_* metrics.
func (r *Relay) Collectors() []prometheus.Collector {
	c := func(name, help string, f func() uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(f()) })
	}
	g := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	return []prometheus.Collector{
		c("kvindex_relay_published_total", "Records (batches, resets, holes) JetStream acknowledged, re-published ones included.", r.published.Load),
		c("kvindex_relay_duplicates_total", "Acknowledged records JetStream already held (re-published after a reconnect or restart).", r.duplicates.Load),
		c("kvindex_relay_batches_total", "Batches handed to the relay by the ZMQ subscriber.", r.batches.Load),
		c("kvindex_relay_dropped_batches_total", "Batches dropped because the relay buffer was full.", r.dropped.Load),
		c("kvindex_relay_holes_total", "Hole records queued to announce dropped batches.", r.holesQueued.Load),
		c("kvindex_relay_publish_errors_total", "Publish attempts that failed and were retried.", r.pubErrs.Load),
		g("kvindex_relay_buffered_bytes", "Bytes of records waiting for JetStream's acknowledgement.", func() float64 { return float64(r.buffered.Load()) }),
		g("kvindex_relay_buffer_limit_bytes", "The relay buffer's bound (--relay-buffer).", func() float64 { return float64(r.cfg.MaxBuffer) }),
		g("kvindex_relay_nats_connected", "1 while the relay's NATS connection is up.", func() float64 {
			if r.js.Conn().IsConnected() {
				return 1
			}
			return 0
		}),
	}
}

// Close stops accepting work, keeps publishing what is buffered for up to
// CloseTimeout, then stops. Records still buffered are lost (they are
// reported in the log); an engine's later batches, from a restarted
// relay, find the gap.
func (r *Relay) Close() error {
	var err error
	r.closeOnce.Do(func() {
		r.mu.Lock()
		r.closing = true
		started := r.started
		r.mu.Unlock()
		select {
		case r.wake <- struct{}{}:
		default:
		}
		if !started {
			return
		}
		select {
		case <-r.pubDone:
		case <-time.After(r.cfg.CloseTimeout):
		}
		r.cancel()
		<-r.pubDone
		<-r.hbDone
		if s := r.Stats(); s.BufferedRecords > 0 {
			err = fmt.Errorf("natstransport: relay closed with %d records (%d bytes) unpublished", s.BufferedRecords, s.BufferedBytes)
			r.log.Warn("natstransport: relay closed before its buffer drained", slog.Int("records", s.BufferedRecords))
		}
	})
	return err
}
