package zmqtransport

import (
	"cmp"
	"sync/atomic"

	"github.com/kvindex/kvindex/kvevents"
)

// streamCounters are a stream's live counters. The stream's goroutine
// writes them; Stats readers load them without locks.
type streamCounters struct {
	engine         atomic.Pointer[kvevents.EngineID]
	endpoint       string
	replayEndpoint atomic.Pointer[string] // bind mode with {addr}: follows the engine's source
	bind           bool
	listener       *listenerCounters // bind mode: for Connected

	batches, events, decodeErrors, unknownEvents atomic.Uint64
	gaps, lost, duplicates                       atomic.Uint64
	replaysOK, replaysFailed                     atomic.Uint64
	restarts, resets, rankMismatches             atomic.Uint64
	verified, replayRestarts                     atomic.Uint64
	lastSeq                                      atomic.Uint64
	lastEvent                                    atomic.Int64
	clock                                        kvevents.BatchClock
	connected, replaying                         atomic.Bool
	health                                       atomic.Uint32 // kvevents.Health, mirrored from the sequencer's NoteHealth
	// pending marks a bind-mode stream resumed from a position whose
	// engine has not sent anything yet: not connected, whatever the
	// listener's peers.
	pending atomic.Bool
	// tracked marks a bind-mode stream whose connection is known (its
	// batches carry their source fd): connected then follows that
	// connection alone, not the listener's peers.
	tracked atomic.Bool
}

func (c *streamCounters) snapshot() kvevents.StreamStats {
	st := kvevents.StreamStats{
		Engine:            *c.engine.Load(),
		Endpoint:          c.endpoint,
		ReplayEndpoint:    *c.replayEndpoint.Load(),
		Bind:              c.bind,
		Batches:           c.batches.Load(),
		Events:            c.events.Load(),
		DecodeErrors:      c.decodeErrors.Load(),
		UnknownEvents:     c.unknownEvents.Load(),
		Gaps:              c.gaps.Load(),
		LostBatches:       c.lost.Load(),
		Duplicates:        c.duplicates.Load(),
		ReplaysOK:         c.replaysOK.Load(),
		ReplaysFailed:     c.replaysFailed.Load(),
		Restarts:          c.restarts.Load(),
		Verified:          c.verified.Load(),
		ReplayRestarts:    c.replayRestarts.Load(),
		Resets:            c.resets.Load(),
		RankMismatches:    c.rankMismatches.Load(),
		LastSeq:           c.lastSeq.Load(),
		LastEventUnixNano: c.lastEvent.Load(),
		Connected:         c.connected.Load(),
		Health:            kvevents.Health(c.health.Load()),
		Replaying:         c.replaying.Load(),
	}
	st.LastBatchStampUnixNano, st.LastBatchLag = c.clock.Load()
	if c.listener != nil && !c.tracked.Load() {
		st.Connected = !c.pending.Load() && c.listener.peers.Load() > 0
	}
	return st
}

// listenerCounters are a listen socket's live counters.
type listenerCounters struct {
	endpoint                                      atomic.Pointer[string]
	peers                                         atomic.Int64
	messages, malformed, unknownTopics, decodeErr atomic.Uint64
	badRanks, conflicts, refused                  atomic.Uint64
	refusedSource, refusedHandshake, forgotten    atomic.Uint64
	refusedFull                                   atomic.Uint64
	unproven, displaced                           atomic.Uint64
}

func (c *listenerCounters) snapshot() kvevents.ListenerStats {
	ls := kvevents.ListenerStats{
		Peers:           c.peers.Load(),
		Messages:        c.messages.Load(),
		MalformedFrames: c.malformed.Load(),
		UnknownTopics:   c.unknownTopics.Load(),
		DecodeErrors:    c.decodeErr.Load(),
		BadRanks:        c.badRanks.Load(),
		Conflicts:       c.conflicts.Load(),
		RefusedEngines:  c.refused.Load(),

		RefusedSources:     c.refusedSource.Load(),
		RefusedHandshakes:  c.refusedHandshake.Load(),
		RefusedConnections: c.refusedFull.Load(),
		ForgottenEngines:   c.forgotten.Load(),
		UnprovenEngines:    c.unproven.Load(),
		DisplacedEngines:   c.displaced.Load(),
	}
	if ep := c.endpoint.Load(); ep != nil {
		ls.Endpoint = *ep
	}
	return ls
}

// compareStreams orders snapshots by pod, rank, model, then endpoint.
func compareStreams(a, b kvevents.StreamStats) int {
	return cmp.Or(
		cmp.Compare(a.Engine.Pod, b.Engine.Pod),
		cmp.Compare(a.Engine.DPRank, b.Engine.DPRank),
		cmp.Compare(a.Engine.Model, b.Engine.Model),
		cmp.Compare(a.Endpoint, b.Endpoint),
	)
}

// logEvery reports whether the n-th occurrence of a repetitive problem
// should be logged: the first few, then one in every thousand.
func logEvery(n uint64) bool {
	const first, every = 10, 1000
	return n <= first || n%every == 0
}

// compareEngineIDs orders engines by pod, rank, then model.
func compareEngineIDs(a, b kvevents.EngineID) int {
	return cmp.Or(cmp.Compare(a.Pod, b.Pod), cmp.Compare(a.DPRank, b.DPRank), cmp.Compare(a.Model, b.Model))
}

// Counters never wrap. An Add(1) per message cannot reach 2^64, nor can
// the per-batch amounts (events, skipped events, AllBlocksCleared
// resets: each bounded by kvevents.Limits.MaxEvents). The lost-batch
// count can: it adds a difference of sequence numbers, which a publisher
// sets freely (one batch with seq near 2^64 adds almost 2^64), so it is
// added through addSpan.

// span is the number of sequence numbers in [from, to): to-from, or 0 if
// to <= from (a reversed range never underflows into a huge count).
func span(from, to uint64) uint64 {
	if to <= from {
		return 0
	}
	return to - from
}

// addSaturating adds n to c, stopping at the largest uint64 instead of
// wrapping around to small numbers.
func addSaturating(c *atomic.Uint64, n uint64) {
	for {
		old := c.Load()
		sum := old + n
		if sum < old {
			sum = ^uint64(0)
		}
		if sum == old || c.CompareAndSwap(old, sum) {
			return
		}
	}
}
