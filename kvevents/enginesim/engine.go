package enginesim

import (
	"bytes"
	"errors"
	"fmt"
	"iter"
	"sync"
	"time"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/kvevents"
)

// Config describes one simulated engine.
type Config struct {
	Pod    string // informational: who this engine is
	Model  string
	DPRank int // stamped into every batch, as vLLM's publisher does

	// Hasher computes block hashes; its block size is the engine's.
	Hasher *blockhash.Hasher
	// CapacityBlocks is the number of KV blocks in the pool (>= 1).
	CapacityBlocks int

	Shape       kvevents.Shape // wire layout (default ShapeMap, vLLM >= 0.24)
	BytesHashes bool           // send digests, as VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 does
	Medium      string         // medium of stored and removed blocks (default "GPU")

	// Publisher sends each batch as it is made (package zmqtransport's
	// Publisher does so over ZMQ, as vLLM does); nil keeps the batches in
	// the replay buffer only.
	Publisher Publisher
	// BufferSteps is the number of batches kept for replay (default
	// DefaultBufferSteps).
	BufferSteps int
	// FirstSeq is the sequence number of a process's first batch: 0, as
	// vLLM numbers them, unless a peer is simulated whose numbers reach
	// 2^64-1 and wrap to 0 (which vLLM cannot do, but a peer can).
	FirstSeq uint64

	// Now returns the batch timestamp (default: the wall clock).
	Now func() time.Time
}

// DefaultBufferSteps is the default length of the replay buffer, vLLM's
// buffer_steps.
const DefaultBufferSteps = 10_000

// Publisher sends an engine's batches: each one once, in sequence order,
// as [topic, seq, payload] on the wire. The engine calls Publish with its
// lock held, so calls never overlap and a slow Publisher slows the
// engine; payload is kept by the replay buffer and must not be modified.
type Publisher interface {
	Publish(seq uint64, payload []byte) error
}

// ErrClosed is returned by an Engine's methods after Close.
var ErrClosed = errors.New("enginesim: engine closed")

// Engine is one simulated vLLM engine (one DP rank). Its methods are safe
// for concurrent use.
type Engine struct {
	cfg  Config
	bs   int
	opts kvevents.EncodeOptions

	mu       sync.Mutex
	closed   bool
	pool     []block
	free     []*block          // never used or dropped: allocated before any eviction
	cached   map[uint64]*block // key -> first physical block holding it
	lru      block             // sentinel of the list of evictable cached blocks, LRU first
	nCached  int
	seq      uint64
	ring     []entry // replay buffer, oldest at ringHead once full
	ringHead int
	dropNext int
	hits     uint64
	queries  uint64

	// Per-Process scratch, reused so that Process does not allocate per
	// block.
	hashes  []blockhash.Hash
	pinned  []*block
	keys    []uint64
	digests [][]byte
	extras  []blockhash.BlockExtra
	removed []uint64 // keys of evicted blocks
	remDig  []byte   // their digests, back to back
	batch   kvevents.Batch
	enc     []byte
}

// block is one physical KV block of the pool.
type block struct {
	hash       blockhash.Hash
	prev, next *block // neighbours in the LRU list while evictable
	dup        *block // next physical block cached under the same key
	cached     bool
}

type entry struct {
	seq     uint64
	payload []byte
}

