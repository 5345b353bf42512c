package gateway

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"unsafe"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/zeebo/xxh3"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/blockhash"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DefaultHashMemoEntries sizes the picker's chain memo (Config.HashMemoEntries):
// segments of at most hashMemoCheckpoint blocks' keys (about 300 bytes
// each at most, and one per turn besides), so the memo stays within a
// few MiB.
const DefaultHashMemoEntries = 8192

// The chain memo stores a prompt's keys as segments: one at every
// hashMemoCheckpoint blocks and one at the prompt's end, each pointing to
// the segment before it, so that the turns of a conversation share their
// common keys. A prompt finds the longest prefix the memo knows by
// probing the fingerprints of its own prefixes: every block boundary of
// its last hashMemoProbeTail blocks (where the previous turn ended), then
// every checkpoint.
const (
	hashMemoCheckpoint = 32
	hashMemoProbeTail  = 64
)

// hashing is how the picker hashes prompts into the index's block keys:
// the index's hashing as GetHashConfig reported it, and the memo of
// chains hashed with it. It is replaced whole when the index's hashing is
// learnt again, so a memo never outlives its hashing.
type hashing struct {
	h      *blockhash.Hasher
	digest uint64
	memo   *lru.Cache[fpKey, *chainSeg]
	m      *metrics
	pool   sync.Pool // *hashScratch
}

type fpKey struct{ a, b uint64 }

// chainSeg holds the keys of blocks [end-len(keys), end) of a prompt,
// after parent's; last is the full hash of block end-1, which the next
// block chains from.
type chainSeg struct {
	parent *chainSeg
	end    int
	keys   []uint64
	last   blockhash.Hash
}

type hashScratch struct {
	fps    []fpKey
	hashes []blockhash.Hash
	buf    []byte
}

func newHashing(h *blockhash.Hasher, digest uint64, entries int, m *metrics) *hashing {
	if entries <= 0 {
		entries = DefaultHashMemoEntries
	}
	c, _ := lru.New[fpKey, *chainSeg](entries)
	hs := &hashing{h: h, digest: digest, memo: c, m: m}
	hs.pool.New = func() any { return new(hashScratch) }
	return hs
}

// extrasOf is the hash-affecting inputs of p the picker can hash itself:
// LoRA name and cache salt. ok is false for a prompt with multimodal
// items, which the index hashes from the ids.
func extrasOf(p *kvindexv1.Prompt) (x *blockhash.Extras, ok bool) {
	if len(p.GetMmItems()) > 0 {
		return nil, false
	}
	if p.GetLoraName() == "" && p.GetCacheSalt() == "" {
		return nil, true
	}
	return &blockhash.Extras{LoRAName: p.GetLoraName(), CacheSalt: p.GetCacheSalt()}, true
}

