package indexer

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/kvevents"
)

// Options configures an Index.
type Options struct {
	// Hasher is the fleet's hashing configuration (algorithm, seed, block
	// size); queries by tokens and ingest verification use it.
	Hasher *blockhash.Hasher
	// MemoryBudget caps the index size in bytes; beyond it entries are
	// evicted, the least recently stored of the engines holding more
	// than a fair share first (see evict.go). 0 means unlimited.
	MemoryBudget int64
	// VerifyFirst is the number of BlockStored events verified in full per
	// engine before verification switches to sampling; VerifyEvery then
	// verifies one event in VerifyEvery. Zero values pick defaults.
	VerifyFirst int
	VerifyEvery int
	// MemoEntries sizes the memo of query hash chains (0: default).
	MemoEntries int
	// DigestEntries sizes each engine's LRU of full digests of verified
	// blocks, which lets events that name their parent by 64-bit key be
	// verified (0: DefaultDigestEntries).
	DigestEntries int
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

// TierCount is how many of an engine's blocks (a PodMatch's matched
// ones, an EngineInfo's holder-blocks) sit in one medium.
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
	// Evicted: budget eviction dropped some of the engine's entries
	// (EngineInfo.Evicted), so MatchedBlocks is a lower bound.
	Evicted bool
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

	Unverifiable uint64 // sampled events whose parent digest was unknown
	Dropped      uint64 // blocks that could not be keyed (fallback with unknown parent)
	Malformed    uint64 // events ignored as invalid (lengths, sizes, fields)
	RemoveMisses uint64 // removals of blocks the index did not hold
	LastSeq      uint64 // sequence number of the last applied batch
	Message      string // why the engine is flagged, if it is
	// Evicted counts the engine's entries (holder-blocks) that budget
	// eviction (Options.MemoryBudget) dropped since its entries were last
	// exact: while it is not 0 the index holds less than the engine does,
	// so the engine's matches are lower bounds (the API's PARTIAL
	// health). AllBlocksCleared or a reset makes the entries exact again
	// and zeroes it.
	Evicted uint64
	// Tiers splits HolderBlocks by medium, in the order the model's
	// engines first used the media (the GPU first); media the engine
	// holds nothing in are left out, so at rest the counts add up to
	// HolderBlocks.
	Tiers []TierCount
}

// Stats sizes the index.
type Stats struct {
	Bytes        int64
	HolderBlocks int64
	Blocks       int64 // distinct block keys
	Engines      int
	Evictions    uint64
	Models       int
	// Budget is Options.MemoryBudget, the bound eviction keeps Bytes
	// within (0: none), so that the two can be watched side by side.
	Budget int64
}

// Index is the fleet-wide map from block key to holders. It is safe for
// concurrent use: Apply may run concurrently for different engines (never
// for the same one), queries run in parallel with everything. It starts no
// goroutines.
type Index struct {
	opts          Options
	hasher        *blockhash.Hasher
	verifyFirst   int
	verifyEvery   int
	digestEntries int

	nsMu   sync.Mutex
	models atomic.Pointer[map[string]*namespace]

	stored    atomic.Uint64 // blocks stored so far: the generation clock
	genSpan   uint64        // blocks per generation
	evictMu   sync.Mutex
	evictions atomic.Uint64

	memo    *memo
	scratch sync.Pool // *queryScratch
}

// Errors returned by queries.
var (
	ErrNoHasher = errors.New("indexer: a query by tokens needs Options.Hasher; pass BlockHashes instead")
)

