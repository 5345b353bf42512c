package kvevents

import "time"

// StreamStats is a snapshot of one stream's counters: one engine's
// data-parallel rank, as a transport (package zmqtransport) reports it.
// Counters only grow (a restart does not zero them), so they export
// directly as Prometheus counters; Connected, Health, Replaying, LastSeq,
// LastEventUnixNano, LastBatchStampUnixNano and LastBatchLag are gauges.
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
	Duplicates    uint64 // batches dropped as already applied, or as late (their hole was given up)
	ReplaysOK     uint64 // replays that closed their hole (bootstrap included)
	ReplaysFailed uint64 // replays that did not (unavailable, timeout, truncated, ...)
	Restarts      uint64 // publisher restarts, however detected (sequence went back, or a verifying replay)
	// Verified counts replays whose reply under the last applied seq
	// proved the engine the same process (on a gap, a reconnect or a
	// resume).
	Verified uint64
	// ReplayRestarts counts the restarts (also in Restarts) that a
	// verifying replay detected: another batch under the last applied
	// seq, a buffer past it, or nothing at all.
	ReplayRestarts uint64
	// Resets counts every loss of the engine's state: restarts plus
	// AllBlocksCleared events applied.
	Resets uint64
	// RankMismatches counts batches whose dp_rank disagreed with the rank
	// the endpoint's port implies (connect mode).
	RankMismatches uint64

	LastSeq           uint64 // last applied sequence number
	LastEventUnixNano int64  // when the last batch was applied (0: never)
	Connected         bool   // the SUB socket has a live connection (bind mode: the listener has peers)
	Health            Health // what kvindex can vouch for (see Health)
	Replaying         bool   // a replay is outstanding

	// LastBatchStampUnixNano is the engine's wall clock stamped on the
	// last applied batch that carried one (Batch.TS); 0 if none did.
	LastBatchStampUnixNano int64
	// LastBatchLag is kvindex's wall clock when it applied that batch
	// minus its stamp: how far behind the engine the index is (queueing,
	// a slow consumer, a stream behind), plus any skew between the two
	// clocks. Negative means the engine's clock is ahead of kvindex's.
	// Meaningful only when LastBatchStampUnixNano is not 0.
	LastBatchLag time.Duration
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
	// RefusedEngines counts engine ranks (topic and dp_rank) refused a
	// stream because the listener had its maximum of streams; each is
	// counted once while refused, and its messages are dropped.
	RefusedEngines uint64
	// RefusedSources counts messages dropped because their source
	// address is not allowed to speak for the pod their topic names
	// (engine allow rules).
	RefusedSources uint64
	// RefusedHandshakes counts connections refused at the ZMQ handshake
	// because no engine allow rule names their source address.
	RefusedHandshakes uint64
	// RefusedConnections counts connections refused at the handshake
	// because the listener had as many connections as its event queues
	// are sized for (SubscriberConfig.MaxEngines, beyond the named
	// sources' own).
	RefusedConnections uint64
	// ForgottenEngines counts engine ranks forgotten after their
	// connection had been gone for the subscriber's ForgetAfter.
	ForgottenEngines uint64
	// UnprovenEngines counts engine ranks dropped because no batch they
	// sent in their first seconds was accepted (see zmqtransport's
	// slots); DisplacedEngines, those whose slot went to a newcomer at
	// the cap after they had been silent longest. Both lose their
	// entries, as forgotten ones do.
	UnprovenEngines, DisplacedEngines uint64
}
