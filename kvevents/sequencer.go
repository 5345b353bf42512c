package kvevents

import (
	"bytes"
	"hash/maphash"
	"time"
)

// A Sequencer turns the live batches and replay replies of one publisher
// (one engine's data-parallel rank) into a gap-free, duplicate-free,
// in-order stream. It is a pure state machine: no sockets, no clocks, no
// goroutines. Its caller (a transport) feeds it inputs (a live batch, a
// replayed batch, the replay end marker, a connection, the passage of
// time) and it answers synchronously, before the call returns, through
// its SequencerOutput: deliver this batch, reset the engine, request or
// cancel a replay. Everything a stream does differently from "deliver in
// order" is also reported as a Note, which the caller turns into counters
// and log lines. Time comes in as a value: every input that can start or
// end a replay takes now, in nanoseconds of any monotonic clock the caller
// keeps (only differences matter).
//
// The rules, from the publisher's contract (vLLM ZmqEventPublisher):
//
//   - Sequence numbers start at 0 per publisher process and grow by one per
//     batch. A live number that does not grow means a new process: Reset
//     the engine, then treat the batch as the first of a fresh stream. A
//     replay can apply batches that are still in flight on the live socket;
//     their live copies are recognised by content and dropped as
//     duplicates instead.
//   - A number that jumps (seq > last+1) means the live socket lost batches
//     (high-water mark, reconnect). Ask the replay socket for everything
//     from last+1, hold the live batches that keep arriving meanwhile, apply
//     the replayed ones in order, then the held ones, dropping duplicates.
//   - The first batch of a fresh stream with seq > 0 means the subscriber
//     joined late: ask for a replay from 0 to recover what the engine still
//     holds in its buffer (the last buffer_steps batches). A stream whose
//     socket connects asks at once (Connected), without waiting for a
//     batch.
//
// When a hole cannot be filled (no replay endpoint, timeout, the engine's
// buffer no longer reaching back far enough, too many batches held), the
// stream is marked degraded and continues after the hole. It keeps the
// engine's index state: vLLM never re-announces a block that is reused
// from its prefix cache, so forgetting every block of the engine would
// blind the index to that engine's whole cache until each block happened to
// be evicted and stored again, while carrying on costs at most the few
// stores and removals inside the hole (a missing store under-reports a
// block; a missing removal over-reports one until the engine reuses or
// evicts it). A replay that succeeds, a restart, or an AllBlocksCleared
// (Cleared) makes the stream healthy again.
//
// A Sequencer is not safe for concurrent use; one goroutine owns it. Its
// output may call back into it (Degrade, Cleared, DisableReplay) from
// within Deliver.
type Sequencer struct {
	out         SequencerOutput
	canReplay   bool  // a replay endpoint exists
	maxHeld     int   // bound on live batches held during a replay
	timeout     int64 // replay timeout, nanoseconds
	applied     bool  // at least one batch delivered since start or reset
	last        uint64
	lastPrint   uint64 // BatchPrint of the batch delivered under last
	liveSeen    bool   // a live batch of the current process arrived
	liveHigh    uint64 // the highest live seq of the current process
	degraded    bool
	replaying   bool
	bootstrap   bool   // the outstanding replay started on a fresh stream
	replayFrom  uint64 // first seq asked for
	deadline    int64  // the caller's monotonic nanoseconds
	gotReply    bool   // a data reply of the outstanding replay arrived
	hole        ReplayFailure
	replayedMin uint64 // range delivered by the outstanding replay
	replayedMax uint64
	replayedAny bool
	held        []heldBatch
	spare       []heldBatch               // the other half of a double buffer for draining
	prints      *[replayPrints]batchPrint // allocated on the first replay
	printSeed   maphash.Seed
}

// SequencerConfig configures a Sequencer.
type SequencerConfig struct {
	// CanReplay reports that the publisher has a replay endpoint. Without
	// one, a gap degrades the stream at once and a late join starts from
	// the first batch seen.
	CanReplay bool
	// MaxHeld bounds the live batches held while a replay is outstanding;
	// one more gives the replay up. Values below 1 mean 1.
	MaxHeld int
	// ReplayTimeout is how long a replay may stay silent (no reply, no end
	// marker) before it is given up: each reply extends the deadline, so
	// it bounds silence, not the length of a large replay.
	ReplayTimeout time.Duration
}