// New returns an empty Index.
func New(opts Options) (*Index, error) {
	switch {
	case opts.MemoryBudget < 0:
		return nil, fmt.Errorf("indexer: negative MemoryBudget %d", opts.MemoryBudget)
	case opts.VerifyFirst < 0, opts.VerifyEvery < 0:
		return nil, fmt.Errorf("indexer: negative VerifyFirst/VerifyEvery (%d, %d)", opts.VerifyFirst, opts.VerifyEvery)
	case opts.MemoEntries < 0, opts.DigestEntries < 0:
		return nil, fmt.Errorf("indexer: negative MemoEntries/DigestEntries (%d, %d)", opts.MemoEntries, opts.DigestEntries)
	}
	ix := &Index{
		opts:          opts,
		hasher:        opts.Hasher,
		verifyFirst:   cmp.Or(opts.VerifyFirst, DefaultVerifyFirst),
		verifyEvery:   cmp.Or(opts.VerifyEvery, DefaultVerifyEvery),
		digestEntries: cmp.Or(opts.DigestEntries, DefaultDigestEntries),
		genSpan:       1 << 20,
	}
	if opts.MemoryBudget > 0 {
		// About a sixteenth of what the budget holds per generation
		// (at ~24 bytes per holder-block), so eviction can pick the
		// oldest few percent.
		ix.genSpan = uint64(max(1024, opts.MemoryBudget/(24*16)))
	}
	m := map[string]*namespace{}
	ix.models.Store(&m)
	ix.memo = newMemo(cmp.Or(opts.MemoEntries, DefaultMemoEntries))
	ix.scratch.New = func() any { return new(queryScratch) }
	return ix, nil
}

