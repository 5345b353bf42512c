package kvevents

import (
	"bytes"
	"hash/maphash"
)

// The sequencer turns the live batches and replay replies of one publisher
// (one engine's data-parallel rank) into a gap-free, duplicate-free,
// in-order stream. It is a pure state machine: no sockets, no clocks, no
// goroutines. Its caller feeds it events (a live batch, a replayed batch, the
// replay end marker, the passage of time) and it answers synchronously
// through a seqOutput: deliver this batch, reset the engine, request or
// cancel a replay. Everything a stream does differently from "deliver in
// order" is also reported as a seqNote, which the caller turns into counters
// and log lines.
//
// The rules, from the publisher's contract (vLLM ZmqEventPublisher):
//
//   - Sequence numbers start at 0 per publisher process and grow by one per
//     batch. A live number that does not grow means a new process: Reset
//     the engine, then treat the batch as the first of a fresh stream. A
//     replay can apply batches that are still in flight on the live socket;
//     their live copies are recognised by content and dropped as
//     duplicates instead.
//   - A number that jumps (seq > last+1) means the SUB socket lost batches
//     (high-water mark, reconnect). Ask the replay socket for everything
//     from last+1, hold the live batches that keep arriving meanwhile, apply
//     the replayed ones in order, then the held ones, dropping duplicates.
//   - The first batch of a fresh stream with seq > 0 means kvindex joined
//     late: ask for a replay from 0 to recover what the engine still holds
//     in its buffer (the last buffer_steps batches). A connect-mode stream
//     asks as soon as its socket connects, without waiting for a batch.
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
// makes the stream healthy again.

// noteKind says what a seqNote reports.
type noteKind uint8

const (
	// noteGap: live seq `to` arrived while `from` was expected; batches
	// [from, to) are missing for now.
	noteGap noteKind = iota + 1
	// noteReplayStart: a replay from `from` was requested (bootstrap: the
	// stream had no history yet).
	noteReplayStart
	// noteReplayDone: the replay ended and closed every hole it was
	// asked to; it applied batches [from, to) (none if from == to).
	noteReplayDone
	// noteReplayFailed: the replay could not close its hole; see reason.
	noteReplayFailed
	// noteLost: batches [from, to) will never be applied.
	noteLost
	// noteRestart: seq `to` arrived after `from` had been applied: the
	// publisher restarted.
	noteRestart
	// noteDuplicate: seq `from` had already been applied; dropped.
	noteDuplicate
	// noteStray: a replay frame (seq `from`, or the end marker) arrived
	// while no replay was outstanding; dropped.
	noteStray
	// noteJoin: the stream's first batch, seq `from` > 0, was applied
	// without history because no replay endpoint exists.
	noteJoin
	// noteTruncated: a bootstrap replay began at `to` > `from`: the
	// engine's buffer no longer holds older batches. Not a failure: those
	// batches predate kvindex and no replay could have recovered them.
	noteTruncated
	// noteDegraded and noteHealthy report changes of the degraded flag.
	noteDegraded
	noteHealthy
)

func (k noteKind) String() string {
	switch k {
	case noteGap:
		return "gap"
	case noteReplayStart:
		return "replay-start"
	case noteReplayDone:
		return "replay-done"
	case noteReplayFailed:
		return "replay-failed"
	case noteLost:
		return "lost"
	case noteRestart:
		return "restart"
	case noteDuplicate:
		return "duplicate"
	case noteStray:
		return "stray"
	case noteJoin:
		return "join"
	case noteTruncated:
		return "truncated"
	case noteDegraded:
		return "degraded"
	case noteHealthy:
		return "healthy"
	}
	return "note?"
}

// failReason says why a replay did not close its hole.
type failReason uint8

const (
	failNone        failReason = iota
	failUnavailable            // the request could not be sent
	failTimeout                // no end marker within the timeout
	failTruncated              // the first reply was newer than requested: the engine's buffer moved on
	failIncomplete             // the replay ended with a hole still open (a reply lost, or nothing returned)
	failOverflow               // too many live batches arrived while waiting
)

func (r failReason) String() string {
	switch r {
	case failUnavailable:
		return "unavailable"
	case failTimeout:
		return "timeout"
	case failTruncated:
		return "truncated"
	case failIncomplete:
		return "incomplete"
	case failOverflow:
		return "overflow"
	}
	return ""
}

// seqNote is one noteworthy step of a sequencer.
type seqNote struct {
	kind      noteKind
	from, to  uint64
	reason    failReason // noteReplayFailed
	bootstrap bool       // noteReplayStart, noteReplayDone, noteReplayFailed
}

// seqOutput receives a sequencer's decisions, synchronously and in order.
type seqOutput interface {
	// deliver applies one batch. It is called exactly once per sequence
	// number of a publisher process, in increasing order.
	deliver(seq uint64, payload []byte)
	// reset forgets the engine's state (the publisher restarted).
	reset(reason ResetReason)
	// requestReplay asks the publisher for every batch from `from` on; it
	// reports false if the request could not be sent.
	requestReplay(from uint64) bool
	// cancelReplay abandons the outstanding request; replies to it must
	// never be fed back (the caller discards the replay socket).
	cancelReplay()
	// note reports a step worth counting or logging.
	note(n seqNote)
}

