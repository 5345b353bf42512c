package kvevents

import (
	"bytes"
	"slices"
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
// The caller decodes every payload before feeding it: an undecodable live
// batch is never fed (it must not move the sequence), an undecodable
// replayed one is not fed either, so its seq shows as a missing reply.
//
// The rules, from the publisher's contract (vLLM ZmqEventPublisher):
//
//   - Sequence numbers start at 0 per publisher process and grow by one per
//     batch. The sequencer remembers the print (BatchPrint) of the last
//     printRing batches it delivered. A live batch at or below the last
//     delivered seq is a duplicate if it is the remembered batch (same
//     seq and print: a replay overtook the live stream, or the batch came
//     twice) and is dropped; otherwise it comes from a new process: Reset
//     the engine, then treat the batch as the first of a fresh stream.
//     Only a new connection can carry a new process (a restarted engine
//     reconnects), so a sequence that goes backwards on the connection
//     the stream's last batch came on (a seq wrapping past 2^64-1, a
//     peer's forged batch) proves nothing: the engine is reset all the
//     same (its old entries are no longer vouched for) and the fresh
//     stream's start is unknown (HealthUnconfirmed, NoteBackwards).
//   - A number that jumps (seq > last+1) means the live socket lost batches
//     (high-water mark, reconnect). Ask the replay socket for everything
//     from last (not last+1: the reply under last must be the remembered
//     batch, which proves the engine is still the same process), hold the
//     live batches that keep arriving meanwhile (in seq order, whatever
//     order they arrive in), apply the replayed ones in order, then the
//     held ones, dropping duplicates. A live batch that arrives after its
//     place was given up is dropped as late: nothing is ever applied out
//     of order.
//   - A stream with history whose socket (re)connects (Connected), or that
//     was resumed from a Position (Resume), verifies the same way: replay
//     from last. The first reply under last decides: the remembered batch
//     means the same process (the replay goes on as a gap's would);
//     another batch, a first reply past last (the engine's buffer moved
//     on, so its identity cannot be proven), or an empty replay means a
//     new process: Reset, then bootstrap as a fresh stream. An engine that
//     cannot be identified is treated as new, because entries of a
//     process that is gone would be phantoms.
//   - The first batch of a fresh stream with seq > 0 means the subscriber
//     joined late: ask for a replay from 0 to recover what the engine still
//     holds in its buffer (the last buffer_steps batches). A stream whose
//     socket connects asks at once (Connected), without waiting for a
//     batch.
//
// Without a replay endpoint nothing can be verified: after a reconnect the
// next live batch decides how to go on (at or below last and not the
// remembered batch: restart; last+1: accepted; beyond: a gap, lost), but
// not whether the entries are still exact: a restarted engine whose first
// batches were lost while the connection came back (ZMQ's slow joiner)
// may well go on at last+1 with an empty cache. A stream with history
// that reconnects without a replay endpoint is therefore HealthUnconfirmed
// (NoteUnverifiable): engines without replay are exact only until their
// first reconnect.
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
// evicts it). Health (see the Health type, the one home of what each state
// means and how a stream leaves it) reports all this; each change is a
// NoteHealth.
//
// A Sequencer is not safe for concurrent use; one goroutine owns it. Its
// output may call back into it (Degrade, Cleared, DisableReplay) from
// within Deliver.
type Sequencer struct {
	out       SequencerOutput
	canReplay bool  // a replay endpoint exists
	maxHeld   int   // bound on live batches held during a replay
	timeout   int64 // replay timeout, nanoseconds

	// History: what was delivered since the start, a reset or a resume.
	applied bool   // at least one batch delivered (or a position resumed)
	last    uint64 // seq of the last delivered batch
	first   uint64 // the oldest seq of the history: ring knows nothing older
	ring    *[printRing]uint64

	liveSeen bool   // a live batch of the current process arrived
	liveHigh uint64 // the highest live seq of the current process
	// reconnected: the live socket (re)connected since the last batch was
	// delivered, so the next one may come from a new process.
	reconnected bool

	// Health flags; Health reports the worst that applies.
	degraded     bool   // batches lost mid-stream
	unknownStart bool   // the history does not reach back to the engine's first batch
	unchecked    bool   // a reconnect could not be verified
	restored     bool   // resumed from a Position, not yet verified
	reported     Health // the health last noted
	verifyNext   bool   // resumed: verify before the first live batch unless Connected did

	replaying   bool
	kind        replayKind
	verifying   bool   // the outstanding replay's deciding reply has not arrived
	replayFrom  uint64 // first seq asked for
	deadline    int64  // the caller's monotonic nanoseconds
	gotReply    bool   // a data reply of the outstanding replay arrived
	hole        ReplayFailure
	replayedMin uint64 // range delivered by the outstanding replay
	replayedMax uint64
	replayedAny bool
	held        []heldBatch // sorted by seq, no seq twice
	spare       []heldBatch // the other half of a double buffer for draining
}

// replayKind says why a replay was requested.
type replayKind uint8

const (
	replayGap       replayKind = iota // a live gap: from last, verifying
	replayBootstrap                   // a fresh stream: from 0
	replayReconnect                   // a stream with history (re)connected or was resumed: from last, verifying
)

// printRing is how many delivered batches a sequencer remembers the print
// of: enough for the live copies of a replay's batches, which arrive right
// after it, and for the reply that verifies a reconnect (the last batch).
// The ring is allocated once per stream (8 KiB), on its first delivery.
const printRing = 1024

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
	// without history because no replay endpoint exists: the stream is
	// HealthUnconfirmed.
	NoteJoin
	// NoteTruncated: a bootstrap replay from From began at To > From: the
	// engine's buffer no longer holds older batches, so the start of its
	// history is unknown (HealthUnconfirmed). No replay could have
	// recovered those batches, so the replay itself did not fail.
	NoteTruncated
	// NoteHealth: the stream's health changed to Health.
	NoteHealth
	// NoteVerified: a replay's reply under seq From carried the print
	// remembered for it: the engine is the process the stream's history
	// came from.
	NoteVerified
	// NoteReplayRestart: a replay from From showed another engine process
	// (Reason: ReplayMismatch, another batch under From; ReplayTruncated,
	// the first reply To > From; ReplayIncomplete, nothing at or after
	// From). The engine is reset and bootstrapped as a fresh stream.
	NoteReplayRestart
	// NoteLate: live seq From arrived after the stream had moved past it
	// without it (its hole was declared lost): dropped, never applied out
	// of order.
	NoteLate
	// NoteBackwards: live seq To, an unknown batch, arrived after From on
	// the connection the stream's history came on, where no new engine
	// process can be: the engine is reset and its fresh stream is
	// HealthUnconfirmed (Sequencer: a restart needs a reconnect).
	NoteBackwards
	// NoteUnverifiable: a stream with history reconnected, and without a
	// replay endpoint nothing can show that the engine is still the
	// process the history came from: HealthUnconfirmed.
	NoteUnverifiable
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
	case NoteHealth:
		return "health"
	case NoteVerified:
		return "verified"
	case NoteReplayRestart:
		return "replay-restart"
	case NoteLate:
		return "late"
	case NoteBackwards:
		return "backwards"
	case NoteUnverifiable:
		return "unverifiable"
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
	ReplayMismatch                         // the reply under the verified seq was another batch: another process
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
	case ReplayMismatch:
		return "mismatch"
	}
	return ""
}