// namespace returns the model's namespace, creating it if asked.
func (ix *Index) namespace(model string, create bool) *namespace {
	if ns := (*ix.models.Load())[model]; ns != nil || !create {
		return ns
	}
	ix.nsMu.Lock()
	defer ix.nsMu.Unlock()
	old := *ix.models.Load()
	if ns := old[model]; ns != nil {
		return ns
	}
	m := make(map[string]*namespace, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	ns := newNamespace(model)
	m[model] = ns
	ix.models.Store(&m)
	return ns
}

// lockEngine returns the engine, registered if new, with its mutex held;
// nil if its namespace has no room for another engine.
func (ix *Index) lockEngine(ns *namespace, id kvevents.EngineID) *engine {
	for {
		e := ns.engine(id.Pod, id.DPRank)
		if e == nil {
			e = ns.addEngine(id, func(i uint32) *engine { return newEngine(i, id, ix.digestEntries) })
			if e == nil {
				return nil
			}
		}
		e.mu.Lock()
		if !e.removed {
			return e
		}
		e.mu.Unlock() // removed meanwhile: register afresh
	}
}

// Apply applies one engine's batch of events, in order.
func (ix *Index) Apply(id kvevents.EngineID, seq uint64, events []kvevents.Event) {
	ix.ApplyVerdict(id, seq, events)
}

// ApplyVerdict implements kvevents.VerdictSink: it applies the batch as
// Apply does and reports whether the index accepted it: the batch had
// events, the engine had room in its namespace, and no event was refused
// (malformed, or a block dropped for want of a key it could be indexed
// under; EngineInfo.Malformed and Dropped). A removal of a block the
// index does not hold is not a refusal: an engine evicts blocks stored
// before kvindex heard it.
func (ix *Index) ApplyVerdict(id kvevents.EngineID, seq uint64, events []kvevents.Event) bool {
	ns := ix.namespace(id.Model, true)
	e := ix.lockEngine(ns, id)
	if e == nil {
		return false
	}
	// Written only under e.mu, which is held: the differences are this
	// batch's.
	malformed, dropped := e.malformed.Load(), e.dropped.Load()
	e.lastSeq.Store(seq)
	gen := ix.stored.Load() / ix.genSpan & genMask
	var b batch
	var stored uint64
	for i := range events {
		ev := &events[i]
		switch ev.Kind {
		case kvevents.BlockStored:
			ix.applyStored(ns, e, ev, gen, &b)
			stored += uint64(len(ev.Hashes))
		case kvevents.BlockRemoved:
			ix.applyRemoved(ns, e, ev, &b)
		case kvevents.AllBlocksCleared:
			ix.clearEngine(ns, e, &b)
		default:
			e.malformed.Add(1)
		}
	}
	b.commit(ns, e)
	ix.stored.Add(stored)
	accepted := len(events) > 0 && e.malformed.Load() == malformed && e.dropped.Load() == dropped
	e.mu.Unlock()
	ix.maybeEvict()
	return accepted
}

// clearEngine removes every entry of e (mu held): what the index holds of
// it is exact again (nothing), whatever eviction took before.
func (ix *Index) clearEngine(ns *namespace, e *engine, b *batch) {
	ns.clearEngine(e.id, b)
	b.bytes += e.forgetKeys()
	e.evicted.Store(0)
}

// Reset forgets every block the engine holds. ResetRestart also forgets
// what verification concluded (the new process may run another
// configuration); ResetRemoved forgets the engine entirely, as
// RemoveEngine does.
func (ix *Index) Reset(id kvevents.EngineID, reason kvevents.ResetReason) {
	ix.clear(id, reason)
}

// RemoveEngine forgets the engine entirely.
func (ix *Index) RemoveEngine(id kvevents.EngineID) {
	ix.clear(id, kvevents.ResetRemoved)
}

// clear drops every entry of the engine. A restart also forgets what
// verification learnt (the new process may be configured differently); a
// removal also forgets the engine itself.
func (ix *Index) clear(id kvevents.EngineID, reason kvevents.ResetReason) {
	ns := ix.namespace(id.Model, false)
	if ns == nil {
		return
	}
	e := ns.engine(id.Pod, id.DPRank)
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.removed {
		return
	}
	var b batch
	ix.clearEngine(ns, e, &b)
	b.commit(ns, e)
	switch reason {
	case kvevents.ResetRestart:
		e.forgetVerification()
		ns.bytes.Add(e.dropSamples())
	case kvevents.ResetRemoved:
		ns.bytes.Add(e.dropSamples())
		e.removed = true
		ns.dropEngine(e)
	}
}

// Health implements kvevents.HealthSink: the transport's view of the
// engine's stream. Over budget, the entries of engines that are not
// HealthOK are shed before any healthy engine's (see maybeEvict).
func (ix *Index) Health(id kvevents.EngineID, h kvevents.Health) {
	ns := ix.namespace(id.Model, true)
	e := ix.lockEngine(ns, id)
	if e == nil {
		return
	}
	e.health.Store(uint32(h))
	e.mu.Unlock()
}

// Models lists, sorted, the models the index knows: those an engine has
// sent events for (or a snapshot restored), even if no block is left.
func (ix *Index) Models() []string {
	m := *ix.models.Load()
	out := make([]string, 0, len(m))
	for model := range m {
		out = append(out, model)
	}
	slices.Sort(out)
	return out
}

// Engines lists the engines the index knows, by model, pod and rank.
func (ix *Index) Engines() []EngineInfo {
	var out []EngineInfo
	for _, ns := range *ix.models.Load() {
		for _, e := range ns.engines.Load().byID {
			if e == nil {
				continue
			}
			info := EngineInfo{
				Engine:       e.eid,
				HolderBlocks: e.holderBlocks.Load(),
				HashCheck:    HashCheck(e.check.Load()),
				Verified:     e.verified.Load(),
				Mismatches:   e.mismatches.Load(),
				Fallback:     e.fallback.Load(),
				Unverifiable: e.unverifiable.Load(),
				Dropped:      e.dropped.Load(),
				Malformed:    e.malformed.Load(),
				RemoveMisses: e.removeMisses.Load(),
				LastSeq:      e.lastSeq.Load(),
				Evicted:      e.evicted.Load(),
			}
			if m := e.message.Load(); m != nil {
				info.Message = *m
			}
			for m, c := range e.tiers.load() {
				if n := c.Load(); n != 0 {
					info.Tiers = append(info.Tiers, TierCount{Medium: ns.media.name(m), Blocks: int(n)})
				}
			}
			out = append(out, info)
		}
	}
	slices.SortFunc(out, func(a, b EngineInfo) int { return compareEngineID(a.Engine, b.Engine) })
	return out
}

func compareEngineID(a, b kvevents.EngineID) int {
	return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.Pod, b.Pod), cmp.Compare(a.DPRank, b.DPRank))
}

// Stats returns the index's size. Bytes counts the index's own structures
// (tables, record arenas, reverse lists, engine state); the query memo is
// bounded separately by Options.MemoEntries.
func (ix *Index) Stats() Stats {
	st := Stats{Evictions: ix.evictions.Load(), Budget: ix.opts.MemoryBudget}
	for _, ns := range *ix.models.Load() {
		h, b := ns.counts()
		st.HolderBlocks += h
		st.Blocks += b
		st.Bytes += ns.bytes.Load()
		st.Engines += ns.engines.Load().n
		st.Models++
	}
	return st
}

// bytes returns the accounted size without locking any shard.
func (ix *Index) bytes() int64 {
	var b int64
	for _, ns := range *ix.models.Load() {
		b += ns.bytes.Load()
	}
	return b
}

var _ kvevents.VerdictSink = (*Index)(nil)
