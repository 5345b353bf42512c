package blockhash

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"

	"github.com/zeebo/xxh3"
)

// Algo names a block-hashing scheme, spelled as vLLM's
// --prefix-caching-hash-algo spells it (plus "sglang").
type Algo string

// The supported algorithms.
const (
	SHA256CBOR   Algo = "sha256_cbor"
	XXHashCBOR   Algo = "xxhash_cbor"
	SHA256Pickle Algo = "sha256"
	XXHashPickle Algo = "xxhash"
	SGLang       Algo = "sglang"
)

// Algos lists every supported algorithm, for help texts and validation.
var Algos = []Algo{SHA256CBOR, XXHashCBOR, SHA256Pickle, XXHashPickle, SGLang}

// DefaultSeed is the NONE_HASH seed vLLM uses for sha256 and sha256_cbor
// when PYTHONHASHSEED is unset (vLLM PR #51875, August 2026).
const DefaultSeed = "vllm-none-hash"

// DefaultBlockSize is vLLM's default KV-cache block size in tokens.
const DefaultBlockSize = 16

// DefaultAlgo is vLLM's default --prefix-caching-hash-algo.
const DefaultAlgo = SHA256Pickle

// DefaultConfig is vLLM's hashing when nothing is configured.
func DefaultConfig() Config {
	return Config{Algo: DefaultAlgo, Seed: DefaultSeed, BlockSize: DefaultBlockSize}
}

// MaxBlockSize bounds the block size a Hasher accepts. Engines use 16 to
// 256; the bound keeps a hostile configuration from sizing huge buffers.
const MaxBlockSize = 1 << 16

// ErrUnsupported is returned for inputs whose engine-side serialisation
// kvindex cannot reproduce (see the package documentation).
var ErrUnsupported = errors.New("blockhash: input shape cannot be mirrored")

// Config selects the hashing scheme of one engine fleet.
type Config struct {
	Algo      Algo   // one of Algos
	Seed      string // the engines' PYTHONHASHSEED; ignored by SGLang
	BlockSize int    // tokens per block, >= 1
}

// Hash is one block hash: the full digest and its 64-bit event form.
type Hash struct {
	// Key is the 64-bit form engines put in KV events.
	Key uint64
	sum [32]byte
	n   uint8
}

// Digest returns the full digest (32 bytes for SHA-256, 16 for XXH3-128).
// The slice aliases h.
func (h *Hash) Digest() []byte { return h.sum[:h.n] }

// IsZero reports whether h is the zero Hash (no digest).
func (h *Hash) IsZero() bool { return h.n == 0 }

// Hex returns the full digest in lower-case hex.
func (h Hash) Hex() string { return hex.EncodeToString(h.sum[:h.n]) }

// String formats h as "<key> <digest hex>".
func (h Hash) String() string { return fmt.Sprintf("%d %s", h.Key, h.Hex()) }

// Hasher computes block hashes for one Config. It is immutable and safe
// for concurrent use.
type Hasher struct {
	cfg    Config
	none   Hash
	codec  codecKind
	digest digestKind
	states sync.Pool // *state
}

// state is the scratch space of one Chain call, pooled so that the hot path
// does not allocate.
type state struct {
	buf []byte // one block's serialised hash input
	sc  scratch
}

// codecKind selects the serialisation of a block's hash input; digestKind
// its digest. Switches rather than interfaces or func values keep the
// arguments on the stack.
type codecKind uint8

const (
	codecCBOR codecKind = iota
	codecPickle
	codecSGLang
)

type digestKind uint8

const (
	digestSHA256 digestKind = iota
	digestXXH3
	digestSHA256First // SGLang: key from the first 8 bytes
)

func (h *Hasher) appendBlock(b []byte, parent []byte, tokens []uint64, extra BlockExtra) ([]byte, error) {
	switch h.codec {
	case codecPickle:
		return pickleCodec{}.appendBlock(b, parent, tokens, extra)
	case codecSGLang:
		return sglangCodec{}.appendBlock(b, parent, tokens, extra)
	}
	return cborCodec{}.appendBlock(b, parent, tokens, extra)
}

func (h *Hasher) sum(dst *Hash, msg []byte) {
	switch h.digest {
	case digestXXH3:
		sumXXH3(dst, msg)
	case digestSHA256First:
		sumSGLang(dst, msg)
	default:
		sumSHA256(dst, msg)
	}
}