// New builds an engine with an empty cache and replay buffer.
func New(cfg Config) (*Engine, error) {
	if cfg.Hasher == nil {
		return nil, errors.New("enginesim: Config.Hasher is required")
	}
	if cfg.CapacityBlocks < 1 {
		return nil, fmt.Errorf("enginesim: CapacityBlocks %d, want >= 1", cfg.CapacityBlocks)
	}
	if cfg.Shape == 0 {
		cfg.Shape = kvevents.ShapeMap
	}
	if cfg.Medium == "" {
		cfg.Medium = kvevents.MediumGPU
	}
	if cfg.BufferSteps <= 0 {
		cfg.BufferSteps = DefaultBufferSteps
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	e := &Engine{
		cfg:    cfg,
		bs:     cfg.Hasher.BlockSize(),
		opts:   kvevents.EncodeOptions{Shape: cfg.Shape, BytesHashes: cfg.BytesHashes},
		pool:   make([]block, cfg.CapacityBlocks),
		cached: make(map[uint64]*block, cfg.CapacityBlocks),
		ring:   make([]entry, 0, min(cfg.BufferSteps, 1024)),
		seq:    cfg.FirstSeq,
	}
	e.lru.prev, e.lru.next = &e.lru, &e.lru
	e.resetPool()
	return e, nil
}

// Config returns the engine's configuration, defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

// EngineID returns the identity a subscriber should give this engine.
func (e *Engine) EngineID() kvevents.EngineID {
	return kvevents.EngineID{Model: e.cfg.Model, Pod: e.cfg.Pod, DPRank: e.cfg.DPRank}
}

// Close makes the engine refuse further work (ErrClosed); once it
// returns, no Publish call is running or will start, so the Publisher can
// be closed. It is safe to call more than once.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	return nil
}

// resetPool empties the cache: every block becomes free. Callers hold mu
// (or own e exclusively).
func (e *Engine) resetPool() {
	clear(e.cached)
	e.free = e.free[:0]
	for i := len(e.pool) - 1; i >= 0; i-- {
		e.pool[i] = block{}
		e.free = append(e.free, &e.pool[i])
	}
	e.lru.prev, e.lru.next = &e.lru, &e.lru
	e.nCached = 0
}

// Process runs one request through the cache: it hashes the full blocks
// of tokens (x supplies LoRA, salt and multimodal keys; nil for none),
// takes the longest cached prefix as a hit, allocates blocks for the rest
// (evicting least recently used cached blocks, one BlockRemoved each),
// stores them (one BlockStored), and releases all the request's blocks,
// which stay cached. The events go out as one batch. It returns the number
// of prompt tokens served from the cache.
//
// When the pool cannot hold all the new blocks, only the leading ones that
// fit are cached. An error from publishing leaves the cache updated.
func (e *Engine) Process(tokens []uint64, x *blockhash.Extras) (cachedTokens int, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return 0, ErrClosed
	}
	e.hashes, err = e.cfg.Hasher.Chain(e.hashes[:0], nil, 0, tokens, x)
	if err != nil {
		return 0, fmt.Errorf("enginesim: hashing request: %w", err)
	}
	hs := e.hashes
	e.queries += uint64(len(tokens))

	// Hit: pin the cached prefix (take it off the evictable list).
	e.pinned = e.pinned[:0]
	hit := 0
	for ; hit < len(hs); hit++ {
		b := e.cached[hs[hit].Key]
		if b == nil {
			break
		}
		e.lruRemove(b)
		e.pinned = append(e.pinned, b)
	}
	e.hits += uint64(hit * e.bs)

	// Allocate and store the rest, as far as the pool allows.
	fit := min(len(hs)-hit, len(e.free)+e.nCached-hit)
	e.removed, e.remDig = e.removed[:0], e.remDig[:0]
	for i := 0; i < fit; i++ {
		b := e.allocate()
		b.hash = hs[hit+i]
		e.insert(b)
		e.pinned = append(e.pinned, b)
	}

	// Release in reverse order: a request's tail is evicted before its head.
	for i := len(e.pinned) - 1; i >= 0; i-- {
		e.lruPushBack(e.pinned[i])
	}

	e.buildEvents(hs, hit, fit, tokens, x)
	if len(e.batch.Events) > 0 {
		err = e.publish()
	}
	return hit * e.bs, err
}

// allocate returns a block for new content: a free one, or else the least
// recently used evictable cached block, whose eviction is recorded for a
// BlockRemoved event.
func (e *Engine) allocate() *block {
	if n := len(e.free); n > 0 {
		b := e.free[n-1]
		e.free = e.free[:n-1]
		return b
	}
	b := e.lru.next // the caller checked that one exists
	e.lruRemove(b)
	e.uncache(b)
	e.removed = append(e.removed, b.hash.Key)
	e.remDig = append(e.remDig, b.hash.Digest()...)
	return b
}