// SequencerOutput receives a Sequencer's decisions, synchronously and in
// order.
type SequencerOutput interface {
	// Deliver applies one batch. It is called exactly once per sequence
	// number of a publisher process, in increasing order. payload is the
	// caller's own (a live or replayed payload it passed in) or a copy
	// the sequencer held; it is valid only during the call.
	Deliver(seq uint64, payload []byte)
	// Reset forgets the engine's state (the publisher restarted). The
	// deliveries that follow belong to the new process.
	Reset(reason ResetReason)
	// RequestReplay asks the publisher for every batch from `from` on; it
	// reports false if the request could not be sent.
	RequestReplay(from uint64) bool
	// CancelReplay abandons the outstanding request; replies to it must
	// never be fed back (a transport discards its replay socket).
	CancelReplay()
	// Note reports a step worth counting or logging.
	Note(n Note)
}

// NoteKind says what a Note reports.
type NoteKind uint8

// Note kinds; From and To are the Note's fields.
const (
	// NoteGap: live seq To arrived while From was expected; batches
	// [From, To) are missing for now.
	NoteGap NoteKind = iota + 1
	// NoteReplayStart: a replay from From was requested (Bootstrap: the
	// stream had no history yet).
	NoteReplayStart
	// NoteReplayDone: the replay ended and closed every hole it was asked
	// to; it applied batches [From, To) (none if From == To).
	NoteReplayDone
	// NoteReplayFailed: the replay from From could not close its hole;
	// see Reason.
	NoteReplayFailed
	// NoteLost: batches [From, To) will never be applied.
	NoteLost
	// NoteRestart: seq To arrived after From had been seen: the publisher
	// restarted.
	NoteRestart
	// NoteDuplicate: seq From had already been applied; dropped.
	NoteDuplicate
	// NoteStray: a replay frame (seq From, or the end marker, whose From
	// is the largest uint64) arrived while no replay was outstanding;
	// dropped.
	NoteStray
	// NoteJoin: the stream's first batch, seq From > 0, was applied
	// without history because no replay endpoint exists.
	NoteJoin
	// NoteTruncated: a bootstrap replay from From began at To > From: the
	// engine's buffer no longer holds older batches. Not a failure: those
	// batches predate the subscriber and no replay could have recovered
	// them.
	NoteTruncated
	// NoteDegraded and NoteHealthy report changes of the degraded flag.
	NoteDegraded
	NoteHealthy
)

func (k NoteKind) String() string {
	switch k {
	case NoteGap:
		return "gap"
	case NoteReplayStart:
		return "replay-start"
	case NoteReplayDone:
		return "replay-done"
	case NoteReplayFailed:
		return "replay-failed"
	case NoteLost:
		return "lost"
	case NoteRestart:
		return "restart"
	case NoteDuplicate:
		return "duplicate"
	case NoteStray:
		return "stray"
	case NoteJoin:
		return "join"
	case NoteTruncated:
		return "truncated"
	case NoteDegraded:
		return "degraded"
	case NoteHealthy:
		return "healthy"
	}
	return "note?"
}

// ReplayFailure says why a replay did not close its hole.
type ReplayFailure uint8

// Replay failures.
const (
	ReplayOK          ReplayFailure = iota // no failure
	ReplayUnavailable                      // the request could not be sent
	ReplayTimedOut                         // no end marker within the timeout
	ReplayTruncated                        // the first reply was newer than requested: the engine's buffer moved on
	ReplayIncomplete                       // the replay ended with a hole still open (a reply lost, or nothing returned)
	ReplayOverflow                         // too many live batches arrived while waiting
)

func (r ReplayFailure) String() string {
	switch r {
	case ReplayUnavailable:
		return "unavailable"
	case ReplayTimedOut:
		return "timeout"
	case ReplayTruncated:
		return "truncated"
	case ReplayIncomplete:
		return "incomplete"
	case ReplayOverflow:
		return "overflow"
	}
	return ""
}