// keys returns the block keys of ids' full blocks under x, as the index
// computes them (blockhash's chain), hashing only the blocks after the
// longest prefix the memo knows, and memoizes what it hashed.
func (hs *hashing) keys(ids []uint64, x *blockhash.Extras) ([]uint64, error) {
	bs := hs.h.BlockSize()
	n := len(ids) / bs
	if n == 0 {
		return nil, nil
	}
	sc := hs.pool.Get().(*hashScratch)
	defer hs.pool.Put(sc)
	var seed fpKey
	seed, sc.buf = extrasFingerprint(x, sc.buf)
	tb := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(ids))), n*bs*8)
	sc.fps = append(sc.fps[:0], seed)
	for b := 1; b <= n; b++ {
		sc.fps = append(sc.fps, fpNext(sc.fps[b-1], tb[(b-1)*bs*8:b*bs*8]))
	}
	// The longest known prefix: the last blocks' boundaries, then the
	// checkpoints below them.
	var seg *chainSeg
	for b := n; b >= 1 && seg == nil; {
		if s, ok := hs.memo.Get(sc.fps[b]); ok && s.end == b {
			seg = s
			break
		}
		if b > n-hashMemoProbeTail+1 {
			b--
		} else {
			b = (b - 1) / hashMemoCheckpoint * hashMemoCheckpoint
		}
	}
	keys := make([]uint64, n)
	have := 0
	var parent *blockhash.Hash
	if seg != nil {
		have, parent = seg.end, &seg.last
		for s := seg; s != nil; s = s.parent {
			copy(keys[s.end-len(s.keys):s.end], s.keys)
		}
		hs.m.hashMemo.WithLabelValues("hit").Inc()
	} else {
		hs.m.hashMemo.WithLabelValues("miss").Inc()
	}
	hs.m.hashBlocks.WithLabelValues("memo").Add(float64(have))
	if have == n {
		return keys, nil
	}
	var err error
	sc.hashes, err = hs.h.Chain(sc.hashes[:0], parent, have, ids[have*bs:n*bs], x)
	if err != nil {
		return nil, err
	}
	hs.m.hashBlocks.WithLabelValues("hashed").Add(float64(n - have))
	for i := range sc.hashes {
		keys[have+i] = sc.hashes[i].Key
	}
	// Memoize the new blocks: a segment at each checkpoint and at the end,
	// sharing one copy of the new keys (the answer's array goes to the
	// caller, and a segment must not keep all of it alive).
	fresh := slices.Clone(keys[have:n])
	prev := have
	for b := have + 1; b <= n; b++ {
		if b%hashMemoCheckpoint != 0 && b != n {
			continue
		}
		seg = &chainSeg{parent: seg, end: b, keys: fresh[prev-have : b-have : b-have], last: sc.hashes[b-1-have]}
		hs.memo.Add(sc.fps[b], seg)
		prev = b
	}
	return keys, nil
}

// extrasFingerprint is the chain fingerprints' start: every input of x
// the keys depend on besides the tokens, so that prompts differing only
// in them never share segments. buf is scratch.
func extrasFingerprint(x *blockhash.Extras, buf []byte) (fpKey, []byte) {
	b := buf[:0]
	if x != nil {
		b = binary.AppendUvarint(b, uint64(len(x.LoRAName)))
		b = append(b, x.LoRAName...)
		b = binary.AppendUvarint(b, uint64(len(x.CacheSalt)))
		b = append(b, x.CacheSalt...)
	}
	u := xxh3.Hash128(b)
	return fpKey{u.Lo, u.Hi}, b
}

// fpNext extends a prefix fingerprint by one block's tokens: 128 bits,
// so that two different prefixes share one with probability about
// 2^-128 (inputs are not adversarial here: a collision would only
// misroute the colliding request itself).
func fpNext(st fpKey, block []byte) fpKey {
	u := xxh3.Hash128(block)
	mix := func(x, y uint64) uint64 {
		hi, lo := bits.Mul64(x, y)
		return hi ^ lo
	}
	return fpKey{
		a: mix(st.a^u.Lo^0xa0761d6478bd642f, st.b^u.Hi^0xe7037ed1a0b428db),
		b: mix(st.b^u.Lo^0x8ebc6af09c88c6e3, st.a^u.Hi^0x589965cc75374cc3),
	}
}

// What a query's prompt was sent as (kvindex_picker_index_queries_total).
const (
	inputHashes   = "hashes"
	inputTokens   = "tokens"
	inputText     = "text"
	inputMessages = "messages"
)

func inputOf(p *kvindexv1.Prompt) string {
	switch p.GetInput().(type) {
	case *kvindexv1.Prompt_Tokens:
		return inputTokens
	case *kvindexv1.Prompt_Text:
		return inputText
	case *kvindexv1.Prompt_Messages:
		return inputMessages
	}
	return inputHashes
}