// heldBatch is a live batch held while a replay is outstanding.
type heldBatch struct {
	seq     uint64
	payload []byte
}

// sequencer orders one publisher's batches. The zero value is not ready;
// use init.
type sequencer struct {
	out         seqOutput
	canReplay   bool  // a replay endpoint exists
	maxHeld     int   // bound on live batches held during a replay
	timeout     int64 // replay timeout, nanoseconds
	applied     bool  // at least one batch delivered since start or reset
	last        uint64
	liveSeen    bool   // a live batch of the current process arrived
	liveHigh    uint64 // the highest live seq of the current process
	degraded    bool
	replaying   bool
	bootstrap   bool   // the outstanding replay started on a fresh stream
	replayFrom  uint64 // first seq asked for
	deadline    int64  // monotonic nanoseconds
	gotReply    bool   // a data reply of the outstanding replay arrived
	hole        failReason
	replayedMin uint64 // range delivered by the outstanding replay
	replayedMax uint64
	replayedAny bool
	held        []heldBatch
	spare       []heldBatch               // the other half of a double buffer for draining
	prints      *[replayPrints]batchPrint // allocated on the first replay
	printSeed   maphash.Seed
}

// batchPrint is the fingerprint of one replayed batch.
type batchPrint struct {
	seq, sum uint64
	ok       bool
}

func (s *sequencer) init(out seqOutput, canReplay bool, maxHeld int, timeout int64) {
	*s = sequencer{out: out, canReplay: canReplay, maxHeld: maxHeld, timeout: timeout}
	if s.maxHeld < 1 {
		s.maxHeld = 1
	}
}

