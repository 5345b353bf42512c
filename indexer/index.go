package indexer

import (
	"errors"
	"io"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/kvevents"
)

// Options configures an Index.
type Options struct {
	// Hasher is the fleet's hashing configuration (algorithm, seed, block
	// size); queries by tokens and ingest verification use it.
	Hasher *blockhash.Hasher
	// MemoryBudget caps the index size in bytes; beyond it the
	// least-recently-stored entries are evicted. 0 means unlimited.
	MemoryBudget int64
	// VerifyFirst is the number of BlockStored events verified in full per
	// engine before verification switches to sampling; VerifyEvery then
	// verifies one event in VerifyEvery. Zero values pick defaults.
	VerifyFirst int
	VerifyEvery int
	// MemoEntries sizes the memo of query hash chains (0: default).
	MemoEntries int
}

// HashCheck is what verification concluded about an engine's hashes.
type HashCheck uint8

// Verification states.
const (
	HashUnknown  HashCheck = iota // nothing verifiable seen yet
	HashVerified                  // recomputed hashes match the engine's
	HashMismatch                  // they do not: wrong algo, seed or block size
)

func (c HashCheck) String() string {
	switch c {
	case HashVerified:
		return "verified"
	case HashMismatch:
		return "mismatch"
	}
	return "unknown"
}

// Query asks which engines hold a prompt's leading blocks.
type Query struct {
	Model string
	// Tokens are the prompt's token ids; ignored when BlockHashes is set.
	Tokens []uint64
	// BlockHashes are precomputed 64-bit block keys, block 0 first.
	BlockHashes []uint64
	// Extras are the hash-affecting request inputs (LoRA, salt, multimodal).
	Extras *blockhash.Extras
	// Candidates restricts the answer to these pods (every DP rank of
	// each); empty means every engine of the model.
	Candidates []string
}

// TierCount is how many of an engine's matched blocks sit in one medium.
type TierCount struct {
	Medium string
	Blocks int
}

// PodMatch is one engine's cached prefix of a query.
type PodMatch struct {
	Engine        kvevents.EngineID
	MatchedBlocks int // contiguous from block 0
	MatchedTokens int
	Tiers         []TierCount
	HashCheck     HashCheck
}

// Result answers a Query.
type Result struct {
	BlocksTotal int
	BlockSize   int
	// Pods holds every candidate engine of the model (including those
	// with no match), sorted by MatchedBlocks descending, then by pod and
	// rank.
	Pods []PodMatch
}

// Holder is one engine's copy of a block.
type Holder struct {
	Engine   kvevents.EngineID
	Medium   string
	GroupIdx int
	Refs     int
}

// BlockHolders is one block of a Lookup.
type BlockHolders struct {
	Index   int
	Key     uint64
	Holders []Holder
}

// EngineInfo describes one engine known to the index.
type EngineInfo struct {
	Engine       kvevents.EngineID
	HolderBlocks int64
	HashCheck    HashCheck
	Verified     uint64 // blocks whose recomputed hash matched
	Mismatches   uint64 // blocks whose recomputed hash differed
	Fallback     bool   // keyed by kvindex's own chain after a mismatch
}

// Stats sizes the index.
type Stats struct {
	Bytes        int64
	HolderBlocks int64
	Blocks       int64 // distinct block keys
	Engines      int
	Evictions    uint64
}

// Index is the fleet-wide map from block key to holders.
type Index struct {
	opts Options
}

var errNotImplemented = errors.New("indexer: not implemented")

// New returns an empty Index.
func New(opts Options) (*Index, error) { return &Index{opts: opts}, nil }

// Apply applies one engine's batch of events, in order.
func (ix *Index) Apply(engine kvevents.EngineID, seq uint64, events []kvevents.Event) {}

// Reset forgets every block the engine holds.
func (ix *Index) Reset(engine kvevents.EngineID, reason kvevents.ResetReason) {}

// RemoveEngine forgets the engine entirely.
func (ix *Index) RemoveEngine(engine kvevents.EngineID) {}

// LongestPrefix answers q into res, reusing res's storage.
func (ix *Index) LongestPrefix(q *Query, res *Result) error { return errNotImplemented }

// Lookup returns, per block of q, its key and holders.
func (ix *Index) Lookup(q *Query) ([]BlockHolders, error) { return nil, errNotImplemented }

// Engines lists the engines the index knows.
func (ix *Index) Engines() []EngineInfo { return nil }

// Stats returns the index's size.
func (ix *Index) Stats() Stats { return Stats{} }

// Snapshot writes the index to w in a versioned binary format.
func (ix *Index) Snapshot(w io.Writer) error { return errNotImplemented }

// Restore replaces the index's content with a snapshot read from r.
func (ix *Index) Restore(r io.Reader) error { return errNotImplemented }

// Digest returns an order-independent digest of the index content.
func (ix *Index) Digest() [32]byte { return [32]byte{} }

var _ kvevents.Sink = (*Index)(nil)