// hashedPrompt is r's prompt as the block keys the picker computes,
// when it can: r has token ids, the index's hashing is known, and the
// prompt has no multimodal items. Otherwise it returns nil (the ids or
// text are sent as they are). hs is the hashing used.
func (s *Service) hashedPrompt(r *Request) (hs *hashing, p *kvindexv1.Prompt) {
	hs = s.hash.Load()
	if hs == nil || r.Tokens == nil {
		return nil, nil
	}
	x, ok := extrasOf(r.Prompt)
	if !ok {
		return nil, nil
	}
	keys, err := hs.keys(r.Tokens, x)
	if err != nil {
		// An input the hashing cannot take (SGLang's with a LoRA name):
		// the index says so itself, for the ids.
		s.log.Debug("picker: hashing the prompt failed; sending token ids", "err", err)
		return nil, nil
	}
	return hs, &kvindexv1.Prompt{Input: &kvindexv1.Prompt_BlockHashes{BlockHashes: &kvindexv1.BlockHashes{Hashes: keys, ConfigDigest: hs.digest}}}
}

// hashConfigSource is an index in the same process that says how it
// hashes (*server.Server).
type hashConfigSource interface {
	GetHashConfig(context.Context, *kvindexv1.GetHashConfigRequest) (*kvindexv1.HashConfig, error)
}

// learnHashing asks the index how it hashes (GetHashConfig, through ask),
// at each warm-up of its connection (an index in the same process: at
// Warm), and hashes prompts itself from then on if its own hashing of the
// same configuration has the same digest: the turns of a conversation
// then share their keys in the chain memo, and the index walks keys
// without hashing. An index that does not say (an older kvindex) or says
// something the picker would hash otherwise is asked by token ids; the
// latter is logged as an error, for it means two builds that disagree on
// hashing. index names the index in logs.
func (s *Service) learnHashing(ctx context.Context, index string, ask func(context.Context) (*kvindexv1.HashConfig, error)) {
	s.hash.Store(nil)
	resp, err := ask(ctx)
	if status.Code(err) == codes.Unimplemented {
		s.m.hashConfig.WithLabelValues("unknown").Inc()
		s.log.Info("picker: the index does not say how it hashes; queries send token ids", "index", index, "reason", status.Convert(err).Message())
		return
	}
	if err != nil {
		s.m.hashConfig.WithLabelValues("error").Inc()
		s.log.Warn("picker: asking the index how it hashes failed; queries send token ids until the next reconnect", "index", index, "err", err)
		return
	}
	cfg := blockhash.Config{Algo: blockhash.Algo(resp.GetAlgo()), Seed: resp.GetSeed(), BlockSize: int(resp.GetBlockSize())}
	h, err := blockhash.New(cfg)
	var mine uint64
	if err == nil {
		mine = h.Digest()
	}
	if err != nil || mine != resp.GetDigest() {
		s.m.hashConfig.WithLabelValues("mismatch").Inc()
		s.log.Error("picker: this picker would hash prompts otherwise than its index (a different kvindex build?); queries send token ids",
			"index", index, "algo", cfg.Algo, "seed", cfg.Seed, "block_size", cfg.BlockSize,
			"index_digest", fmt.Sprintf("%x", resp.GetDigest()), "picker_digest", fmt.Sprintf("%x", mine), "err", err)
		return
	}
	s.m.hashConfig.WithLabelValues("ok").Inc()
	s.hash.Store(newHashing(h, mine, s.cfg.HashMemoEntries, s.m))
	s.log.Debug("picker: hashing prompts as the index does", "algo", cfg.Algo, "block_size", cfg.BlockSize, "digest", fmt.Sprintf("%x", mine))
}

// dropHashing stops hashing with hs after the index refused its keys
// (err), logging it once.
func (s *Service) dropHashing(hs *hashing, err error) {
	if !s.hash.CompareAndSwap(hs, nil) {
		return
	}
	s.m.hashConfig.WithLabelValues("mismatch").Inc()
	s.log.Error("picker: the index refused the block keys this picker computed; queries send token ids until it is asked again (next reconnect)",
		"digest", fmt.Sprintf("%x", hs.digest), "err", status.Convert(err).Message())
}