// Note is one noteworthy step of a Sequencer.
type Note struct {
	Kind      NoteKind
	From, To  uint64        // meaning per Kind
	Reason    ReplayFailure // NoteReplayFailed
	Bootstrap bool          // NoteReplayStart, NoteReplayDone, NoteReplayFailed
}

// heldBatch is a live batch held while a replay is outstanding.
type heldBatch struct {
	seq     uint64
	payload []byte
}

// batchPrint is the fingerprint of one replayed batch.
type batchPrint struct {
	seq, sum uint64
	ok       bool
}

// NewSequencer returns the sequencer of a fresh stream (no history, not
// degraded, no replay outstanding) that answers through out.
func NewSequencer(out SequencerOutput, cfg SequencerConfig) *Sequencer {
	return &Sequencer{
		out:       out,
		canReplay: cfg.CanReplay,
		maxHeld:   max(cfg.MaxHeld, 1),
		timeout:   int64(cfg.ReplayTimeout),
	}
}

// Live handles a batch from the live stream. payload need only be valid
// during the call: a batch the sequencer holds is copied.
func (s *Sequencer) Live(seq uint64, payload []byte, now int64) {
	// The live stream of one publisher process never repeats or goes
	// back. The applied position can run ahead of it, because a replay
	// returns batches that are still in flight on the live socket; such a
	// batch is a duplicate only if it is byte for byte the one replayed
	// under its seq (a new process's batch differs, if only in its
	// timestamp).
	restarted := (s.liveSeen && seq <= s.liveHigh) ||
		(s.applied && seq <= s.last && !s.wasReplayed(seq, payload))
	if restarted {
		if s.replaying {
			// The held batches belong to the old process, whose
			// state the reset discards anyway.
			s.abandonReplay()
			s.held = s.held[:0]
		}
		s.restart(seq)
	}
	s.liveSeen = true
	s.liveHigh = seq
	s.accept(seq, payload, now)
}

// accept places a live batch that is not a restart.
func (s *Sequencer) accept(seq uint64, payload []byte, now int64) {
	switch {
	case s.replaying:
		s.hold(seq, payload)
		if len(s.held) > s.maxHeld {
			s.abandonReplay()
			s.fail(ReplayOverflow)
			s.drain(now)
		}
	case !s.applied:
		s.fresh(seq, payload, now)
	case seq <= s.last:
		// Already applied from a replay that overtook the live stream.
		s.out.Note(Note{Kind: NoteDuplicate, From: seq})
	case seq == s.last+1:
		s.apply(seq, payload)
	default:
		s.out.Note(Note{Kind: NoteGap, From: s.last + 1, To: seq})
		if s.canReplay {
			s.hold(seq, payload)
			s.startReplay(s.last+1, false, now)
			return
		}
		s.out.Note(Note{Kind: NoteLost, From: s.last + 1, To: seq})
		s.setDegraded(true)
		s.apply(seq, payload)
	}
}

// Connected reports that the live socket (re)connected. A stream with no
// history asks for the engine's replay buffer right away instead of
// waiting for the next batch, so an idle engine's cached blocks are known
// before it publishes again.
func (s *Sequencer) Connected(now int64) {
	if !s.canReplay || s.applied || s.replaying || s.liveSeen {
		return
	}
	s.startReplay(0, true, now)
}

// fresh handles the first batch of a stream with no history.
func (s *Sequencer) fresh(seq uint64, payload []byte, now int64) {
	if seq == 0 {
		s.apply(seq, payload)
		return
	}
	if !s.canReplay {
		s.out.Note(Note{Kind: NoteJoin, From: seq})
		s.apply(seq, payload)
		return
	}
	s.hold(seq, payload)
	s.startReplay(0, true, now)
}