// New returns a Hasher for cfg.
func New(cfg Config) (*Hasher, error) {
	if cfg.BlockSize < 1 || cfg.BlockSize > MaxBlockSize {
		return nil, fmt.Errorf("blockhash: block size %d out of range [1, %d]", cfg.BlockSize, MaxBlockSize)
	}
	h := &Hasher{cfg: cfg}
	switch cfg.Algo {
	case SHA256CBOR:
		h.codec, h.digest = codecCBOR, digestSHA256
	case XXHashCBOR:
		h.codec, h.digest = codecCBOR, digestXXH3
	case SHA256Pickle:
		h.codec, h.digest = codecPickle, digestSHA256
	case XXHashPickle:
		h.codec, h.digest = codecPickle, digestXXH3
	case SGLang:
		h.codec, h.digest = codecSGLang, digestSHA256First
	default:
		return nil, fmt.Errorf("blockhash: unknown algorithm %q (want one of %v)", cfg.Algo, Algos)
	}
	h.states.New = func() any { return &state{buf: make([]byte, 0, 64+9*cfg.BlockSize)} }
	var (
		seed []byte
		err  error
	)
	switch h.codec {
	case codecCBOR:
		seed, err = cborCodec{}.appendSeed(nil, cfg.Seed)
	case codecPickle:
		seed, err = pickleCodec{}.appendSeed(nil, cfg.Seed)
	case codecSGLang:
		return h, nil // no NONE_HASH: the first page has no prefix
	}
	if err != nil {
		return nil, fmt.Errorf("blockhash: seed: %w", err)
	}
	h.sum(&h.none, seed)
	return h, nil
}

// MustNew is New for configurations known to be valid; it panics otherwise.
func MustNew(cfg Config) *Hasher {
	h, err := New(cfg)
	if err != nil {
		panic(err)
	}
	return h
}

// Config returns the Hasher's configuration.
func (h *Hasher) Config() Config { return h.cfg }

// BlockSize returns the tokens per block.
func (h *Hasher) BlockSize() int { return h.cfg.BlockSize }

// NoneHash returns NONE_HASH, the parent of block 0 (zero for SGLang, which
// has none).
func (h *Hasher) NoneHash() Hash { return h.none }

// HashFromDigest wraps a digest received from an engine (32-byte KV-event
// hashes) so a chain can continue from it.
func (h *Hasher) HashFromDigest(d []byte) (Hash, error) {
	var out Hash
	if len(d) == 0 || len(d) > len(out.sum) {
		return out, fmt.Errorf("blockhash: digest length %d out of range [1, 32]", len(d))
	}
	out.n = uint8(copy(out.sum[:], d))
	out.Key = KeyOfDigest(h.cfg.Algo, out.sum[:out.n])
	return out, nil
}

// Block hashes one block of tokens (all of them, whatever their count)
// under parent; a nil or zero parent means the start of a sequence.
func (h *Hasher) Block(parent *Hash, tokens []uint64, extra BlockExtra) (Hash, error) {
	var out Hash
	st := h.states.Get().(*state)
	defer h.states.Put(st)
	var err error
	st.buf, err = h.appendBlock(st.buf[:0], h.parentDigest(parent), tokens, extra)
	if err != nil {
		return out, err
	}
	h.sum(&out, st.buf)
	return out, nil
}

// Chain appends to dst the hashes of the full blocks of tokens and returns
// the extended slice. The blocks are blocks first, first+1, ... of a
// sequence whose block first-1 hashed to parent (nil or zero: first must be
// 0 and the chain starts at NONE_HASH). x supplies the extra keys; nil
// means none. A trailing partial block is ignored, as engines do.
func (h *Hasher) Chain(dst []Hash, parent *Hash, first int, tokens []uint64, x *Extras) ([]Hash, error) {
	if first < 0 {
		return dst, fmt.Errorf("blockhash: negative first block %d", first)
	}
	if h.codec == codecSGLang && !x.empty() && len(tokens) >= h.cfg.BlockSize {
		return dst, fmt.Errorf("%w: SGLang hashing has no extra keys (LoRA, salt, multimodal)", ErrUnsupported)
	}
	return h.chain(dst, parent, first, tokens, extraSource{derived: x})
}

// ChainKeys is Chain with explicit extra keys per block, as KV events carry
// them: keys[i] belongs to block i of tokens (missing entries mean None).
func (h *Hasher) ChainKeys(dst []Hash, parent *Hash, tokens []uint64, keys []BlockExtra) ([]Hash, error) {
	return h.chain(dst, parent, 0, tokens, extraSource{explicit: keys})
}

