// Package indexer is kvindex's index: for every model, a map from 64-bit
// KV-cache block keys to the engines (pod, DP rank) that hold the block,
// fed by the engines' KV events and queried with "how long a prefix of this
// prompt does each engine hold?".
//
// The package is pure: no sockets, no clocks, no globals, and no
// goroutines. Apply, Reset and RemoveEngine run on the caller's goroutine
// (the event subscriber's, one per engine); memory-budget eviction runs on
// whichever Apply call finds the index over budget; queries run on their
// callers' goroutines, in parallel with all of it.
//
// # Keys, holders, verification
//
// The index mirrors the engines' own hashes: a block's key is the 64-bit
// hash the engine put in its event, so removals resolve directly and a
// block whose parent was stored before kvindex started is still indexed. A
// holding is (engine, KV-cache group, medium) with a reference count,
// since vLLM may store the same hash twice and remove it twice.
//
// With Options.Hasher set, ingest checks the engines' hashing: the first
// VerifyFirst BlockStored events of each engine, then one in VerifyEvery,
// are hashed again from their parent, tokens and extra keys (the event's
// extra_keys, or for older engines the LoRA name on every block). The
// parent's full digest is NONE_HASH, the digest the event carries, or one
// remembered in a small per-engine LRU of digests from the engine's
// verified events; a sampled event whose parent is unknown is counted as
// unverifiable and the next event is tried instead. A match marks the
// engine HashVerified. A mismatch (or an event block size other than the
// Hasher's) marks it HashMismatch, with a message naming the likely cause,
// and switches it to fallback mode: from then on every event of the
// engine is keyed by kvindex's own chain over the event's tokens (chained
// from the parent's kvindex digest, found through a per-engine map from
// engine key to kvindex key), so the engine stays routable for queries
// hashed by kvindex while the operator fixes its configuration. An engine
// whose blocks are a whole multiple of kvindex's is re-keyed block by
// block; finer engine blocks cannot be and are dropped (counted). A
// restart (Reset with ResetRestart) forgets the verdict.
//
// A query counts a block for an engine when the engine holds it in any
// group and medium; Tiers then splits the matched blocks by medium.
//
// # Data structure
//
// Each model is a namespace of 256 shards chosen by the top bits of the
// (mixed) key. A shard is an open-addressing hash table of 16-byte slots,
// linear probing with backward-shift deletion (no tombstones: engines
// remove every block they store, and tombstones would force a rehash
// every few thousand removals), kept between 45% and 81% full:
//
//	key  uint64
//	val  uint64: kind (2 bits) | generation (6) | payload (48)
//	     inline: up to three engine ids (16 bits each), each holding the
//	             block in GPU, group 0, with one reference: the
//	             overwhelmingly common case costs no memory beyond the slot
//	     record: offset of a record in the shard's arena of uint64 words:
//	             a sparse bitmap (word index, 64 bits) of engines with a
//	             simple holding, then the other holdings packed as
//	             engine 24 | group 12 | medium 8 | references 20 bits
//
// Engines are interned per namespace to small dense ids (reused after
// removal), so a block's holders are a bitmap the query can AND with.
// Records live in power-of-two runs with per-size free lists; a shard
// rehash also compacts its arena.
//
// Resets: per shard and engine, a reverse list holds the 32 hash bits that
// place each key the engine stored (4 bytes an entry). They stay valid
// when keys shift or tables are rehashed, so the only upkeep is an append
// per new (engine, key) pair; removals leave stale entries, and when those
// outnumber live ones the shard rebuilds all its lists in one sequential
// scan of its table. Clearing an engine visits only its entries, in chunks
// of 128 per write section.
//
// Fair-share eviction: every slot records the generation (6 bits) of its
// block's last store; a generation is about a sixteenth of what the
// budget holds. Over budget, one Apply at a time splits what may stay
// (90% of the budget) max-min fairly among the engines holding entries,
// estimates from a sample of shards how old the entries of the engines
// above their share are, and sweeps the shards once (chunked), dropping
// those engines' oldest holdings down to their share (a block goes with
// its last holder), then compacts the emptied tables so the bytes really
// go. An engine within its share loses nothing, however old its entries.
// Stats.Bytes is the honest size of the tables, arenas, reverse lists,
// free lists and engine state (measured against the Go heap in
// BenchmarkMemory); the query memo is bounded separately by MemoEntries.
//
// # Concurrency
//
// Writers take the shard's mutex. Readers take no lock: each shard has a
// sequence counter that writers make odd for the duration of a change
// (long resets and sweeps change 128 entries per section), and a reader
// waits for an even counter (spinning, then yielding), reads the slot and
// the record with atomic loads, and retries if the counter moved; only a
// reader that loses that race 16 times in a row takes the mutex. All reads
// are bounds-checked, so a torn read is discarded, never acted on. No
// lock is held across a query; a query's answer for a block reflects one
// consistent state of that block's shard. Table rehashes build the new
// table beside the old one and publish it in one short section. Engine
// tables are immutable and replaced whole (copy-on-write) when an engine
// joins or leaves. Apply runs concurrently for different engines; the
// subscriber never calls it concurrently for the same one.
//
// # Queries
//
// LongestPrefix walks the prompt's blocks in windows of 16: it loads the
// window's slots (and record headers) first, all at once, so their cache
// misses overlap, then for each block ANDs the candidates still alive
// with the block's holders (one word for up to 64 engines). Engines that
// drop out have their matched count fixed; the walk stops when no
// candidate is left. The answer is sorted with one integer key per engine
// (matched blocks, then the engine's precomputed (pod, rank) rank).
//
// Tokens are hashed to keys with the Hasher, lazily in growing chunks so a
// walk that stops early does not hash the rest, and through a memo of
// recent prompts' key chains (see memo.go): a repeated prompt costs one
// XXH3-128 pass over its tokens and one lookup; the next turn of a
// conversation hashes only its new blocks.
//
// # Snapshots
//
// Snapshot writes a versioned stream ("KVIXSNAP", version, then payload
// frames of at most 1 MiB, each with an XXH3-64 checksum chained from the
// previous frame's); Restore verifies every frame before parsing it,
// builds a separate index and swaps it in only when the whole stream
// checked out, so a corrupt, truncated or hostile stream leaves the index
// unchanged and costs memory proportional to its own size (capped at
// twice the memory budget). Digest is an order-independent SHA-256 over
// lane-wise sums of per-holding XXH3 hashes of (model, pod, rank, key,
// group, medium name, references): equal on replicas with equal content.
//
// # Performance
//
// BenchmarkApply (ingest, with and without verification), BenchmarkLongestPrefix
// (cold: hashing included; warm: memoized chain; hashes: the walk alone) and
// BenchmarkMemory (bytes per holder-block and per distinct block) measure
// this package; README.md's Performance section holds their figures.
//
// Where the bytes go: an open-addressing slot of 16 bytes per distinct
// block, rebuilt to under half full when it passes 13/16 (keys spread evenly, so
// the shards grow together and the cost per block steps up just after a
// growth), plus a per-engine reverse list of 4 bytes per holder-block that
// makes an engine's reset proportional to what it holds; records and
// engines are noise at fleet scale.
package indexer
