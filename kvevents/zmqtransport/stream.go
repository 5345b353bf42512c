package zmqtransport

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvindex/kvindex/kvevents"
)

// recvBudget bounds the messages one socket may handle per wake-up, so a
// busy engine cannot starve the others on its loop.
const recvBudget = 512

// replayEndSeq is the sequence frame of a replay's end marker (-1 as int64).
const replayEndSeq = ^uint64(0)

// stream is one engine rank's event stream: its sequencer, decoder state,
// counters and (connect mode) sockets. It lives on one ioLoop and is only
// touched by that loop's goroutine, except ctr.
type stream struct {
	s      *Subscriber
	loop   *ioLoop
	id     kvevents.EngineID
	ctr    *streamCounters
	seq    *kvevents.Sequencer
	dec    kvevents.Decoder
	batch  kvevents.Batch
	rx     *receiver
	closed bool

	// Connect mode: the SUB socket and its monitor.
	sub, mon    *zmq.Socket
	subEP       string // what sub connects to
	topic       string // sub's subscription
	handshook   bool   // sub's current connection completed the ZMTP handshake
	refused     int    // connections in a row closed before the handshake
	refusedLog  uint64 // all such connections, for the log's rate limit
	retryAt     int64  // when to reopen sub, closed after a refused connection; 0 if open
	timed       bool   // in loop.timed
	portRank    int    // the rank the endpoint's port implies
	rankSettled bool   // the first dp_rank-carrying batch was checked
	strayLogged uint64

	// Replay: a DEALER to the engine's replay ROUTER; nil without one.
	replayEP string
	dealer   *zmq.Socket

	// Every payload is decoded before the sequencer sees it (the listener
	// decodes bind-mode batches, the stream its own live and replayed
	// ones into in): an undecodable one must not move the sequence.
	// pre/preBatch let Deliver reuse that decoding for the payload being
	// fed; a held batch is decoded again when delivered.
	in       kvevents.Batch
	pre      []byte
	preBatch *kvevents.Batch

	// Bind mode: conn identifies the listener connection the stream's
	// last batch came on (0: none yet); a batch on another connection
	// makes a stream with history verify its engine (see listener.conns).
	bind bool
	conn uint64
	// goneAt is when the stream's connection went away, or when a resumed
	// stream was created (monotonic, Subscriber.mono); 0 while its engine
	// is connected. Bind mode: see listener.forgetDeparted.
	goneAt int64
	// addr is the source address of the stream's last batch, which a
	// replay template with {addr} dials (see follow); "" until known.
	addr string
	// Bind mode, the stream's place among the listener's slots (slots.go):
	// its route; whether it holds a slot (capped) or is a named pod's;
	// when it must have proven itself (mono; 0: proven, or not asked);
	// when it was last heard (mono) and its neighbours in the list of
	// capped streams by that time.
	rt           *route
	capped       bool
	proveBy      int64
	lastMsg      int64
	older, newer *stream
	linked       bool
}

func (s *Subscriber) newStream(l *ioLoop, id kvevents.EngineID, endpoint, replayEP string, ln *listener) *stream {
	st := &stream{
		s:        s,
		loop:     l,
		id:       id,
		dec:      kvevents.Decoder{Flavor: s.cfg.Flavor, Limits: s.cfg.Limits},
		replayEP: replayEP,
		bind:     ln != nil,
		rx:       newReceiver(),
		ctr: &streamCounters{
			endpoint: endpoint,
			bind:     ln != nil,
		},
	}
	st.ctr.replayEndpoint.Store(&replayEP)
	// A template with {addr} has no endpoint until the engine's first
	// batch names its source (a resumed stream's), yet can replay.
	canReplay := replayEP != ""
	if ln != nil {
		st.ctr.listener = &ln.ctr
		canReplay = canReplay || ln.follow
	}
	st.ctr.engine.Store(&id)
	st.seq = kvevents.NewSequencer(st, kvevents.SequencerConfig{
		CanReplay:     canReplay,
		MaxHeld:       s.cfg.MaxBuffered,
		ReplayTimeout: s.cfg.ReplayTimeout,
	})
	if p, ok := s.takeResume(id); ok {
		st.ctr.lastSeq.Store(p.Seq)
		st.seq.Resume(p)
		st.logAttrs(slog.LevelInfo, "zmqtransport: resuming from a checkpoint; the engine is asked to confirm it",
			slog.Uint64("seq", p.Seq), slog.String("health", p.Health.String()))
	}
	return st
}

