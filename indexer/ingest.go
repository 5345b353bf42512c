package indexer

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"unicode/utf8"
	"unsafe"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/kvevents"
)

// Defaults for Options.
const (
	DefaultVerifyFirst = 256
	DefaultVerifyEvery = 64
	// DefaultDigestEntries sizes each engine's LRU of full digests of
	// verified blocks, used to verify events whose parent is a 64-bit key.
	DefaultDigestEntries = 1024
)

// Rough per-entry costs of the Go structures behind the engine-side maps,
// for Stats.Bytes: a simplelru entry (list element with key, Hash value
// and expiry fields, plus its map slot) and a fallback map entry.
const (
	digestEntryBytes   = 160
	fallbackEntryBytes = 96
)

// engine is the state of one (pod, dp rank) stream of a namespace.
type engine struct {
	id  uint32
	eid kvevents.EngineID

	// mu serialises Apply, Reset and RemoveEngine for this engine
	// (the subscriber already does; RemoveEngine may come from
	// elsewhere).
	mu      sync.Mutex
	removed bool

	holderBlocks atomic.Int64
	tiers        tierCounts    // holderBlocks by medium
	evicted      atomic.Uint64 // EngineInfo.Evicted
	health       atomic.Uint32 // kvevents.Health, as the transport last said (Index.Health)
	check        atomic.Uint32 // HashCheck
	fallback     atomic.Bool
	lastSeq      atomic.Uint64
	verified     atomic.Uint64
	mismatches   atomic.Uint64
	unverifiable atomic.Uint64
	dropped      atomic.Uint64
	malformed    atomic.Uint64
	removeMisses atomic.Uint64
	message      atomic.Pointer[string]

	// Guarded by mu.
	nStored    uint64 // BlockStored events with tokens seen
	wantVerify bool   // a sampled verification is due
	digests    *simplelru.LRU[uint64, blockhash.Hash]
	fb         map[uint64]fbEntry // fallback: engine key -> kvindex keys
	extraBytes int64              // bytes accounted for digests and fb
	hashes     []blockhash.Hash
	extras     []blockhash.BlockExtra
	loraName   string
	loraExtra  blockhash.BlockExtra
	// samples are the last BlockStored events of an engine flagged
	// mismatch (HashSamples); sampleBytes their accounted size.
	samples     []kvevents.Event
	sampleBytes int64
}

// fbEntry maps one engine block to kvindex's block(s) in fallback mode:
// the last (or only) kvindex block's hash, for chaining, and the keys of
// the earlier ones when the engine's block spans several of kvindex's.
type fbEntry struct {
	h   blockhash.Hash
	sub []uint64
}

func newEngine(id uint32, eid kvevents.EngineID, digestEntries int) *engine {
	e := &engine{id: id, eid: eid}
	e.digests, _ = simplelru.NewLRU[uint64, blockhash.Hash](digestEntries, nil)
	return e
}

func (e *engine) bytes() int64 {
	return int64(unsafe.Sizeof(*e)) + int64(len(e.eid.Pod)+len(e.eid.Model)) + e.tiers.bytes()
}

func (e *engine) setMessage(s string) { e.message.Store(&s) }

// forgetVerification clears what the engine's past events taught: after a
// restart the engine may run another configuration.
func (e *engine) forgetVerification() {
	e.check.Store(uint32(HashUnknown))
	e.fallback.Store(false)
	e.nStored = 0
	e.wantVerify = false
	e.message.Store(nil)
}

// forgetKeys drops the engine-key maps (digests of stored blocks, fallback
// keys); the engine's cache no longer holds those blocks. Returns the
// byte change.
func (e *engine) forgetKeys() int64 {
	e.digests.Purge()
	e.fb = nil
	d := -e.extraBytes
	e.extraBytes = 0
	return d
}

// batch accumulates the per-call changes of one Apply.
type batch struct {
	holdings int64
	tiers    tierDelta // holdings by medium
	bytes    int64
}

// hold counts n more holdings (fewer when negative) in medium m.
func (b *batch) hold(m int, n int64) {
	b.holdings += n
	b.tiers.add(m, n)
}

// commit folds the batch's holdings into e's counters and its bytes into
// the namespace. e.mu held.
func (b *batch) commit(ns *namespace, e *engine) {
	e.holderBlocks.Add(b.holdings)
	b.bytes += e.tiers.add(&b.tiers)
	if b.bytes != 0 {
		ns.bytes.Add(b.bytes)
	}
}

