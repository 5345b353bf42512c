package kvevents

import "github.com/zeebo/xxh3"

// Health says how far kvindex can vouch for what it holds of one stream
// (one engine's data-parallel rank). Only HealthOK promises that the
// stream's entries are exactly the engine's cache: every other state is
// reported beside each answer, so a router can weigh it.
//
// The states a Sequencer reports, and how a stream leaves them:
//
//   - HealthOK: every batch of the engine process was applied in order,
//     from an empty start (sequence 0, or a bootstrap replay reaching back
//     to it), from an engine that announced AllBlocksCleared, or from a
//     position the engine confirmed.
//   - HealthRestored: the entries come from a snapshot taken by an earlier
//     kvindex process (a resumed Position) and the engine has not yet
//     confirmed them. Leaves to HealthOK once a replay from the position
//     shows the same engine process (the batch under the position's seq
//     carries its print) and fills every batch since; to a reset (then as
//     for a fresh stream) when the engine turns out to be a new process.
//     A replay that does not answer leaves the stream restored until a
//     later one does; without a replay endpoint it stays restored until
//     AllBlocksCleared or a restart seen from sequence 0.
//   - HealthUnconfirmed: the start of the engine's history is unknown: the
//     stream joined mid-stream (the engine's replay buffer no longer
//     reached back to its first batch, or there is no replay endpoint),
//     its sequence went backwards where no restart can be (on the same
//     connection), or a reconnect could not be checked (the replay did not
//     answer, or there is no replay endpoint: engines without replay are
//     exact only until their first reconnect). Leaves to HealthOK on
//     AllBlocksCleared or an engine restart seen from its first batch on a
//     new connection; an unchecked reconnect also on a later replay that
//     verifies the process and fills every batch since.
//   - HealthDegraded: batches were lost mid-stream (a gap no replay could
//     fill, an undecodable batch). A lost batch is never applied later
//     (nothing is applied out of order), so no replay repairs it: leaves
//     to HealthOK only on AllBlocksCleared or an engine restart seen from
//     its first batch.
//
// A stream that turns out to come from a new engine process (a sequence
// going back to a batch it does not know, or a verifying replay showing
// another batch under the last applied seq, a buffer past it, or nothing)
// is reset and starts over as a fresh stream.
//
// A transport adds what it alone knows (a connection that is down) as
// StreamStats.Connected.
type Health uint8

// Health states, from best to worst: when several apply, the worst is
// reported.
const (
	HealthOK Health = iota
	HealthRestored
	HealthUnconfirmed
	HealthDegraded
)

func (h Health) String() string {
	switch h {
	case HealthOK:
		return "ok"
	case HealthRestored:
		return "restored"
	case HealthUnconfirmed:
		return "unconfirmed"
	case HealthDegraded:
		return "degraded"
	}
	return "health?"
}

// Position is where one stream stands after its last applied batch:
// enough to resume it in a later kvindex process and to recognise the
// engine process it came from. A Subscriber's Checkpoint reports them;
// SubscriberConfig.Resume takes them back.
type Position struct {
	Engine EngineID
	// Seq is the sequence number of the last applied batch.
	Seq uint64
	// Print is BatchPrint of that batch's payload: a batch replayed under
	// Seq with another print comes from another engine process.
	Print uint64
	// Health is the stream's health when the position was taken.
	Health Health
}

// BatchPrint is the fingerprint of a batch payload: stable across
// processes and machines (XXH3-64), so a position saved by one kvindex
// process is checked by the next. Batches of two engine processes differ
// in their timestamp, so equal sequence numbers with different prints
// mean different processes.
func BatchPrint(payload []byte) uint64 { return xxh3.Hash(payload) }