// Note is one noteworthy step of a Sequencer.
type Note struct {
	Kind      NoteKind
	From, To  uint64        // meaning per Kind
	Reason    ReplayFailure // NoteReplayFailed, NoteReplayRestart
	Bootstrap bool          // NoteReplayStart, NoteReplayDone, NoteReplayFailed
	Health    Health        // NoteHealth
}

// heldBatch is a live batch held while a replay is outstanding.
type heldBatch struct {
	seq, print uint64
	payload    []byte
}

// NewSequencer returns the sequencer of a fresh stream (no history,
// healthy, no replay outstanding) that answers through out.
func NewSequencer(out SequencerOutput, cfg SequencerConfig) *Sequencer {
	return &Sequencer{
		out:       out,
		canReplay: cfg.CanReplay,
		maxHeld:   max(cfg.MaxHeld, 1),
		timeout:   int64(cfg.ReplayTimeout),
	}
}

// Resume gives a fresh sequencer the history a Position describes, as if
// it had delivered batch p.Seq with print p.Print: the stream is
// HealthRestored (or worse, if p.Health was) until the engine confirms
// it. With a replay endpoint it verifies on Connected, or else before its
// first live batch; without one, a live p.Seq+1 carries on (still
// restored) and anything at or below p.Seq is a restart. Call it before
// any other input.
func (s *Sequencer) Resume(p Position) {
	s.forget()
	// Whatever connection comes next is new: the history is an earlier
	// kvindex process's.
	s.reconnected = true
	s.applied, s.last, s.first = true, p.Seq, p.Seq
	s.ring = new([printRing]uint64)
	s.ring[p.Seq%printRing] = p.Print
	s.restored = true
	s.degraded = p.Health == HealthDegraded
	s.unknownStart = p.Health == HealthUnconfirmed
	s.verifyNext = true
	s.noteHealth()
}