// applyStored indexes one BlockStored event.
func (ix *Index) applyStored(ns *namespace, e *engine, ev *kvevents.Event, gen uint64, b *batch) {
	n := len(ev.Hashes)
	switch {
	case n == 0,
		ev.BlockSize <= 0 || ev.BlockSize > blockhash.MaxBlockSize,
		ev.Digests != nil && len(ev.Digests) != n,
		ev.ExtraKeys != nil && len(ev.ExtraKeys) != n,
		len(ev.TokenIDs) != 0 && len(ev.TokenIDs) != n*ev.BlockSize,
		ev.GroupIdx < 0 || ev.GroupIdx > maxGroup:
		e.malformed.Add(1)
		return
	}
	m, ok := ns.media.intern(ev.Medium)
	if !ok {
		e.malformed.Add(1)
		return
	}
	// The counter exists before the first holding does: eviction,
	// which may take that holding before this batch commits, only ever
	// finds counters to decrement.
	_, grew := e.tiers.counter(m)
	b.bytes += grew
	if ns.blockSize.Load() != int64(ev.BlockSize) {
		ns.blockSize.Store(int64(ev.BlockSize))
	}
	g := ev.GroupIdx
	if len(ev.TokenIDs) == 0 {
		// Tokenless stores (offload connectors re-announcing blocks in
		// another medium) can only be keyed through what the engine's
		// earlier events told.
		for _, k := range ev.Hashes {
			if e.fallback.Load() {
				ent, ok := e.fb[k]
				if !ok {
					e.dropped.Add(1)
					continue
				}
				ix.addFallback(ns, e, &ent, g, m, gen, b)
				continue
			}
			ix.addHolding(ns, e, k, g, m, gen, b)
		}
		return
	}
	if ix.hasher != nil {
		if e.fallback.Load() {
			e.keepSample(ev, b)
			ix.storeFallback(ns, e, ev, g, m, gen, b)
			return
		}
		e.nStored++
		try := e.nStored <= uint64(ix.verifyFirst)
		if !try && (e.nStored-uint64(ix.verifyFirst))%uint64(ix.verifyEvery) == 0 {
			e.wantVerify = true
		}
		if try || e.wantVerify {
			switch ix.verify(e, ev, b) {
			case verdictMatch:
				e.wantVerify = false
			case verdictMismatch:
				e.wantVerify = false
				e.keepSample(ev, b)
				ix.storeFallback(ns, e, ev, g, m, gen, b)
				return
			}
		}
	}
	ns.prefetch(ev.Hashes)
	for _, k := range ev.Hashes {
		ix.addHolding(ns, e, k, g, m, gen, b)
	}
}

func (ix *Index) addHolding(ns *namespace, e *engine, key uint64, g, m int, gen uint64, b *batch) {
	newHolding, saturated := ns.add(e.id, key, g, m, 1, gen)
	if newHolding {
		b.hold(m, 1)
	}
	if saturated {
		e.malformed.Add(1)
	}
}

type verdict uint8

const (
	verdictUnverifiable verdict = iota
	verdictMatch
	verdictMismatch
)

// extraKeys returns the per-block extra keys of a BlockStored: the event's
// own, or for engines that predate the field, the LoRA name on every block.
func (e *engine) extraKeys(ev *kvevents.Event) []blockhash.BlockExtra {
	if ev.ExtraKeys != nil {
		return ev.ExtraKeys
	}
	if ev.LoRAName == "" {
		return nil
	}
	if e.loraName != ev.LoRAName {
		e.loraName = ev.LoRAName
		e.loraExtra = blockhash.BlockExtra{blockhash.Str(ev.LoRAName)}
	}
	e.extras = e.extras[:0]
	for range ev.Hashes {
		e.extras = append(e.extras, e.loraExtra)
	}
	return e.extras
}