// Replayed handles one data reply of the replay socket. Each reply
// extends the deadline: the timeout bounds silence, not the length of a
// large replay.
func (s *Sequencer) Replayed(seq uint64, payload []byte, now int64) {
	if !s.replaying {
		s.out.Note(Note{Kind: NoteStray, From: seq})
		return
	}
	s.deadline = now + s.timeout
	if !s.gotReply {
		s.gotReply = true
		if seq > s.replayFrom {
			if s.bootstrap {
				s.out.Note(Note{Kind: NoteTruncated, From: s.replayFrom, To: seq})
			} else {
				s.hole = ReplayTruncated
			}
		}
	}
	if s.applied && seq <= s.last {
		s.out.Note(Note{Kind: NoteDuplicate, From: seq})
		return
	}
	// Held live batches older than this reply go first: the replay
	// skipped them (the engine's buffer moved on, or a reply was lost).
	for len(s.held) > 0 && s.held[0].seq < seq {
		h := s.held[0]
		s.held = s.held[1:]
		if s.applied && h.seq <= s.last {
			s.out.Note(Note{Kind: NoteDuplicate, From: h.seq})
			continue
		}
		s.applyAfterHole(h.seq, h.payload)
	}
	s.applyAfterHole(seq, payload)
	s.remember(seq, payload)
	if !s.replayedAny {
		s.replayedAny = true
		s.replayedMin = seq
	}
	s.replayedMax = seq
}

// applyAfterHole applies a batch during a replay, first reporting any
// batches between the last applied one and it as lost.
func (s *Sequencer) applyAfterHole(seq uint64, payload []byte) {
	if s.applied && seq > s.last+1 {
		if s.hole == ReplayOK {
			s.hole = ReplayIncomplete
		}
		s.out.Note(Note{Kind: NoteLost, From: s.last + 1, To: seq})
	}
	s.apply(seq, payload)
}

// ReplayEnd handles the replay end marker.
func (s *Sequencer) ReplayEnd(now int64) {
	if !s.replaying {
		s.out.Note(Note{Kind: NoteStray, From: ^uint64(0)})
		return
	}
	s.replaying = false
	if len(s.held) > 0 {
		next := s.held[0].seq
		if (s.applied && next > s.last+1) || (!s.applied && next > 0) {
			if s.hole == ReplayOK {
				s.hole = ReplayIncomplete
			}
		}
	}
	if s.hole != ReplayOK {
		s.fail(s.hole)
	} else {
		n := Note{Kind: NoteReplayDone, From: s.replayFrom, To: s.replayFrom, Bootstrap: s.bootstrap}
		if s.replayedAny {
			n.From, n.To = s.replayedMin, s.replayedMax+1
		}
		s.out.Note(n)
		s.setDegraded(false)
	}
	s.drain(now)
}

// Tick lets time pass: an outstanding replay past its deadline fails.
// The caller ticks at (or after) ReplayDeadline.
func (s *Sequencer) Tick(now int64) {
	if !s.replaying || now < s.deadline {
		return
	}
	s.abandonReplay()
	s.fail(ReplayTimedOut)
	s.drain(now)
}

// Cleared reports that an AllBlocksCleared was applied: the engine's state
// downstream is exact again, whatever holes came before.
func (s *Sequencer) Cleared() { s.setDegraded(false) }

// Degrade marks the stream degraded from outside: a delivered batch could
// not be applied (it was undecodable), so the engine's state downstream
// is no longer exact.
func (s *Sequencer) Degrade() { s.setDegraded(true) }

// DisableReplay makes the stream carry on without a replay endpoint (the
// caller lost its replay socket): later gaps degrade the stream at once.
// It does not end an outstanding replay.
func (s *Sequencer) DisableReplay() { s.canReplay = false }

// Degraded reports whether batches were lost and not recovered since the
// last successful replay, restart or AllBlocksCleared.
func (s *Sequencer) Degraded() bool { return s.degraded }

// Health reports what the stream's delivered state can be trusted for.
func (s *Sequencer) Health() Health {
	if s.degraded {
		return HealthDegraded
	}
	return HealthOK
}

// Position reports the last delivered batch's sequence number and print,
// and the stream's health; ok is false if nothing was delivered since the
// start or the last reset.
func (s *Sequencer) Position() (seq, print uint64, h Health, ok bool) {
	return s.last, s.lastPrint, s.Health(), s.applied
}

// Replaying reports whether a replay is outstanding.
func (s *Sequencer) Replaying() bool { return s.replaying }

// ReplayDeadline reports the outstanding replay's deadline, on the
// caller's clock; ok is false when no replay is outstanding.
func (s *Sequencer) ReplayDeadline() (deadline int64, ok bool) { return s.deadline, s.replaying }