// Live handles a batch from the live stream. payload need only be valid
// during the call: a batch the sequencer holds is copied.
func (s *Sequencer) Live(seq uint64, payload []byte, now int64) {
	if s.verifyNext {
		s.verifyNext = false
		if s.canReplay && !s.replaying {
			s.startReplay(s.last, replayReconnect, now)
		}
	}
	switch {
	case s.applied && seq <= s.last:
		if s.known(seq, payload) {
			s.out.Note(Note{Kind: NoteDuplicate, From: seq})
			return
		}
		s.restartLive(seq)
	case s.replaying:
		if i, found := s.heldAt(seq); found {
			if s.held[i].print == BatchPrint(payload) {
				s.out.Note(Note{Kind: NoteDuplicate, From: seq})
				return
			}
			s.restartLive(seq)
		}
	case s.applied && s.liveSeen && seq <= s.liveHigh:
		s.out.Note(Note{Kind: NoteLate, From: seq})
		return
	}
	if !s.liveSeen || seq > s.liveHigh {
		s.liveHigh = seq
	}
	s.liveSeen = true
	s.accept(seq, payload, now)
	s.noteHealth()
}

// restartLive handles a live batch that only a new process can have sent.
// A new process comes on a new connection: without one in between, the
// batch proves no restart (see Sequencer), so the fresh stream that
// follows has an unknown start.
func (s *Sequencer) restartLive(seq uint64) {
	if s.replaying {
		s.abandonReplay()
	}
	// The held batches belong to the old process, whose state the reset
	// discards anyway.
	s.dropHeld()
	proven := s.reconnected
	kind := NoteRestart
	if !proven {
		kind = NoteBackwards
	}
	s.out.Note(Note{Kind: kind, From: max(s.liveHigh, s.last), To: seq})
	if !proven {
		// Flagged before the reset: never ok in between.
		s.unknownStart = true
		s.noteHealth()
	}
	s.out.Reset(ResetRestart)
	s.forget()
	// A proven restart's health is noted once the batch is placed (Live):
	// one seen from a later batch is unconfirmed, not ok in between.
	s.unknownStart = !proven
}

// accept places a live batch that is neither a restart nor a duplicate.
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
			s.startReplay(s.last, replayGap, now)
			return
		}
		s.lose(s.last+1, seq)
		s.apply(seq, payload)
	}
}

// Connected reports that the live socket (re)connected. A stream with no
// history asks for the engine's replay buffer right away instead of
// waiting for the next batch, so an idle engine's cached blocks are known
// before it publishes again; a stream with history verifies that the
// engine is still the process its history came from.
func (s *Sequencer) Connected(now int64) {
	s.reconnected = true
	if !s.canReplay {
		// A resumed stream stays restored: it was never confirmed.
		if s.applied && !s.restored && !s.unchecked {
			s.out.Note(Note{Kind: NoteUnverifiable, From: s.last})
			s.unchecked = true
			s.noteHealth()
		}
		return
	}
	if s.applied {
		s.verifyNext = false
		if s.replaying {
			// The new connection may belong to a new process: ask
			// again, verifying. Held batches stay held.
			s.abandonReplay()
		}
		s.startReplay(s.last, replayReconnect, now)
		return
	}
	if s.replaying || s.liveSeen {
		return
	}
	s.startReplay(0, replayBootstrap, now)
}