// insert records b as cached under its key, after any other physical
// copies (vLLM keeps them all and hits on the oldest).
func (e *Engine) insert(b *block) {
	b.cached, b.dup = true, nil
	e.nCached++
	head := e.cached[b.hash.Key]
	if head == nil {
		e.cached[b.hash.Key] = b
		return
	}
	for head.dup != nil {
		head = head.dup
	}
	head.dup = b
}

// uncache removes b from the cache index.
func (e *Engine) uncache(b *block) {
	key := b.hash.Key
	head := e.cached[key]
	if head == b {
		if b.dup != nil {
			e.cached[key] = b.dup
		} else {
			delete(e.cached, key)
		}
	} else {
		for p := head; p != nil; p = p.dup {
			if p.dup == b {
				p.dup = b.dup
				break
			}
		}
	}
	b.cached, b.dup = false, nil
	e.nCached--
}

func (e *Engine) lruRemove(b *block) {
	if b.prev == nil {
		return // pinned already (the same block hit twice in one request)
	}
	b.prev.next, b.next.prev = b.next, b.prev
	b.prev, b.next = nil, nil
}

func (e *Engine) lruPushBack(b *block) {
	if b.prev != nil {
		return
	}
	last := e.lru.prev
	b.prev, b.next = last, &e.lru
	last.next, e.lru.prev = b, b
}

// buildEvents fills e.batch with the BlockRemoved events of this request's
// evictions and the BlockStored of its fit new blocks after hit.
func (e *Engine) buildEvents(hs []blockhash.Hash, hit, fit int, tokens []uint64, x *blockhash.Extras) {
	evs := e.batch.Events[:0]
	dlen := 0
	if len(e.removed) > 0 {
		dlen = len(e.remDig) / len(e.removed)
	}
	e.digests = e.digests[:0]
	for i := range e.removed {
		ev := kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: e.removed[i : i+1 : i+1], Medium: e.cfg.Medium}
		if e.cfg.BytesHashes {
			e.digests = append(e.digests, e.remDig[i*dlen:(i+1)*dlen:(i+1)*dlen])
			ev.Digests = e.digests[len(e.digests)-1:]
		}
		evs = append(evs, ev)
	}
	if fit > 0 {
		e.keys, e.extras = e.keys[:0], e.extras[:0]
		start := len(e.digests)
		for i := hit; i < hit+fit; i++ {
			e.keys = append(e.keys, hs[i].Key)
			e.extras = append(e.extras, x.BlockKeys(i, e.bs))
			if e.cfg.BytesHashes {
				e.digests = append(e.digests, hs[i].Digest())
			}
		}
		ev := kvevents.Event{
			Kind:      kvevents.BlockStored,
			Hashes:    e.keys,
			TokenIDs:  tokens[hit*e.bs : (hit+fit)*e.bs],
			BlockSize: e.bs,
			Medium:    e.cfg.Medium,
			ExtraKeys: e.extras,
			SpecKind:  "full_attention",
		}
		if x != nil {
			ev.LoRAName = x.LoRAName
		}
		if e.cfg.BytesHashes {
			ev.Digests = e.digests[start:]
		}
		if hit > 0 {
			ev.HasParent, ev.Parent = true, hs[hit-1].Key
			if e.cfg.BytesHashes {
				ev.ParentDigest = hs[hit-1].Digest()
			}
		}
		evs = append(evs, ev)
	}
	e.batch.Events = evs
}

