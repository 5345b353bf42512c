package tokenizer

import (
	"encoding/binary"
	"hash/maphash"
	"slices"
	"sync"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// cacheKey identifies a tokenization request: 128 bits of keyed hash over
// (model, form, add_special_tokens, content). The seeds are random per
// process, so clients cannot craft colliding requests to poison the cache,
// and 128 bits make accidental collisions negligible.
type cacheKey [2]uint64

// keyer hashes requests into cache keys.
type keyer struct{ seeds [2]maphash.Seed }

func newKeyer() keyer { return keyer{[2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}} }

func (k *keyer) key(model string, in *Input, special bool) cacheKey {
	var out cacheKey
	var h maphash.Hash
	for i := range out {
		h.SetSeed(k.seeds[i])
		writeRequest(&h, k.seeds[i], model, in, special)
		out[i] = h.Sum64()
	}
	return out
}

// writeRequest writes every field that can change the ids (for the chat
// form: every message, Raw included, and the chat parameters: tools,
// chat_template_kwargs, ...), each length-prefixed so that no two different
// requests write the same bytes.
func writeRequest(h *maphash.Hash, seed maphash.Seed, model string, in *Input, special bool) {
	form := byte('p')
	if in.IsChat() {
		form = 'c'
	}
	if special {
		form |= 0x80
	}
	h.WriteByte(form)
	writeField(h, seed, model)
	if !in.IsChat() {
		writeField(h, seed, in.Prompt)
		return
	}
	writeUint(h, uint64(len(in.Messages)))
	for i := range in.Messages {
		m := &in.Messages[i]
		writeField(h, seed, m.Role)
		writeField(h, seed, m.Content)
		writeField(h, seed, string(m.Raw))
	}
	writeField(h, seed, string(in.ChatParams))
}

// writeField writes s's length and s, or for long strings its 64-bit
// digest under the same seed: maphash.String runs at memory speed, while
// a maphash.Hash consumes writes 128 bytes at a time.
func writeField(h *maphash.Hash, seed maphash.Seed, s string) {
	writeUint(h, uint64(len(s)))
	if len(s) <= 256 {
		h.WriteString(s)
		return
	}
	writeUint(h, maphash.String(seed, s))
}

func writeUint(h *maphash.Hash, v uint64) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	h.Write(b[:])
}

// idCache is an LRU of token ids bounded both by entries and by the bytes
// of the ids it holds (ids are stored as uint32: every vocabulary fits).
type idCache struct {
	mu       sync.Mutex
	lru      *simplelru.LRU[cacheKey, []uint32]
	bytes    int64
	maxBytes int64
}

// entryOverhead approximates the per-entry memory besides the ids (list
// element, map slot, key, slice header), so that many tiny entries are
// accounted for too.
const entryOverhead = 128

func newIDCache(entries int, maxBytes int64) *idCache {
	c := &idCache{maxBytes: maxBytes}
	// NewLRU fails only for a non-positive size, which callers exclude.
	c.lru, _ = simplelru.NewLRU(entries, func(_ cacheKey, ids []uint32) {
		c.bytes -= entrySize(ids)
	})
	return c
}

func entrySize(ids []uint32) int64 { return int64(len(ids))*4 + entryOverhead }

// get appends the cached ids for k to dst; ok is false on a miss. The
// copy happens outside the lock: cached slices are never modified, so
// reading one after it was evicted is safe.
func (c *idCache) get(k cacheKey, dst []uint64) (_ []uint64, ok bool) {
	c.mu.Lock()
	ids, ok := c.lru.Get(k)
	c.mu.Unlock()
	if !ok {
		return dst, false
	}
	dst = slices.Grow(dst, len(ids))
	for _, id := range ids {
		dst = append(dst, uint64(id))
	}
	return dst, true
}

// add stores ids (owned by the cache from now on), evicting the least
// recently used entries beyond the byte budget. An entry larger than the
// whole budget is not stored.
func (c *idCache) add(k cacheKey, ids []uint32) {
	size := entrySize(ids)
	if size > c.maxBytes {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.lru.Peek(k); ok {
		c.bytes -= entrySize(old)
	}
	c.lru.Add(k, ids)
	c.bytes += size
	for c.bytes > c.maxBytes {
		if _, _, ok := c.lru.RemoveOldest(); !ok {
			break
		}
	}
}

// stats returns the number of entries and their accounted bytes.
func (c *idCache) stats() (entries int, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len(), c.bytes
}