// verify recomputes the event's hashes with the configured Hasher.
func (ix *Index) verify(e *engine, ev *kvevents.Event, b *batch) verdict {
	n := len(ev.Hashes)
	if bs := ix.hasher.BlockSize(); ev.BlockSize != bs {
		ix.flagMismatch(e, n, fmt.Sprintf("hash mismatch (block size): the engine reports block_size %d, kvindex is configured for %d; give both the same block size", ev.BlockSize, bs))
		return verdictMismatch
	}
	parent, ok := ix.verifiedParent(e, ev)
	if !ok {
		e.unverifiable.Add(1)
		return verdictUnverifiable
	}
	var err error
	e.hashes, err = ix.hasher.ChainKeys(e.hashes[:0], parent, ev.TokenIDs, e.extraKeys(ev))
	if err != nil || len(e.hashes) != n {
		e.unverifiable.Add(1)
		return verdictUnverifiable
	}
	for i := range e.hashes {
		h := &e.hashes[i]
		// Full digests are compared when the engine sent ones of the
		// Hasher's length (a hybrid model's concatenated group digests
		// are longer; their 64-bit key still has to match).
		if h.Key == ev.Hashes[i] && (ev.Digests == nil || len(ev.Digests[i]) != len(h.Digest()) || bytes.Equal(h.Digest(), ev.Digests[i])) {
			continue
		}
		e.verified.Add(uint64(i))
		ix.flagMismatch(e, n-i, fmt.Sprintf(
			"hash mismatch: check the engines' prefix-caching hash algorithm and PYTHONHASHSEED against kvindex's (block %d of %d of a stored event: engine key %d, kvindex computed %d%s)",
			i, n, ev.Hashes[i], h.Key, mismatchHint(i, ev)))
		return verdictMismatch
	}
	e.verified.Add(uint64(n))
	e.check.CompareAndSwap(uint32(HashUnknown), uint32(HashVerified))
	before := e.digests.Len()
	for i := range e.hashes {
		e.digests.Add(ev.Hashes[i], e.hashes[i])
	}
	sz := int64(e.digests.Len()-before) * digestEntryBytes
	e.extraBytes += sz
	b.bytes += sz
	return verdictMatch
}

func mismatchHint(i int, ev *kvevents.Event) string {
	switch {
	case i > 0:
		return "; earlier blocks matched, so the extra keys (LoRA, multimodal, cache salt) differ"
	case ev.HasParent:
		return "; the first block chains from the parent"
	}
	return "; the first block of a sequence differs, so the algorithm or seed differs"
}

func (ix *Index) flagMismatch(e *engine, blocks int, msg string) {
	e.mismatches.Add(uint64(blocks))
	e.check.Store(uint32(HashMismatch))
	if !e.fallback.Swap(true) {
		e.setMessage(msg)
	}
}

// verifiedParent returns the full digest an event's first block chains
// from: NONE_HASH, the digest the event carries, or one remembered from
// this engine's verified events.
func (ix *Index) verifiedParent(e *engine, ev *kvevents.Event) (*blockhash.Hash, bool) {
	if !ev.HasParent {
		return nil, true
	}
	if len(ev.ParentDigest) > 0 {
		h, err := ix.hasher.HashFromDigest(ev.ParentDigest)
		if err != nil {
			return nil, false
		}
		return &h, true
	}
	h, ok := e.digests.Get(ev.Parent)
	if !ok {
		return nil, false
	}
	return &h, true
}

// storeFallback indexes a BlockStored of an engine whose hashes do not
// match kvindex's: under keys kvindex computes from the event's tokens,
// chained from the parent's kvindex digest, remembering the engine key ->
// kvindex key mapping for later removals and children.
func (ix *Index) storeFallback(ns *namespace, e *engine, ev *kvevents.Event, g, m int, gen uint64, b *batch) {
	n := len(ev.Hashes)
	bsK := ix.hasher.BlockSize()
	if ev.BlockSize%bsK != 0 {
		// kvindex blocks would straddle the engine's: no sound keys.
		e.dropped.Add(uint64(n))
		return
	}
	r := ev.BlockSize / bsK
	var parent *blockhash.Hash
	if ev.HasParent {
		if ent, ok := e.fb[ev.Parent]; ok {
			parent = &ent.h
		} else if h, ok := e.digests.Peek(ev.Parent); ok {
			// Verified before the mismatch: the engine's digest is
			// kvindex's.
			parent = &h
		} else {
			e.dropped.Add(uint64(n))
			return
		}
	}
	keys := e.extraKeys(ev)
	if r > 1 {
		// Extra keys belong to the engine's blocks; only the LoRA name
		// (the same on every block) carries over to sub-blocks.
		if ev.ExtraKeys != nil {
			for _, k := range ev.ExtraKeys {
				if k != nil {
					e.dropped.Add(uint64(n))
					return
				}
			}
		}
		if keys != nil {
			lora := keys[0]
			e.extras = e.extras[:0]
			for range n * r {
				e.extras = append(e.extras, lora)
			}
			keys = e.extras
		}
	}
	var err error
	e.hashes, err = ix.hasher.ChainKeys(e.hashes[:0], parent, ev.TokenIDs, keys)
	if err != nil || len(e.hashes) != n*r {
		e.dropped.Add(uint64(n))
		return
	}
	if e.fb == nil {
		e.fb = make(map[uint64]fbEntry)
	}
	for i, k := range ev.Hashes {
		ent := fbEntry{h: e.hashes[(i+1)*r-1]}
		if r > 1 {
			ent.sub = make([]uint64, r-1)
			for j := range ent.sub {
				ent.sub[j] = e.hashes[i*r+j].Key
			}
		}
		if _, ok := e.fb[k]; !ok {
			sz := int64(fallbackEntryBytes + 8*len(ent.sub))
			e.extraBytes += sz
			b.bytes += sz
		}
		e.fb[k] = ent
		ix.addFallback(ns, e, &ent, g, m, gen, b)
	}
}