// Held reports how many live batches wait for the outstanding replay; it
// never exceeds SequencerConfig.MaxHeld.
func (s *Sequencer) Held() int { return len(s.held) }

func (s *Sequencer) startReplay(from uint64, bootstrap bool, now int64) {
	s.replaying = true
	s.bootstrap = bootstrap
	s.replayFrom = from
	s.deadline = now + s.timeout
	s.gotReply = false
	s.hole = ReplayOK
	s.replayedAny = false
	s.out.Note(Note{Kind: NoteReplayStart, From: from, Bootstrap: bootstrap})
	if !s.out.RequestReplay(from) {
		s.replaying = false
		s.fail(ReplayUnavailable)
		s.drain(now)
	}
}

// abandonReplay stops waiting for the outstanding replay.
func (s *Sequencer) abandonReplay() {
	s.replaying = false
	s.out.CancelReplay()
}

// fail reports a replay that left a hole and degrades the stream.
func (s *Sequencer) fail(r ReplayFailure) {
	s.out.Note(Note{Kind: NoteReplayFailed, From: s.replayFrom, Reason: r, Bootstrap: s.bootstrap})
	s.setDegraded(true)
}

// drain delivers the held batches after a replay finished or failed. A hole
// before the first held batch is given up on (the replay that should have
// filled it is over); holes between held batches are live gaps like any
// other and may start a new replay, which holds the rest again.
func (s *Sequencer) drain(now int64) {
	if len(s.held) == 0 {
		return
	}
	batch := s.held
	s.held, s.spare = s.spare[:0], nil
	first := batch[0]
	switch {
	case !s.applied:
		s.apply(first.seq, first.payload)
	case first.seq <= s.last:
		s.out.Note(Note{Kind: NoteDuplicate, From: first.seq})
	default:
		if first.seq > s.last+1 {
			s.out.Note(Note{Kind: NoteLost, From: s.last + 1, To: first.seq})
		}
		s.apply(first.seq, first.payload)
	}
	for _, h := range batch[1:] {
		s.accept(h.seq, h.payload, now)
	}
	clear(batch)
	s.spare = batch[:0]
}

// replayPrints is how many replayed batches a sequencer remembers the
// fingerprint of: the live copies of replayed batches arrive right after
// the replay, so only its tail matters.
const replayPrints = 1024

// remember records the fingerprint of a batch applied from a replay.
func (s *Sequencer) remember(seq uint64, payload []byte) {
	if s.prints == nil {
		s.prints = new([replayPrints]batchPrint)
		s.printSeed = maphash.MakeSeed()
	}
	s.prints[seq%replayPrints] = batchPrint{seq: seq, sum: maphash.Bytes(s.printSeed, payload), ok: true}
}

// wasReplayed reports whether payload is the batch a replay applied under
// seq.
func (s *Sequencer) wasReplayed(seq uint64, payload []byte) bool {
	if s.prints == nil {
		return false
	}
	p := s.prints[seq%replayPrints]
	return p.ok && p.seq == seq && p.sum == maphash.Bytes(s.printSeed, payload)
}

// hold keeps a live batch until the outstanding replay ends. The caller's
// payload is only valid during the call (it aliases a receive buffer), so
// it is copied: holding is the rare path.
func (s *Sequencer) hold(seq uint64, payload []byte) {
	s.held = append(s.held, heldBatch{seq, bytes.Clone(payload)})
}

func (s *Sequencer) restart(seq uint64) {
	s.out.Note(Note{Kind: NoteRestart, From: max(s.liveHigh, s.last), To: seq})
	s.out.Reset(ResetRestart)
	s.applied = false
	s.last = 0
	if s.prints != nil {
		clear(s.prints[:])
	}
	s.setDegraded(false)
}

func (s *Sequencer) apply(seq uint64, payload []byte) {
	s.applied = true
	s.last = seq
	s.lastPrint = BatchPrint(payload)
	s.out.Deliver(seq, payload)
}

func (s *Sequencer) setDegraded(d bool) {
	if s.degraded == d {
		return
	}
	s.degraded = d
	if d {
		s.out.Note(Note{Kind: NoteDegraded})
	} else {
		s.out.Note(Note{Kind: NoteHealthy})
	}
}