// openConnectStream opens rank r of a connect-mode engine. Loop goroutine.
func (s *Subscriber) openConnectStream(l *ioLoop, cfg EngineConfig, r int) (*stream, error) {
	ep, err := offsetEndpoint(cfg.Endpoint, r)
	if err != nil {
		return nil, err
	}
	rep, err := offsetEndpoint(cfg.ReplayEndpoint, r)
	if err != nil {
		return nil, err
	}
	id := kvevents.EngineID{Model: cfg.Model, Pod: cfg.Name, DPRank: r}
	st := s.newStream(l, id, ep, rep, nil)
	st.portRank = r
	if !s.claim(id, st) {
		st.close()
		return nil, fmt.Errorf("zmqtransport: engine %s is already read by another stream", id)
	}
	if err := st.openSub(ep, cfg.Topic); err != nil {
		st.close()
		s.release(st)
		return nil, err
	}
	if err := st.openDealer(); err != nil {
		st.close()
		s.release(st)
		return nil, err
	}
	l.members[st] = struct{}{}
	s.register(st)
	return st, nil
}

// subEvents are the SUB socket events a connect-mode stream follows: a
// connection counts once its ZMTP handshake succeeded, so a peer that
// accepts TCP but is no ZMQ publisher never looks connected.
const subEvents = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED

func (st *stream) openSub(endpoint, topic string) error {
	st.subEP, st.topic = endpoint, topic
	sub, mon, err := st.s.openSUB(topic, subEvents, func(sub *zmq.Socket) error {
		if err := sub.Connect(endpoint); err != nil {
			return fmt.Errorf("zmqtransport: connect %s: %w", endpoint, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	st.sub, st.mon = sub, mon
	st.loop.add(sub, st.onLive)
	st.loop.add(mon, st.onMonitor)
	return nil
}

// openDealer (re)creates the replay socket, if the stream has a replay
// endpoint. A fresh socket is the only way to make sure no reply to an
// abandoned request is ever read.
func (st *stream) openDealer() error {
	if st.replayEP == "" {
		return nil
	}
	d, err := st.s.newSocket(zmq.DEALER)
	if err != nil {
		return err
	}
	if err := d.Connect(st.replayEP); err != nil {
		d.Close()
		return fmt.Errorf("zmqtransport: connect replay %s: %w", st.replayEP, err)
	}
	st.dealer = d
	st.loop.add(d, st.onReplay)
	return nil
}

// follow points a bind-mode stream's replay socket at addr, the source
// address of its latest batch, when the replay template dials {addr}: a
// replay goes where the engine's events come from, never to a host a
// topic names. It runs before the batch is sequenced, so a reconnect's
// verifying replay already goes to the new address. A replay outstanding
// on the old address is lost (its socket is replaced) and times out.
func (st *stream) follow(addr []byte) {
	if string(addr) == st.addr {
		return
	}
	st.addr = string(addr)
	ep, err := expandReplayTemplate(st.s.cfg.ReplayTemplate, st.id.Pod, st.id.Model, st.addr, st.id.DPRank)
	if err != nil {
		st.logAttrs(slog.LevelWarn, "zmqtransport: no replay endpoint for engine", slog.Any("err", err))
		ep = ""
	}
	if ep == st.replayEP {
		return
	}
	st.closeDealer()
	st.replayEP = ep
	st.ctr.replayEndpoint.Store(&ep)
	if err := st.openDealer(); err != nil {
		st.logAttrs(slog.LevelWarn, "zmqtransport: replay socket not opened; gaps will degrade the stream", slog.Any("err", err))
		none := ""
		st.replayEP = none
		st.ctr.replayEndpoint.Store(&none)
	}
}

func (st *stream) closeDealer() {
	if st.dealer != nil {
		st.loop.remove(st.dealer)
		st.dealer.Close()
		st.dealer = nil
	}
}

// close releases the stream's sockets. Loop goroutine; idempotent.
func (st *stream) close() {
	if st.closed {
		return
	}
	st.closed = true
	st.loop.remove(st.sub)
	st.loop.remove(st.mon)
	closeMonitored(st.sub, st.mon)
	st.sub, st.mon = nil, nil
	st.closeDealer()
	st.rx.free()
	delete(st.loop.timed, st)
	st.timed, st.retryAt = false, 0
	delete(st.loop.members, st)
	st.ctr.connected.Store(false)
	st.ctr.replaying.Store(false)
}

// remove closes the stream for good and resets its engine in the Sink:
// after it returns no call for this engine follows. Loop goroutine.
func (st *stream) remove() {
	st.close()
	st.ctr.resets.Add(1)
	st.s.sink.Reset(st.id, kvevents.ResetRemoved)
	st.s.release(st)
}

// onLive reads the SUB socket. The monitor is read first: libzmq reports
// a connection's handshake before any of its messages can be read, so a
// reconnect is handled (Connected: verify the engine) before the new
// connection's first batch. Once per wake-up is enough: a burst that
// started before a reconnect can only be reading the old connection's
// backlog, and a restarted engine's new connection comes seconds after
// the old one's last batch.
func (st *stream) onLive() {
	if readable(st.mon) {
		st.onMonitor()
	}
	if st.sub == nil {
		return // closed after a refused connection
	}
	now := st.s.mono()
	for range recvBudget {
		frames, n, err := st.rx.recv(st.sub)
		if err != nil {
			st.recvFailed(err)
			return
		}
		if n != 3 || len(frames[1]) != 8 {
			st.malformed("live", n)
			continue
		}
		seq, payload := binary.BigEndian.Uint64(frames[1]), frames[2]
		if !st.decode("live", seq, payload) {
			continue // as if never received: the next batch shows the gap
		}
		st.pre, st.preBatch = payload, &st.in
		st.seq.Live(seq, payload, now)
		st.pre, st.preBatch = nil, nil
		st.after()
	}
}

// decode decodes a payload into st.in before it is sequenced; an
// undecodable one is counted, logged and reported false.
func (st *stream) decode(where string, seq uint64, payload []byte) bool {
	err := st.dec.Decode(payload, &st.in)
	if err == nil {
		return true
	}
	n := st.ctr.decodeErrors.Add(1)
	if logEvery(n) {
		st.logAttrs(slog.LevelWarn, "zmqtransport: undecodable batch dropped before sequencing (a replayed one counts as missing)",
			slog.String("socket", where), slog.Uint64("seq", seq), slog.Any("err", err), slog.Uint64("count", n))
	}
	return false
}

// onReplay reads replay replies: [b"", seq, payload] (vLLM < 0.26, SGLang)
// or [b"", topic, seq, payload] (vLLM >= 0.26); the end marker carries
// seq -1 and an empty payload.
func (st *stream) onReplay() {
	d := st.dealer
	for range recvBudget {
		if st.dealer != d {
			return // abandoned and replaced by a reply's consequences
		}
		frames, n, err := st.rx.recv(d)
		if err != nil {
			st.recvFailed(err)
			return
		}
		if (n != 3 && n != 4) || len(frames[0]) != 0 || len(frames[n-2]) != 8 {
			st.malformed("replay", n)
			continue
		}
		seq, payload := binary.BigEndian.Uint64(frames[n-2]), frames[n-1]
		if seq == replayEndSeq && len(payload) == 0 {
			st.seq.ReplayEnd(st.s.mono())
		} else if st.decode("replay", seq, payload) {
			st.pre, st.preBatch = payload, &st.in
			st.seq.Replayed(seq, payload, st.s.mono())
			st.pre, st.preBatch = nil, nil
		}
		st.after()
	}
}

// onMonitor tracks the SUB socket's connection state.
func (st *stream) onMonitor() {
	for st.mon != nil {
		ev, addr, _, err := st.mon.RecvEvent(zmq.DONTWAIT)
		if err != nil {
			return
		}
		switch {
		case ev&zmq.EVENT_HANDSHAKE_SUCCEEDED != 0:
			st.handshook, st.refused = true, 0
			st.retryAt = 0 // a lost connection's watchdog: reconnected
			st.ctr.connected.Store(true)
			st.logAttrs(slog.LevelInfo, "zmqtransport: connected", slog.String("addr", addr))
			if _, _, _, history := st.seq.Position(); history {
				st.connectedAgain(st.s.mono())
			} else {
				st.seq.Connected(st.s.mono())
			}
			st.after()
		case ev&zmq.EVENT_DISCONNECTED != 0 && st.handshook:
			st.handshook = false
			st.ctr.connected.Store(false)
			st.logAttrs(slog.LevelWarn, "zmqtransport: disconnected; reconnecting", slog.String("addr", addr))
			st.watchReconnect()
		case ev&zmq.EVENT_DISCONNECTED != 0:
			st.refusedConnection(addr)
			return // the monitor is closed
		}
	}
}

// refusedConnection handles a connection closed before the ZMTP
// handshake: something accepts TCP there but is no ZMQ publisher (or not
// yet). libzmq would reconnect after ReconnectIvl every time, since its
// backoff only grows while TCP connects fail, so the SUB socket is closed
// and reopened after a backoff of its own instead: ReconnectIvl doubled
// per refusal in a row, up to ReconnectIvlMax. The log is rate-limited.
func (st *stream) refusedConnection(addr string) {
	st.refused++
	st.refusedLog++
	wait := st.s.cfg.ReconnectIvl
	for i := 1; i < st.refused && wait < st.s.cfg.ReconnectIvlMax; i++ {
		wait *= 2
	}
	wait = min(wait, st.s.cfg.ReconnectIvlMax)
	if logEvery(st.refusedLog) {
		st.logAttrs(slog.LevelWarn, "zmqtransport: connection closed before the ZMQ handshake (is a ZMQ PUB socket bound there?); retrying with backoff",
			slog.String("addr", addr), slog.Duration("retry_in", wait), slog.Uint64("count", st.refusedLog))
	}
	st.loop.remove(st.sub)
	st.loop.remove(st.mon)
	closeMonitored(st.sub, st.mon)
	st.sub, st.mon = nil, nil
	st.retryAt = st.s.mono() + int64(wait)
	st.after()
}

// reopen reconnects the SUB socket once a refusal's backoff has passed.
func (st *stream) reopen(now int64) {
	if st.retryAt == 0 || now < st.retryAt {
		return
	}
	st.retryAt = 0
	if st.sub != nil { // the watchdog of watchReconnect fired
		st.loop.remove(st.sub)
		st.loop.remove(st.mon)
		closeMonitored(st.sub, st.mon)
		st.sub, st.mon = nil, nil
	}
	if err := st.openSub(st.subEP, st.topic); err != nil {
		st.logAttrs(slog.LevelError, "zmqtransport: SUB socket not reopened; retrying", slog.Any("err", err))
		st.retryAt = now + int64(st.s.cfg.ReconnectIvlMax)
	}
}

func (st *stream) recvFailed(err error) {
	if !isEAGAIN(err) {
		st.logAttrs(slog.LevelError, "zmqtransport: receive failed", slog.Any("err", err))
	}
}

func (st *stream) malformed(where string, frames int) {
	n := st.ctr.decodeErrors.Add(1)
	if logEvery(n) {
		st.logAttrs(slog.LevelWarn, "zmqtransport: malformed message dropped",
			slog.String("socket", where), slog.Int("frames", frames), slog.Uint64("count", n))
	}
}

func (st *stream) tick(now int64) {
	st.reopen(now)
	st.seq.Tick(now)
	st.after()
}

// deadline is when the stream next needs a tick: its replay's deadline or
// the end of a reconnect backoff, whichever comes first.
func (st *stream) deadline() (int64, bool) {
	d, ok := st.seq.ReplayDeadline()
	if st.retryAt != 0 && (!ok || st.retryAt < d) {
		return st.retryAt, true
	}
	return d, ok
}

// after mirrors the sequencer's replay state into the counters, and the
// stream's deadlines into the loop's timer set.
func (st *stream) after() {
	_, replaying := st.seq.ReplayDeadline()
	if replaying != st.ctr.replaying.Load() {
		st.ctr.replaying.Store(replaying)
	}
	if timed := replaying || st.retryAt != 0; timed != st.timed {
		st.timed = timed
		if timed {
			st.loop.timed[st] = struct{}{}
		} else {
			delete(st.loop.timed, st)
		}
	}
}

// Deliver implements kvevents.SequencerOutput: hand one batch to the
// Sink, decoded before it was sequenced (or again, for a held copy).
func (st *stream) Deliver(seq uint64, payload []byte) {
	b := &st.batch
	if len(payload) > 0 && len(st.pre) > 0 && &payload[0] == &st.pre[0] {
		b = st.preBatch
	} else if err := st.dec.Decode(payload, b); err != nil {
		// Only a held copy can get here, and it decoded when it
		// arrived; should the decoder disagree now, the batch is
		// consumed (its seq will not be replayed) and its events lost.
		n := st.ctr.decodeErrors.Add(1)
		st.ctr.lastSeq.Store(seq)
		if logEvery(n) {
			st.logAttrs(slog.LevelWarn, "zmqtransport: undecodable batch dropped",
				slog.Uint64("seq", seq), slog.Any("err", err), slog.Uint64("count", n))
		}
		st.seq.Degrade()
		return
	}
	if !st.bind {
		st.checkRank(b)
	}
	cleared := 0
	for i := range b.Events {
		if b.Events[i].Kind == kvevents.AllBlocksCleared {
			cleared++
		}
	}
	// Counted before the call, so a Sink that observes a batch also
	// observes it in Streams.
	st.ctr.batches.Add(1)
	st.ctr.events.Add(uint64(len(b.Events)))
	if b.Skipped > 0 {
		st.ctr.unknownEvents.Add(uint64(b.Skipped))
	}
	st.ctr.lastSeq.Store(seq)
	now := st.s.cfg.Now().UnixNano()
	st.ctr.lastEvent.Store(now)
	st.ctr.clock.Note(b.TS, now)
	var accepted bool
	if st.s.psink != nil {
		// A relay has no verdict: as kvevents.ApplyVerdict takes a Sink
		// without one.
		st.s.psink.ApplyPayload(st.id, seq, payload, b.Events)
		accepted = len(b.Events) > 0
	} else {
		accepted = kvevents.ApplyVerdict(st.s.sink, st.id, seq, b.Events)
	}
	if accepted {
		st.proveBy = 0 // proven (slots.go)
	}
	if cleared > 0 {
		st.ctr.resets.Add(uint64(cleared))
		st.seq.Cleared()
	}
}

// checkRank compares a connect-mode batch's dp_rank with the rank implied
// by the port. The batch wins: the engine knows its rank, while port
// offsets follow the local DP index, which differs from the global rank
// when ranks span nodes. The identity is settled by the first batch that
// carries a rank, so a stream never changes identity once it has state.
func (st *stream) checkRank(b *kvevents.Batch) {
	if !b.HasDPRank || b.DPRank == st.portRank {
		st.rankSettled = st.rankSettled || b.HasDPRank
		return
	}
	st.ctr.rankMismatches.Add(1)
	if st.rankSettled {
		return
	}
	st.rankSettled = true
	if b.DPRank < 0 || b.DPRank >= kvevents.MaxDPRank {
		st.logAttrs(slog.LevelWarn, "zmqtransport: batch dp_rank out of range; keeping the port's rank",
			slog.Int("dp_rank", b.DPRank))
		return
	}
	id := st.id
	id.DPRank = b.DPRank
	if !st.s.rename(st, id) {
		st.logAttrs(slog.LevelWarn, "zmqtransport: batch dp_rank differs from the port's, but another stream owns that rank; keeping the port's rank",
			slog.Int("dp_rank", b.DPRank))
		return
	}
	st.id = id
	st.ctr.engine.Store(&id)
	st.logAttrs(slog.LevelWarn, "zmqtransport: batch dp_rank differs from the port's; using the batch's",
		slog.Int("port_rank", st.portRank), slog.Int("dp_rank", b.DPRank))
}

// Reset implements kvevents.SequencerOutput.
func (st *stream) Reset(reason kvevents.ResetReason) {
	st.s.sink.Reset(st.id, reason)
}

// RequestReplay implements kvevents.SequencerOutput: send [b"", start_seq]
// on the DEALER.
func (st *stream) RequestReplay(from uint64) bool {
	if st.dealer == nil {
		return false
	}
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], from)
	if _, err := st.dealer.SendBytes(nil, zmq.SNDMORE|zmq.DONTWAIT); err != nil {
		st.logAttrs(slog.LevelWarn, "zmqtransport: replay request not sent", slog.Any("err", err))
		return false
	}
	if _, err := st.dealer.SendBytes(req[:], zmq.DONTWAIT); err != nil {
		// Half a message may sit in the socket: start afresh.
		st.CancelReplay()
		st.logAttrs(slog.LevelWarn, "zmqtransport: replay request not sent", slog.Any("err", err))
		return false
	}
	return true
}

// CancelReplay implements kvevents.SequencerOutput: replace the DEALER so
// replies to the abandoned request are never read.
func (st *stream) CancelReplay() { st.renewDealer() }

// connectedAgain tells the sequencer that an engine with history came
// back on a new connection, on a fresh replay socket: the old one may
// still hold a connection to the departed process that libzmq has not
// yet noticed closed, and a verifying request written into it is lost
// (the stream would turn unconfirmed after the replay timeout). A fresh
// DEALER dials whatever listens now, queueing the request until it does.
func (st *stream) connectedAgain(now int64) {
	if st.dealer != nil {
		st.renewDealer()
	}
	st.seq.Connected(now)
}

// renewDealer replaces the DEALER with a fresh one to the same endpoint.
func (st *stream) renewDealer() {
	st.closeDealer()
	if err := st.openDealer(); err != nil {
		st.logAttrs(slog.LevelError, "zmqtransport: replay socket not reopened; replay disabled", slog.Any("err", err))
		st.seq.DisableReplay()
	}
}

// Note implements kvevents.SequencerOutput: counters and log lines.
func (st *stream) Note(n kvevents.Note) {
	c := st.ctr
	switch n.Kind {
	case kvevents.NoteGap:
		c.gaps.Add(1)
		st.logAttrs(slog.LevelWarn, "zmqtransport: sequence gap",
			slog.Uint64("expected", n.From), slog.Uint64("got", n.To), slog.Uint64("missing", span(n.From, n.To)))
	case kvevents.NoteReplayStart:
		st.logAttrs(slog.LevelInfo, "zmqtransport: replay requested",
			slog.Uint64("from", n.From), slog.Bool("bootstrap", n.Bootstrap), slog.String("replay", st.replayEP))
	case kvevents.NoteReplayDone:
		c.replaysOK.Add(1)
		st.logAttrs(slog.LevelInfo, "zmqtransport: replay complete",
			slog.Uint64("from", n.From), slog.Uint64("applied", span(n.From, n.To)), slog.Bool("bootstrap", n.Bootstrap))
	case kvevents.NoteReplayFailed:
		c.replaysFailed.Add(1)
		st.logAttrs(slog.LevelWarn, "zmqtransport: replay failed; continuing with a hole",
			slog.Uint64("from", n.From), slog.String("reason", n.Reason.String()), slog.Bool("bootstrap", n.Bootstrap))
	case kvevents.NoteLost:
		addSaturating(&c.lost, span(n.From, n.To))
		st.logAttrs(slog.LevelWarn, "zmqtransport: batches lost",
			slog.Uint64("from", n.From), slog.Uint64("to", n.To))
	case kvevents.NoteRestart:
		c.restarts.Add(1)
		c.resets.Add(1)
		st.logAttrs(slog.LevelWarn, "zmqtransport: engine restarted (an unknown batch under a seq already applied); resetting its blocks",
			slog.Uint64("last", n.From), slog.Uint64("seq", n.To))
	case kvevents.NoteBackwards:
		c.resets.Add(1)
		st.logAttrs(slog.LevelWarn, "zmqtransport: sequence went back on the same connection, where no engine restart can be (a forged or wrapped seq); resetting its blocks, unconfirmed until the engine clears its cache or restarts",
			slog.Uint64("last", n.From), slog.Uint64("seq", n.To))
	case kvevents.NoteUnverifiable:
		st.logAttrs(slog.LevelWarn, "zmqtransport: reconnected without a replay endpoint: its blocks cannot be verified (a restarted engine may go on at the next seq), unconfirmed until the engine clears its cache or restarts",
			slog.Uint64("last", n.From))
	case kvevents.NoteReplayRestart:
		c.restarts.Add(1)
		c.resets.Add(1)
		c.replayRestarts.Add(1)
		st.logAttrs(slog.LevelWarn, "zmqtransport: engine restarted (its replay does not hold the last applied batch); resetting its blocks and bootstrapping",
			slog.Uint64("last", n.From), slog.Uint64("first_reply", n.To), slog.String("reason", n.Reason.String()))
	case kvevents.NoteVerified:
		c.verified.Add(1)
		st.logAttrs(slog.LevelDebug, "zmqtransport: engine verified by replay (same process)", slog.Uint64("seq", n.From))
	case kvevents.NoteDuplicate, kvevents.NoteLate:
		c.duplicates.Add(1)
	case kvevents.NoteStray:
		st.strayLogged++
		if logEvery(st.strayLogged) {
			st.logAttrs(slog.LevelDebug, "zmqtransport: stray replay reply dropped", slog.Uint64("seq", n.From))
		}
	case kvevents.NoteJoin:
		st.logAttrs(slog.LevelInfo, "zmqtransport: joined mid-stream without replay; earlier blocks unknown",
			slog.Uint64("seq", n.From))
	case kvevents.NoteTruncated:
		st.logAttrs(slog.LevelInfo, "zmqtransport: engine's replay buffer starts later; older blocks unknown",
			slog.Uint64("first", n.To))
	case kvevents.NoteHealth:
		c.health.Store(uint32(n.Health))
		if hs, ok := st.s.sink.(kvevents.HealthSink); ok {
			hs.Health(st.id, n.Health)
		}
		level := slog.LevelInfo
		if n.Health == kvevents.HealthDegraded {
			level = slog.LevelWarn
		}
		st.logAttrs(level, "zmqtransport: stream health changed", slog.String("health", n.Health.String()))
	}
}

func (st *stream) logAttrs(level slog.Level, msg string, attrs ...slog.Attr) {
	if !st.s.log.Enabled(context.Background(), level) {
		return
	}
	base := []slog.Attr{
		slog.String("pod", st.id.Pod),
		slog.Int("dp_rank", st.id.DPRank),
		slog.String("model", st.id.Model),
		slog.String("endpoint", st.ctr.endpoint),
	}
	st.s.log.LogAttrs(context.Background(), level, msg, append(base, attrs...)...)
}

func isEAGAIN(err error) bool { return zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN) }

// reconnectWatchdog is how long a connection lost after its handshake may
// stay down before the SUB socket is reopened. libzmq reconnects by itself
// after a connection error, but not after a protocol error (a frame over
// MaxMsgSize, for one): it then gives up on the endpoint for good.
func (st *stream) reconnectWatchdog() time.Duration { return 2 * st.s.cfg.ReconnectIvlMax }

// watchReconnect arms the watchdog of a lost connection: if no handshake
// succeeds by then, reopen closes and reopens the SUB socket.
func (st *stream) watchReconnect() {
	st.retryAt = st.s.mono() + int64(st.reconnectWatchdog())
	st.after()
}
