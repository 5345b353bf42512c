package kvevents

import (
	"fmt"
	"strconv"

	"github.com/kvindex/kvindex/blockhash"
)

// EngineID names one event stream: a pod serving a model, and the
// data-parallel rank inside it (each DP rank runs its own scheduler, block
// pool and publisher, so it is a separate cache).
type EngineID struct {
	Model  string
	Pod    string
	DPRank int
}

// MaxDPRank bounds data-parallel ranks: an EngineID's DPRank is in
// [0, MaxDPRank), and a batch claiming a rank outside it is treated as
// malformed.
const MaxDPRank = 1024

// String formats the engine the one way kvindex prints engines: "pod" for
// data-parallel rank 0 (the only rank of an engine without data
// parallelism), "pod/N" for rank N.
func (e EngineID) String() string {
	if e.DPRank == 0 {
		return e.Pod
	}
	return e.Pod + "/" + strconv.Itoa(e.DPRank)
}

// Kind is the type of a KV-cache event.
type Kind uint8

// Event kinds, named as vLLM's msgspec tags name them.
const (
	BlockStored Kind = iota + 1
	BlockRemoved
	AllBlocksCleared
)

func (k Kind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// MediumGPU is the medium of blocks in the engine's GPU block pool; an
// absent or nil medium means GPU as well.
const MediumGPU = "GPU"

// Event is one decoded KV-cache event. Fields not carried by an event's
// kind, or absent on the wire (older engines), keep their zero values.
type Event struct {
	Kind Kind

	// Hashes are the 64-bit block keys (BlockStored, BlockRemoved), in
	// chain order. Engines sending 32-byte hashes
	// (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) are mapped to the key the int
	// form would carry (last 8 bytes, big-endian), and the full digests are
	// kept in Digests.
	Hashes  []uint64
	Digests [][]byte // nil unless the engine sent bytes; else one per hash

	Medium   string // storage tier; "" means GPU
	GroupIdx int    // KV-cache group (hybrid models); 0 for single-group

	// BlockStored only.
	HasParent    bool   // false: the first hash is block 0 of its sequence
	Parent       uint64 // key of the block before Hashes[0]
	ParentDigest []byte // full parent digest when sent as bytes
	TokenIDs     []uint64
	BlockSize    int
	HasLoRAID    bool
	LoRAID       int64 // deprecated int adapter id; not part of the hash
	LoRAName     string
	// ExtraKeys holds one entry per hash (nil entry: None). The slice is
	// nil when the event carries no extra_keys (engines before early 2026
	// lack the field); the keys are then unknown rather than None.
	ExtraKeys     []blockhash.BlockExtra
	SpecKind      string // kv_cache_spec_kind, e.g. "full_attention"
	SlidingWindow int    // kv_cache_spec_sliding_window, 0 if none
}

// Batch is one decoded EventBatch: one message of the live stream.
type Batch struct {
	TS        float64 // engine wall clock, seconds
	HasDPRank bool
	DPRank    int
	Events    []Event
	// Skipped counts events with an unknown tag, which were dropped while
	// the rest of the batch was kept.
	Skipped int
}

// ResetReason says why an engine's cached blocks must be forgotten.
type ResetReason string

// Reset reasons.
const (
	ResetRestart ResetReason = "restart" // sequence went backwards: a new engine process
	ResetCleared ResetReason = "cleared" // AllBlocksCleared
	ResetRemoved ResetReason = "removed" // the engine left the configuration
)

// Sink consumes the ordered event stream of every engine. Calls for one
// EngineID never overlap and arrive in sequence order, each batch exactly
// once (replayed batches included); calls for different engines may run
// concurrently, and one goroutine may serve several engines, so a slow Sink
// delays the others on its goroutine. Events passed to Apply are valid only
// during the call (the subscriber reuses their storage).
//
// AllBlocksCleared arrives in order inside Apply's events (it may sit
// between stores of the same batch); Reset reports state loss detected
// outside the events (a restart, a removal). A Sink may call only the
// Subscriber's read-only methods (Streams, ListenerStats).
type Sink interface {
	Apply(engine EngineID, seq uint64, events []Event)
	Reset(engine EngineID, reason ResetReason)
}

// HealthSink is a Sink that also wants each engine's stream health
// (Health) as the transport sees it: an index that must shed entries to
// stay within a memory budget sheds those it cannot vouch for first. A
// transport whose Sink implements it calls Health when an engine's health
// changes, under the same rules as Apply and Reset for that engine.
type HealthSink interface {
	Sink
	Health(engine EngineID, h Health)
}

// VerdictSink is a Sink that says whether it accepted each batch. A
// transport that gives resources only to engines that prove themselves
// (zmqtransport's listen socket: a stream must deliver a batch its Sink
// accepted within seconds of its first message, or it is dropped) calls
// ApplyVerdict instead of Apply, under the same rules.
type VerdictSink interface {
	Sink
	// ApplyVerdict applies the batch as Apply does and reports whether it
	// was accepted: it had events and the Sink refused none of them.
	ApplyVerdict(engine EngineID, seq uint64, events []Event) bool
}

// ApplyVerdict hands a batch to sink, through ApplyVerdict if it is a
// VerdictSink; any other Sink is taken to accept every batch that has
// events.
func ApplyVerdict(sink Sink, engine EngineID, seq uint64, events []Event) bool {
	if vs, ok := sink.(VerdictSink); ok {
		return vs.ApplyVerdict(engine, seq, events)
	}
	sink.Apply(engine, seq, events)
	return len(events) > 0
}

// PayloadSink is a Sink that also wants each batch's payload exactly as
// the engine sent it: a relay that forwards batches unchanged to another
// transport. A transport whose Sink implements it calls ApplyPayload
// instead of Apply, under the same ordering rules; payload, like events,
// is valid only during the call.
type PayloadSink interface {
	Sink
	ApplyPayload(engine EngineID, seq uint64, payload []byte, events []Event)
}