func (ix *Index) addFallback(ns *namespace, e *engine, ent *fbEntry, g, m int, gen uint64, b *batch) {
	for _, k := range ent.sub {
		ix.addHolding(ns, e, k, g, m, gen, b)
	}
	ix.addHolding(ns, e, ent.h.Key, g, m, gen, b)
}

// applyRemoved applies one BlockRemoved event.
func (ix *Index) applyRemoved(ns *namespace, e *engine, ev *kvevents.Event, b *batch) {
	if len(ev.Hashes) == 0 || ev.GroupIdx < 0 || ev.GroupIdx > maxGroup {
		e.malformed.Add(1)
		return
	}
	m, ok := ns.media.lookup(ev.Medium)
	if !ok {
		// A medium never stored holds nothing.
		e.removeMisses.Add(uint64(len(ev.Hashes)))
		return
	}
	g := ev.GroupIdx
	for _, k := range ev.Hashes {
		if e.fallback.Load() {
			if ent, ok := e.fb[k]; ok {
				for _, sk := range ent.sub {
					ix.removeHolding(ns, e, sk, g, m, b)
				}
				ix.removeHolding(ns, e, ent.h.Key, g, m, b)
				if !ns.holds(e.id, ent.h.Key) {
					delete(e.fb, k)
					sz := int64(fallbackEntryBytes + 8*len(ent.sub))
					e.extraBytes -= sz
					b.bytes -= sz
				}
				continue
			}
			// Stored before the mismatch was found: keyed by the
			// engine's own hash.
		}
		ix.removeHolding(ns, e, k, g, m, b)
	}
}

func (ix *Index) removeHolding(ns *namespace, e *engine, key uint64, g, m int, b *batch) {
	found, removed, _ := ns.remove(e.id, key, g, m)
	if !found {
		e.removeMisses.Add(1)
	}
	if removed {
		b.hold(m, -1)
	}
}

// mediaTable interns medium names to small ids shared by all namespaces;
// id 0 is the GPU ("" and "GPU").
type mediaTable struct {
	mu    sync.Mutex
	names atomic.Pointer[[]string]
	ids   map[string]int
}

// maxMediumLen bounds a medium name; engines send short tier names.
// Names must also be valid UTF-8: they become proto strings (ListPods,
// Lookup) and Prometheus label values, which refuse anything else.
const maxMediumLen = 64

func (t *mediaTable) init() {
	t.ids = map[string]int{kvevents.MediumGPU: mediumGPU}
	names := []string{kvevents.MediumGPU}
	t.names.Store(&names)
}

func (t *mediaTable) lookup(s string) (int, bool) {
	if s == "" || s == kvevents.MediumGPU {
		return mediumGPU, true
	}
	names := *t.names.Load()
	for i, n := range names {
		if n == s {
			return i, true
		}
	}
	return 0, false
}

// intern returns the id of medium s, adding it if new; false for names too
// long or not UTF-8, or one medium too many (hostile input).
func (t *mediaTable) intern(s string) (int, bool) {
	if id, ok := t.lookup(s); ok {
		return id, true
	}
	if len(s) > maxMediumLen || !utf8.ValidString(s) {
		return 0, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if id, ok := t.ids[s]; ok {
		return id, true
	}
	old := *t.names.Load()
	if len(old) >= maxMedia {
		return 0, false
	}
	names := append(old[:len(old):len(old)], s)
	t.ids[s] = len(old)
	t.names.Store(&names)
	return len(old), true
}

func (t *mediaTable) name(id int) string {
	names := *t.names.Load()
	if id < len(names) {
		return names[id]
	}
	return ""
}
