package kvevents

import (
	"cmp"
	"sync/atomic"
)

// StreamStats is a snapshot of one stream's counters: one engine's
// data-parallel rank. Counters only grow (a restart does not zero them), so
// they export directly as Prometheus counters; Connected, Degraded,
// Replaying, LastSeq and LastEventUnixNano are gauges.
type StreamStats struct {
	Engine EngineID
	// Endpoint is the SUB endpoint the stream is read from: the engine's
	// endpoint (connect mode) or the listen endpoint (bind mode).
	Endpoint string
	// ReplayEndpoint is where gaps are replayed from; "" if nowhere.
	ReplayEndpoint string
	// Bind reports a stream discovered on a listen socket.
	Bind bool

	Batches       uint64 // batches applied (Sink.Apply calls)
	Events        uint64 // events applied
	DecodeErrors  uint64 // batches or frames dropped as undecodable
	UnknownEvents uint64 // events skipped for an unknown tag (Batch.Skipped)
	Gaps          uint64 // sequence gaps detected on the live stream
	LostBatches   uint64 // batches known to be lost for good
	Duplicates    uint64 // batches dropped as already applied
	ReplaysOK     uint64 // replays that closed their hole (bootstrap included)
	ReplaysFailed uint64 // replays that did not (unavailable, timeout, truncated, ...)
	Restarts      uint64 // publisher restarts (sequence went back)
	// Resets counts every loss of the engine's state: restarts plus
	// AllBlocksCleared events applied.
	Resets uint64
	// RankMismatches counts batches whose dp_rank disagreed with the rank
	// the endpoint's port implies (connect mode).
	RankMismatches uint64

	LastSeq           uint64 // last applied sequence number
	LastEventUnixNano int64  // when the last batch was applied (0: never)
	Connected         bool   // the SUB socket has a live connection (bind mode: the listener has peers)
	Degraded          bool   // batches were lost and not recovered since the last replay or reset
	Replaying         bool   // a replay is outstanding
}

// ListenerStats is a snapshot of a bind-mode listen socket's counters:
// what could not be attributed to a stream.
type ListenerStats struct {
	Endpoint string
	Peers    int64 // engines currently connected

	Messages        uint64 // messages received
	MalformedFrames uint64 // not [topic, seq(8), payload]
	UnknownTopics   uint64 // topic did not match the topic pattern
	DecodeErrors    uint64 // payload undecodable, so its rank is unknown
	BadRanks        uint64 // dp_rank outside [0, MaxDPRank)
	Conflicts       uint64 // identity already owned by a configured engine
}

// streamCounters are a stream's live counters. The stream's goroutine
// writes them; Stats readers load them without locks.
type streamCounters struct {
	engine         atomic.Pointer[EngineID]
	endpoint       string
	replayEndpoint string
	bind           bool
	listener       *listenerCounters // bind mode: for Connected

	batches, events, decodeErrors, unknownEvents atomic.Uint64
	gaps, lost, duplicates                       atomic.Uint64
	replaysOK, replaysFailed                     atomic.Uint64
	restarts, resets, rankMismatches             atomic.Uint64
	lastSeq                                      atomic.Uint64
	lastEvent                                    atomic.Int64
	connected, degraded, replaying               atomic.Bool
}

func (c *streamCounters) snapshot() StreamStats {
	st := StreamStats{
		Engine:            *c.engine.Load(),
		Endpoint:          c.endpoint,
		ReplayEndpoint:    c.replayEndpoint,
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
		Resets:            c.resets.Load(),
		RankMismatches:    c.rankMismatches.Load(),
		LastSeq:           c.lastSeq.Load(),
		LastEventUnixNano: c.lastEvent.Load(),
		Connected:         c.connected.Load(),
		Degraded:          c.degraded.Load(),
		Replaying:         c.replaying.Load(),
	}
	if c.listener != nil {
		st.Connected = c.listener.peers.Load() > 0
	}
	return st
}

// listenerCounters are a listen socket's live counters.
type listenerCounters struct {
	endpoint                                      atomic.Pointer[string]
	peers                                         atomic.Int64
	messages, malformed, unknownTopics, decodeErr atomic.Uint64
	badRanks, conflicts                           atomic.Uint64
}

func (c *listenerCounters) snapshot() ListenerStats {
	ls := ListenerStats{
		Peers:           c.peers.Load(),
		Messages:        c.messages.Load(),
		MalformedFrames: c.malformed.Load(),
		UnknownTopics:   c.unknownTopics.Load(),
		DecodeErrors:    c.decodeErr.Load(),
		BadRanks:        c.badRanks.Load(),
		Conflicts:       c.conflicts.Load(),
	}
	if ep := c.endpoint.Load(); ep != nil {
		ls.Endpoint = *ep
	}
	return ls
}

// compareStreams orders snapshots by pod, rank, model, then endpoint.
func compareStreams(a, b StreamStats) int {
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