// extraSource yields each block's extra keys for the one hashing loop:
// derived from a request's Extras (Chain) or given per block as KV events
// carry them (ChainKeys). A struct passed by value rather than a func value
// keeps the loop free of allocations.
type extraSource struct {
	derived  *Extras      // used when explicit is nil
	explicit []BlockExtra // explicit[i] belongs to the loop's block i
}

// block returns the extra keys of block first+i (nil for None); a derived
// result aliases sc.
func (src extraSource) block(sc *scratch, first, i, bs int) BlockExtra {
	if src.explicit != nil {
		if i < len(src.explicit) {
			return src.explicit[i]
		}
		return nil
	}
	return src.derived.block(sc, first+i, bs)
}

// chain is the hashing loop behind Chain and ChainKeys: it hashes every
// full block of tokens, each chained to the digest of the one before.
func (h *Hasher) chain(dst []Hash, parent *Hash, first int, tokens []uint64, src extraSource) ([]Hash, error) {
	bs := h.cfg.BlockSize
	n := len(tokens) / bs
	if n == 0 {
		return dst, nil
	}
	st := h.states.Get().(*state)
	defer h.states.Put(st)
	prev := h.parentDigest(parent)
	start := len(dst)
	dst = growHashes(dst, n)
	var err error
	for i := 0; i < n; i++ {
		blk := first + i
		extra := src.block(&st.sc, first, i, bs)
		if h.codec == codecSGLang && extra != nil {
			return dst[:start+i], fmt.Errorf("%w: SGLang hashing has no extra keys", ErrUnsupported)
		}
		st.buf, err = h.appendBlock(st.buf[:0], prev, tokens[i*bs:(i+1)*bs], extra)
		if err != nil {
			return dst[:start+i], fmt.Errorf("block %d: %w", blk, err)
		}
		out := &dst[start+i]
		h.sum(out, st.buf)
		prev = out.Digest()
	}
	return dst, nil
}

// parentDigest returns the digest bytes a block chains from.
func (h *Hasher) parentDigest(parent *Hash) []byte {
	if parent == nil || parent.IsZero() {
		// vLLM falls back to NONE_HASH when the parent is falsy; SGLang's
		// first page has no prefix at all (h.none is zero-length there).
		return h.none.Digest()
	}
	return parent.Digest()
}

func growHashes(dst []Hash, n int) []Hash {
	if cap(dst)-len(dst) < n {
		grown := make([]Hash, len(dst), len(dst)+n)
		copy(grown, dst)
		dst = grown
	}
	return dst[:len(dst)+n]
}

func sumSHA256(dst *Hash, msg []byte) {
	dst.sum = sha256.Sum256(msg)
	dst.n = sha256.Size
	dst.Key = binary.BigEndian.Uint64(dst.sum[24:32])
}

// sumXXH3 stores XXH3-128 (seed 0) in Python's canonical byte order,
// high half first, so the event key (last 8 bytes) is the low half.
func sumXXH3(dst *Hash, msg []byte) {
	u := xxh3.Hash128(msg)
	dst.sum = [32]byte{}
	binary.BigEndian.PutUint64(dst.sum[0:8], u.Hi)
	binary.BigEndian.PutUint64(dst.sum[8:16], u.Lo)
	dst.n = 16
	dst.Key = u.Lo
}

// sumSGLang is SHA-256 whose event key is the first 8 bytes, read as a
// signed int64 (kept here as its uint64 bit pattern).
func sumSGLang(dst *Hash, msg []byte) {
	dst.sum = sha256.Sum256(msg)
	dst.n = sha256.Size
	dst.Key = binary.BigEndian.Uint64(dst.sum[0:8])
}

// KeyOfDigest returns the 64-bit event key of a digest as the engine would
// report it: the last 8 bytes big-endian (left-padded when shorter), or
// for SGLang the first 8. Hybrid-model group hashes, which concatenate
// several digests, map to the key of their last constituent.
func KeyOfDigest(algo Algo, d []byte) uint64 {
	var tail [8]byte
	if algo == SGLang {
		copy(tail[:], d)
		return binary.BigEndian.Uint64(tail[:])
	}
	if len(d) >= 8 {
		return binary.BigEndian.Uint64(d[len(d)-8:])
	}
	copy(tail[8-len(d):], d)
	return binary.BigEndian.Uint64(tail[:])
}
