// Package enginesim simulates the KV-cache side of one vLLM engine (one
// data-parallel rank): a block pool with prefix caching that emits the KV
// event batches vLLM would, byte for byte, in sequence, with a replay
// buffer.
//
// It exists so that kvindex's ingestion, index and routing can be tested,
// benchmarked and demonstrated end to end without GPUs. The model has no
// sockets and no cgo: each batch goes to the Config's Publisher, and
// Engine.Buffered is what a replay request is answered with.
// Package simzmq puts an engine on real ZMQ sockets (a PUB and
// a replay ROUTER); a test then connects a subscriber to its endpoints,
// drives requests through Engine.Process, and compares what the index
// believes with Engine.Lookup, the engine's true cache state.
//
// What is mirrored from vLLM (v1 BlockPool, KVCacheManager, ZmqEventPublisher):
//
//   - Hashing: the blockhash.Hasher of the Config, full blocks only.
//   - Prefix hits: the longest run of leading blocks whose hashes are cached.
//   - Allocation: never-used blocks first, then eviction of the least
//     recently used unreferenced cached block, one BlockRemoved (one hash)
//     per evicted block.
//   - Storing: one BlockStored per request for its newly cached full blocks
//     (parent = the block before the first new one, token_ids of the new
//     blocks, extra_keys per block, lora_name, medium, block_size, group 0,
//     kind full_attention). Blocks are not de-duplicated: a hash cached
//     out of prefix order is stored again, as vLLM does, so the same hash
//     can be held (and later removed) twice.
//   - Release: a request's blocks are freed as soon as it is processed, in
//     reverse order (its tail is evicted first), and stay cached.
//   - Publishing: one EventBatch per Process call (none for a full hit),
//     handed to the Publisher with its seq, from 0 per process (or
//     Config.FirstSeq, wrapping past 2^64-1 to 0); a replay
//     buffer of the last BufferSteps batches (DropNext keeps batches out of
//     the live stream but not out of the buffer, as a lossy PUB socket
//     would).
//   - Restart: a new process empties the cache, the replay buffer and the
//     sequence without announcing anything (no AllBlocksCleared).
//
// Simplifications, all deliberate: a request is prefilled and finished in
// one step (no decode, no partial blocks, no preemption); a request that
// needs more blocks than are free or evictable caches only the leading
// blocks that fit; there is one KV-cache group; lora_id is not sent (vLLM
// deprecated it in favour of lora_name); the Publisher outlives Restart
// (subscribers see the sequence go back to 0 rather than a reconnect).
//
// Engines are safe for concurrent use. Process is cheap enough to run
// thousands of requests per second per engine: the pool is preallocated,
// the LRU list is intrusive, and the only per-request allocation is the
// published payload (kept by the replay buffer).
package enginesim