// publish encodes e.batch, buffers it for replay and hands it to the
// Publisher, unless a DropNext is pending. Callers hold mu.
func (e *Engine) publish() error {
	e.batch.TS = float64(e.cfg.Now().UnixNano()) / 1e9
	e.batch.HasDPRank, e.batch.DPRank = true, e.cfg.DPRank
	enc, err := kvevents.AppendBatch(e.enc[:0], &e.batch, e.opts)
	e.enc = enc
	if err != nil {
		return fmt.Errorf("enginesim: encoding batch: %w", err)
	}
	payload := bytes.Clone(enc) // owned by the replay buffer from now on
	seq := e.seq
	e.seq++ // past 2^64-1 to 0, as a peer's counter would
	e.buffer(seq, payload)
	if e.dropNext > 0 {
		e.dropNext--
		return nil
	}
	if e.cfg.Publisher == nil {
		return nil
	}
	return e.cfg.Publisher.Publish(seq, payload)
}

// buffer appends a batch to the replay ring.
func (e *Engine) buffer(seq uint64, payload []byte) {
	if len(e.ring) < e.cfg.BufferSteps {
		e.ring = append(e.ring, entry{seq, payload})
		return
	}
	e.ring[e.ringHead] = entry{seq, payload}
	e.ringHead = (e.ringHead + 1) % len(e.ring)
}

// Buffered returns the batches of the replay buffer with seq >= from,
// oldest first: what a replay request for from is answered with. The
// buffer is read when iteration starts, and the engine is not locked while
// the loop body runs.
func (e *Engine) Buffered(from uint64) iter.Seq2[uint64, []byte] {
	return func(yield func(uint64, []byte) bool) {
		for _, en := range e.since(from) {
			if !yield(en.seq, en.payload) {
				return
			}
		}
	}
}

// since returns the buffered batches with seq >= start, oldest first.
func (e *Engine) since(start uint64) []entry {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []entry
	for i := range e.ring {
		en := e.ring[(e.ringHead+i)%len(e.ring)]
		if en.seq >= start {
			out = append(out, en)
		}
	}
	return out
}

// Lookup returns how many leading full blocks of tokens the engine holds
// now, without touching recency or publishing anything: the true cache
// state an oracle router would route by.
func (e *Engine) Lookup(tokens []uint64, x *blockhash.Extras) (int, error) {
	hs, err := e.cfg.Hasher.Chain(nil, nil, 0, tokens, x)
	if err != nil {
		return 0, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for n < len(hs) && e.cached[hs[n].Key] != nil {
		n++
	}
	return n, nil
}

// LookupKeys is Lookup for block keys already computed (block 0 first),
// so that one hashing serves many engines.
func (e *Engine) LookupKeys(keys []uint64) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for n < len(keys) && e.cached[keys[n]] != nil {
		n++
	}
	return n
}

// CachedBlocks returns the number of physical blocks holding cached content.
func (e *Engine) CachedBlocks() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.nCached
}

// Clear drops every cached block and publishes AllBlocksCleared, as
// vLLM's reset_prefix_cache does.
func (e *Engine) Clear() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrClosed
	}
	e.resetPool()
	e.batch.Events = append(e.batch.Events[:0], kvevents.Event{Kind: kvevents.AllBlocksCleared})
	return e.publish()
}

// Restart simulates a new engine process on the same endpoints: the cache
// and the replay buffer are emptied and the sequence starts again at
// FirstSeq (0).
// Nothing is published (vLLM announces no AllBlocksCleared on start).
func (e *Engine) Restart() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.resetPool()
	e.seq, e.dropNext = e.cfg.FirstSeq, 0
	clear(e.ring)
	e.ring, e.ringHead = e.ring[:0], 0
}

// DropNext makes the next n batches go into the replay buffer without
// being handed to the Publisher, as a PUB socket losing messages would.
func (e *Engine) DropNext(n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.dropNext = max(n, 0)
}

// Seq returns the sequence number the next batch will carry.
func (e *Engine) Seq() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.seq
}

// Hits returns the prompt tokens served from the cache so far.
func (e *Engine) Hits() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.hits
}

// Queries returns the prompt tokens processed so far (Hits/Queries is the
// engine's prefix-cache hit rate, as vLLM's metrics define it).
func (e *Engine) Queries() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.queries
}