// fresh handles the first batch of a stream with no history.
func (s *Sequencer) fresh(seq uint64, payload []byte, now int64) {
	if seq == 0 {
		s.apply(seq, payload)
		return
	}
	if !s.canReplay {
		s.out.Note(Note{Kind: NoteJoin, From: seq})
		s.unknownStart = true
		s.noteHealth()
		s.apply(seq, payload)
		return
	}
	s.hold(seq, payload)
	s.startReplay(0, replayBootstrap, now)
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
	if s.verifying {
		s.verify(seq, payload, now)
		return
	}
	if !s.gotReply {
		s.gotReply = true
		if seq > s.replayFrom {
			if s.kind == replayBootstrap {
				s.out.Note(Note{Kind: NoteTruncated, From: s.replayFrom, To: seq})
				s.unknownStart = true
				s.noteHealth()
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
	if !s.replayedAny {
		s.replayedAny = true
		s.replayedMin = seq
	}
	s.replayedMax = seq
}

// verify handles a reply of a verifying replay (from last) that has not
// yet decided. A reply the ring remembers, with the same print, proves the
// same process; a remembered seq with another print, or a reply past
// last, proves nothing or another process. Replies older than the ring
// remembers say nothing and are dropped.
func (s *Sequencer) verify(seq uint64, payload []byte, now int64) {
	p, ok := s.printOf(seq)
	switch {
	case seq < s.last && !ok:
		return
	case ok && p == BatchPrint(payload):
		s.verifying, s.gotReply = false, true
		s.out.Note(Note{Kind: NoteVerified, From: seq})
	case seq > s.last:
		s.replayRestart(ReplayTruncated, seq, true, now)
	default:
		s.replayRestart(ReplayMismatch, seq, true, now)
	}
}

// replayRestart handles a verifying replay that showed a new process:
// reset the engine and bootstrap it as a fresh stream.
func (s *Sequencer) replayRestart(r ReplayFailure, seq uint64, cancel bool, now int64) {
	s.out.Note(Note{Kind: NoteReplayRestart, From: s.last, To: seq, Reason: r})
	if cancel {
		s.abandonReplay()
	}
	s.replaying, s.verifying = false, false
	// Held batches may predate the new connection: the bootstrap replay
	// returns those of the new process.
	s.dropHeld()
	s.out.Reset(ResetRestart)
	s.forget()
	s.noteHealth()
	s.startReplay(0, replayBootstrap, now)
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
	if s.verifying {
		// Nothing at or after last: a new process with fewer batches.
		s.replayRestart(ReplayIncomplete, s.last, false, now)
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
		n := Note{Kind: NoteReplayDone, From: s.replayFrom, To: s.replayFrom, Bootstrap: s.kind == replayBootstrap}
		if s.replayedAny {
			n.From, n.To = s.replayedMin, s.replayedMax+1
		}
		s.out.Note(n)
		if s.kind != replayBootstrap {
			// Verified and complete: every batch since the
			// position the history ends at is applied.
			s.restored, s.unchecked = false, false
			s.noteHealth()
		}
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
// downstream is exact again, whatever came before.
func (s *Sequencer) Cleared() {
	s.degraded, s.unknownStart, s.unchecked, s.restored = false, false, false, false
	s.noteHealth()
}

// Degrade marks the stream degraded from outside: a delivered batch could
// not be applied, so the engine's state downstream is no longer exact.
func (s *Sequencer) Degrade() {
	s.degraded = true
	s.noteHealth()
}

// DisableReplay makes the stream carry on without a replay endpoint (the
// caller lost its replay socket): later gaps degrade the stream at once.
// It does not end an outstanding replay.
func (s *Sequencer) DisableReplay() { s.canReplay = false }

// Health reports what the stream's delivered state can be trusted for:
// the worst state that applies (see Health).
func (s *Sequencer) Health() Health {
	switch {
	case s.degraded:
		return HealthDegraded
	case s.unknownStart || s.unchecked:
		return HealthUnconfirmed
	case s.restored:
		return HealthRestored
	}
	return HealthOK
}

// Position reports the last delivered batch's sequence number and print,
// and the stream's health; ok is false if nothing was delivered (or
// resumed) since the start or the last reset.
func (s *Sequencer) Position() (seq, print uint64, h Health, ok bool) {
	if !s.applied {
		return 0, 0, s.Health(), false
	}
	return s.last, s.ring[s.last%printRing], s.Health(), true
}

// Replaying reports whether a replay is outstanding.
func (s *Sequencer) Replaying() bool { return s.replaying }

// ReplayDeadline reports the outstanding replay's deadline, on the
// caller's clock; ok is false when no replay is outstanding.
func (s *Sequencer) ReplayDeadline() (deadline int64, ok bool) { return s.deadline, s.replaying }

// Held reports how many live batches wait for the outstanding replay; it
// never exceeds SequencerConfig.MaxHeld.
func (s *Sequencer) Held() int { return len(s.held) }

func (s *Sequencer) startReplay(from uint64, kind replayKind, now int64) {
	s.replaying = true
	s.kind = kind
	s.verifying = kind != replayBootstrap
	s.replayFrom = from
	s.deadline = now + s.timeout
	s.gotReply = false
	s.hole = ReplayOK
	s.replayedAny = false
	s.out.Note(Note{Kind: NoteReplayStart, From: from, Bootstrap: kind == replayBootstrap})
	if !s.out.RequestReplay(from) {
		s.replaying, s.verifying = false, false
		s.fail(ReplayUnavailable)
		s.drain(now)
	}
}

// abandonReplay stops waiting for the outstanding replay.
func (s *Sequencer) abandonReplay() {
	s.replaying, s.verifying = false, false
	s.out.CancelReplay()
}

// fail reports a replay that did not do its job. A reconnect that could
// not be checked (no answer at all) leaves the stream unconfirmed, or
// restored if it was resumed and never verified; everything else leaves
// a hole, so the stream is degraded.
func (s *Sequencer) fail(r ReplayFailure) {
	s.out.Note(Note{Kind: NoteReplayFailed, From: s.replayFrom, Reason: r, Bootstrap: s.kind == replayBootstrap})
	s.verifying = false
	if s.kind == replayReconnect && (r == ReplayUnavailable || r == ReplayTimedOut) {
		s.unchecked = s.unchecked || !s.restored
	} else {
		s.degraded = true
	}
	s.noteHealth()
}

// lose reports batches [from, to) as lost for good.
func (s *Sequencer) lose(from, to uint64) {
	s.out.Note(Note{Kind: NoteLost, From: from, To: to})
	s.degraded = true
	s.noteHealth()
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
			s.lose(s.last+1, first.seq)
		}
		s.apply(first.seq, first.payload)
	}
	for _, h := range batch[1:] {
		s.accept(h.seq, h.payload, now)
	}
	clear(batch)
	s.spare = batch[:0]
}

// printOf returns the print remembered for a delivered seq; ok is false
// if the ring does not know it (never delivered, lost, or too old).
func (s *Sequencer) printOf(seq uint64) (print uint64, ok bool) {
	if !s.applied || seq > s.last || seq < s.first || s.last-seq >= printRing {
		return 0, false
	}
	p := s.ring[seq%printRing]
	return p, p != 0
}

// known reports whether payload is the batch delivered under seq.
func (s *Sequencer) known(seq uint64, payload []byte) bool {
	p, ok := s.printOf(seq)
	return ok && p == BatchPrint(payload)
}

// heldAt returns where seq is, or would go, among the held batches.
func (s *Sequencer) heldAt(seq uint64) (int, bool) {
	return slices.BinarySearchFunc(s.held, seq, func(h heldBatch, seq uint64) int {
		switch {
		case h.seq < seq:
			return -1
		case h.seq > seq:
			return 1
		}
		return 0
	})
}

// hold keeps a live batch, in seq order, until the outstanding replay
// ends. The caller's payload is only valid during the call (it aliases a
// receive buffer), so it is copied: holding is the rare path. A batch
// under a seq already held is dropped (Live checked it is the same).
func (s *Sequencer) hold(seq uint64, payload []byte) {
	i, found := s.heldAt(seq)
	if found {
		return
	}
	s.held = slices.Insert(s.held, i, heldBatch{seq, BatchPrint(payload), bytes.Clone(payload)})
}

func (s *Sequencer) dropHeld() {
	clear(s.held)
	s.held = s.held[:0]
}

// forget drops the history and the health flags: the stream is fresh. The
// caller notes the health once it is known.
func (s *Sequencer) forget() {
	s.applied, s.last, s.first = false, 0, 0
	if s.ring != nil {
		clear(s.ring[:])
	}
	s.liveSeen, s.liveHigh = false, 0
	s.reconnected = false
	s.degraded, s.unknownStart, s.unchecked, s.restored = false, false, false, false
	s.verifyNext = false
}

func (s *Sequencer) apply(seq uint64, payload []byte) {
	if s.ring == nil {
		s.ring = new([printRing]uint64)
	}
	if !s.applied {
		s.first = seq
	} else {
		// Forget whatever the slots of a hole remember from older
		// batches.
		for q := s.last + 1; q < seq && q-s.last <= printRing; q++ {
			s.ring[q%printRing] = 0
		}
	}
	s.ring[seq%printRing] = BatchPrint(payload)
	s.applied = true
	s.last = seq
	s.reconnected = false
	s.out.Deliver(seq, payload)
}

// noteHealth reports a change of Health.
func (s *Sequencer) noteHealth() {
	if h := s.Health(); h != s.reported {
		s.reported = h
		s.out.Note(Note{Kind: NoteHealth, Health: h})
	}
}