// live handles a batch from the live (SUB) stream.
func (s *sequencer) live(seq uint64, payload []byte, now int64) {
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
func (s *sequencer) accept(seq uint64, payload []byte, now int64) {
	switch {
	case s.replaying:
		s.hold(seq, payload)
		if len(s.held) > s.maxHeld {
			s.abandonReplay()
			s.fail(failOverflow)
			s.drain(now)
		}
	case !s.applied:
		s.fresh(seq, payload, now)
	case seq <= s.last:
		// Already applied from a replay that overtook the live stream.
		s.out.note(seqNote{kind: noteDuplicate, from: seq})
	case seq == s.last+1:
		s.apply(seq, payload)
	default:
		s.out.note(seqNote{kind: noteGap, from: s.last + 1, to: seq})
		if s.canReplay {
			s.hold(seq, payload)
			s.startReplay(s.last+1, false, now)
			return
		}
		s.out.note(seqNote{kind: noteLost, from: s.last + 1, to: seq})
		s.setDegraded(true)
		s.apply(seq, payload)
	}
}

// connected reports that the live socket (re)connected. A stream with no
// history asks for the engine's replay buffer right away instead of
// waiting for the next batch, so an idle engine's cached blocks are known
// before it publishes again.
func (s *sequencer) connected(now int64) {
	if !s.canReplay || s.applied || s.replaying || s.liveSeen {
		return
	}
	s.startReplay(0, true, now)
}

// fresh handles the first batch of a stream with no history.
func (s *sequencer) fresh(seq uint64, payload []byte, now int64) {
	if seq == 0 {
		s.apply(seq, payload)
		return
	}
	if !s.canReplay {
		s.out.note(seqNote{kind: noteJoin, from: seq})
		s.apply(seq, payload)
		return
	}
	s.hold(seq, payload)
	s.startReplay(0, true, now)
}

// replayed handles one data reply of the replay socket. Each reply
// extends the deadline: the timeout bounds silence, not the length of a
// large replay.
func (s *sequencer) replayed(seq uint64, payload []byte, now int64) {
	if !s.replaying {
		s.out.note(seqNote{kind: noteStray, from: seq})
		return
	}
	s.deadline = now + s.timeout
	if !s.gotReply {
		s.gotReply = true
		if seq > s.replayFrom {
			if s.bootstrap {
				s.out.note(seqNote{kind: noteTruncated, from: s.replayFrom, to: seq})
			} else {
				s.hole = failTruncated
			}
		}
	}
	if s.applied && seq <= s.last {
		s.out.note(seqNote{kind: noteDuplicate, from: seq})
		return
	}
	// Held live batches older than this reply go first: the replay
	// skipped them (the engine's buffer moved on, or a reply was lost).
	for len(s.held) > 0 && s.held[0].seq < seq {
		h := s.held[0]
		s.held = s.held[1:]
		if s.applied && h.seq <= s.last {
			s.out.note(seqNote{kind: noteDuplicate, from: h.seq})
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
func (s *sequencer) applyAfterHole(seq uint64, payload []byte) {
	if s.applied && seq > s.last+1 {
		if s.hole == failNone {
			s.hole = failIncomplete
		}
		s.out.note(seqNote{kind: noteLost, from: s.last + 1, to: seq})
	}
	s.apply(seq, payload)
}

// replayEnd handles the replay end marker.
func (s *sequencer) replayEnd(now int64) {
	if !s.replaying {
		s.out.note(seqNote{kind: noteStray, from: ^uint64(0)})
		return
	}
	s.replaying = false
	if len(s.held) > 0 {
		next := s.held[0].seq
		if (s.applied && next > s.last+1) || (!s.applied && next > 0) {
			if s.hole == failNone {
				s.hole = failIncomplete
			}
		}
	}
	if s.hole != failNone {
		s.fail(s.hole)
	} else {
		n := seqNote{kind: noteReplayDone, from: s.replayFrom, to: s.replayFrom, bootstrap: s.bootstrap}
		if s.replayedAny {
			n.from, n.to = s.replayedMin, s.replayedMax+1
		}
		s.out.note(n)
		s.setDegraded(false)
	}
	s.drain(now)
}

// tick lets time pass: an outstanding replay past its deadline fails.
func (s *sequencer) tick(now int64) {
	if !s.replaying || now < s.deadline {
		return
	}
	s.abandonReplay()
	s.fail(failTimeout)
	s.drain(now)
}

// cleared reports that an AllBlocksCleared was applied: the engine's state
// in the index is exact again, whatever holes came before.
func (s *sequencer) cleared() { s.setDegraded(false) }

// replayDeadline reports the outstanding replay's deadline.
func (s *sequencer) replayDeadline() (int64, bool) { return s.deadline, s.replaying }

func (s *sequencer) startReplay(from uint64, bootstrap bool, now int64) {
	s.replaying = true
	s.bootstrap = bootstrap
	s.replayFrom = from
	s.deadline = now + s.timeout
	s.gotReply = false
	s.hole = failNone
	s.replayedAny = false
	s.out.note(seqNote{kind: noteReplayStart, from: from, bootstrap: bootstrap})
	if !s.out.requestReplay(from) {
		s.replaying = false
		s.fail(failUnavailable)
		s.drain(now)
	}
}

// abandonReplay stops waiting for the outstanding replay.
func (s *sequencer) abandonReplay() {
	s.replaying = false
	s.out.cancelReplay()
}

// fail reports a replay that left a hole and degrades the stream.
func (s *sequencer) fail(r failReason) {
	s.out.note(seqNote{kind: noteReplayFailed, from: s.replayFrom, reason: r, bootstrap: s.bootstrap})
	s.setDegraded(true)
}

// drain delivers the held batches after a replay finished or failed. A hole
// before the first held batch is given up on (the replay that should have
// filled it is over); holes between held batches are live gaps like any
// other and may start a new replay, which holds the rest again.
func (s *sequencer) drain(now int64) {
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
		s.out.note(seqNote{kind: noteDuplicate, from: first.seq})
	default:
		if first.seq > s.last+1 {
			s.out.note(seqNote{kind: noteLost, from: s.last + 1, to: first.seq})
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
func (s *sequencer) remember(seq uint64, payload []byte) {
	if s.prints == nil {
		s.prints = new([replayPrints]batchPrint)
		s.printSeed = maphash.MakeSeed()
	}
	s.prints[seq%replayPrints] = batchPrint{seq: seq, sum: maphash.Bytes(s.printSeed, payload), ok: true}
}

// wasReplayed reports whether payload is the batch a replay applied under
// seq.
func (s *sequencer) wasReplayed(seq uint64, payload []byte) bool {
	if s.prints == nil {
		return false
	}
	p := s.prints[seq%replayPrints]
	return p.ok && p.seq == seq && p.sum == maphash.Bytes(s.printSeed, payload)
}

// hold keeps a live batch until the outstanding replay ends. The caller's
// payload is only valid during the call (it aliases a receive buffer), so
// it is copied: holding is the rare path.
func (s *sequencer) hold(seq uint64, payload []byte) {
	s.held = append(s.held, heldBatch{seq, bytes.Clone(payload)})
}

func (s *sequencer) restart(seq uint64) {
	s.out.note(seqNote{kind: noteRestart, from: max(s.liveHigh, s.last), to: seq})
	s.out.reset(ResetRestart)
	s.applied = false
	s.last = 0
	if s.prints != nil {
		clear(s.prints[:])
	}
	s.setDegraded(false)
}

func (s *sequencer) apply(seq uint64, payload []byte) {
	s.applied = true
	s.last = seq
	s.out.deliver(seq, payload)
}

func (s *sequencer) setDegraded(d bool) {
	if s.degraded == d {
		return
	}
	s.degraded = d
	if d {
		s.out.note(seqNote{kind: noteDegraded})
	} else {
		s.out.note(seqNote{kind: noteHealthy})
	}
}
