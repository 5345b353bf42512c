package doctor

import (
	"bytes"
	"slices"
	"strconv"
	"strings"

	"github.com/kvindex/kvindex/blockhash"
)

// Sample is one BlockStored event as the engine sent it.
type Sample struct {
	Hashes       []uint64 // 64-bit block keys, in chain order
	Digests      [][]byte // full digests, one per key; nil unless the engine sent them
	HasParent    bool     // false: Hashes[0] is block 0 of its sequence
	Parent       uint64   // key of the block before Hashes[0]
	ParentDigest []byte   // its full digest, when the engine sent digests
	Tokens       []uint64 // BlockSize tokens per hash
	BlockSize    int      // as the engine reported it
	LoRAName     string
	// ExtraKeys has one entry per hash (nil entry: None); nil when the
	// event carried none (only LoRAName is known then).
	ExtraKeys []blockhash.BlockExtra
}

// Extras says which extra keys a candidate hashes each block with.
type Extras string

// The extra-key variants searched.
const (
	// ExtrasReported: the event's extra keys, or when it carried none its
	// LoRA name on every block (as kvindex's verification does).
	ExtrasReported Extras = "reported"
	// ExtrasNone: None on every block (no LoRA, salt or multimodal keys).
	ExtrasNone Extras = "none"
)

// Grid is the space of configurations Search tries.
type Grid struct {
	Algos      []blockhash.Algo
	Seeds      []string // ignored by SGLang's scheme, which has none
	BlockSizes []int    // only those dividing the events' block size apply
}

// DefaultSeeds are the NONE_HASH seeds engines most likely run with:
// vLLM's own when PYTHONHASHSEED is unset (sha256 and sha256_cbor since
// August 2026), and the PYTHONHASHSEED values deployments commonly set.
var DefaultSeeds = []string{blockhash.DefaultSeed, "0", "42"}

// DefaultBlockSizes are the KV-cache block sizes engines commonly run.
var DefaultBlockSizes = []int{16, 32, 64, 128}

// NewGrid returns the grid kvindex doctor searches: every algorithm, the
// configured seed, the extra seeds, then DefaultSeeds; the configured
// block size, then DefaultBlockSizes (each value once, in that order).
func NewGrid(configured blockhash.Config, seeds []string) Grid {
	g := Grid{Algos: slices.Clone(blockhash.Algos)}
	g.Seeds = uniq(append(append([]string{configured.Seed}, seeds...), DefaultSeeds...))
	g.BlockSizes = uniq(append([]int{configured.BlockSize}, DefaultBlockSizes...))
	return g
}

// GridHelp describes NewGrid's candidates for a help text: one line
// each, indented by two spaces.
func GridHelp() string {
	bs := make([]string, len(DefaultBlockSizes))
	for i, n := range DefaultBlockSizes {
		bs[i] = strconv.Itoa(n)
	}
	return "  algorithms: every --hash-algo\n" +
		"  seeds: kvindex's, each --seed, " + strings.Join(DefaultSeeds, ", ") + "\n" +
		"  block sizes: kvindex's, " + strings.Join(bs, ", ") + " (those dividing the engine's)\n" +
		"  extra keys: the events' (LoRA, salt, multimodal), and none"
}

func uniq[T comparable](in []T) []T {
	var out []T
	for _, v := range in {
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// Outcome is what Search concluded.
type Outcome string

// Search outcomes.
const (
	// Found: Diagnosis.Config reproduces every checked block.
	Found Outcome = "found"
	// RandomSeed: no seed reproduces the first block of a sequence, but
	// the blocks chained from a parent digest the engine reported do
	// reproduce under Diagnosis.Config's algorithm and block size: the
	// engine's NONE_HASH is random.
	RandomSeed Outcome = "random_seed"
	// NotFound: no candidate reproduces the blocks.
	NotFound Outcome = "not_found"
	// NoSamples: no sample could be checked (none kept, or none whose
	// chain starts at a known digest).
	NoSamples Outcome = "no_samples"
)

// Diagnosis is Search's answer.
type Diagnosis struct {
	Outcome Outcome
	// Config is the engine's configuration (Found); for RandomSeed its
	// algorithm and block size, the seed being unknowable.
	Config blockhash.Config
	Extras Extras // the extra keys Config hashes with (Found, RandomSeed)
	Blocks int    // blocks reproduced (Found, RandomSeed)
	Tried  int    // candidates tried
	// Digests: some sample carried full digests. Without them a random
	// seed cannot be told from a configuration outside the grid.
	Digests bool
}

// Search tries the candidates of g, the events' own block size first,
// and returns the first that reproduces every block of samples it can
// check (a block can be checked when its chain starts at NONE_HASH, at a
// reported parent digest, or at a block an earlier sample reproduced). It
// stops at the first mismatching block of each candidate, so a grid of
// wrong candidates costs about one block hash each. BenchmarkSearchGrid
// measures the full grid.
func Search(samples []Sample, g Grid) Diagnosis {
	d := Diagnosis{Outcome: NoSamples}
	if len(samples) == 0 {
		return d
	}
	for _, s := range samples {
		d.Digests = d.Digests || s.Digests != nil
	}
	var c checker
	anyChecked := false
	for _, bs := range blockSizeOrder(samples[0].BlockSize, g.BlockSizes) {
		for _, algo := range g.Algos {
			seeds := g.Seeds
			if algo == blockhash.SGLang {
				seeds = []string{""}
			}
			for _, seed := range seeds {
				h, err := blockhash.New(blockhash.Config{Algo: algo, Seed: seed, BlockSize: bs})
				if err != nil {
					continue
				}
				for _, x := range extrasOrder(samples) {
					d.Tried++
					n, ok := c.reproduce(h, x, samples)
					anyChecked = anyChecked || n > 0 || !ok
					if ok && n > 0 {
						d.Outcome, d.Config, d.Extras, d.Blocks = Found, h.Config(), x, n
						return d
					}
				}
			}
		}
	}
	if !anyChecked {
		return d
	}
	d.Outcome = NotFound
	for _, bs := range blockSizeOrder(samples[0].BlockSize, g.BlockSizes) {
		for _, algo := range g.Algos {
			h, err := blockhash.New(blockhash.Config{Algo: algo, Seed: blockhash.DefaultSeed, BlockSize: bs})
			if err != nil {
				continue
			}
			for _, x := range extrasOrder(samples) {
				d.Tried++
				if n, ok := c.chained(h, x, samples); ok {
					d.Outcome, d.Config, d.Extras, d.Blocks = RandomSeed, blockhash.Config{Algo: algo, BlockSize: bs}, x, n
					return d
				}
			}
		}
	}
	return d
}

// blockSizeOrder is the engine's block size first, then the grid's that
// divide it (an engine may hash at a finer block size than it stores,
// each stored block reporting its last hash).
func blockSizeOrder(engine int, grid []int) []int {
	out := []int{engine}
	for _, bs := range grid {
		if bs > 0 && engine%bs == 0 && !slices.Contains(out, bs) {
			out = append(out, bs)
		}
	}
	return out
}

// extrasOrder is the variants worth trying: one when the samples carry no
// extra keys at all (the variants coincide).
func extrasOrder(samples []Sample) []Extras {
	for _, s := range samples {
		if s.LoRAName != "" || slices.ContainsFunc(s.ExtraKeys, func(x blockhash.BlockExtra) bool { return x != nil }) {
			return []Extras{ExtrasReported, ExtrasNone}
		}
	}
	return []Extras{ExtrasReported}
}

// checker holds the scratch space of one Search.
type checker struct {
	known  map[uint64]blockhash.Hash // key -> digest, of blocks reproduced so far
	hashes []blockhash.Hash
	keys   []blockhash.BlockExtra
}

// reproduce reports how many blocks of samples h reproduces with extra
// keys x, and false at the first block it does not. Samples whose chain
// starts at an unknown digest are skipped.
func (c *checker) reproduce(h *blockhash.Hasher, x Extras, samples []Sample) (int, bool) {
	if c.known == nil {
		c.known = make(map[uint64]blockhash.Hash)
	}
	clear(c.known)
	bs := h.BlockSize()
	n := 0
	for i := range samples {
		s := &samples[i]
		if !s.valid() || s.BlockSize%bs != 0 {
			return n, false
		}
		var parent *blockhash.Hash
		switch {
		case !s.HasParent:
		case len(s.ParentDigest) > 0:
			p, err := h.HashFromDigest(s.ParentDigest)
			if err != nil {
				continue
			}
			parent = &p
		default:
			p, ok := c.known[s.Parent]
			if !ok {
				continue
			}
			parent = &p
		}
		r := s.BlockSize / bs
		var err error
		c.hashes, err = h.ChainKeys(c.hashes[:0], parent, s.Tokens, c.blockKeys(s, x, r))
		if err != nil || len(c.hashes) != len(s.Hashes)*r {
			return n, false
		}
		for j, key := range s.Hashes {
			got := c.hashes[(j+1)*r-1]
			if !same(&got, key, s.digest(j)) {
				return n, false
			}
			c.known[key] = got
			n++
		}
	}
	return n, true
}

// chained checks only the blocks whose parent digest the engine reported
// (block 0 after a ParentDigest, block j after Digests[j-1]), which no
// seed enters: they reproduce under the right algorithm and block size
// even when NONE_HASH is random. It needs at least one such block.
func (c *checker) chained(h *blockhash.Hasher, x Extras, samples []Sample) (int, bool) {
	bs := h.BlockSize()
	n := 0
	for i := range samples {
		s := &samples[i]
		if !s.valid() || s.BlockSize != bs {
			return n, false
		}
		keys := c.blockKeys(s, x, 1)
		for j, key := range s.Hashes {
			var pd []byte
			switch {
			case j > 0 && s.Digests != nil:
				pd = s.Digests[j-1]
			case j == 0 && len(s.ParentDigest) > 0:
				pd = s.ParentDigest
			default:
				continue
			}
			p, err := h.HashFromDigest(pd)
			if err != nil {
				return n, false
			}
			var extra blockhash.BlockExtra
			if j < len(keys) {
				extra = keys[j]
			}
			got, err := h.Block(&p, s.Tokens[j*bs:(j+1)*bs], extra)
			if err != nil || !same(&got, key, s.digest(j)) {
				return n, false
			}
			n++
		}
	}
	return n, n > 0
}

// same reports whether a computed hash is the engine's: its key, and its
// digest when the engine sent one of the same length (a hybrid model's
// concatenated group digests are longer; their key still has to match).
func same(got *blockhash.Hash, key uint64, digest []byte) bool {
	if got.Key != key {
		return false
	}
	return digest == nil || len(digest) != len(got.Digest()) || bytes.Equal(digest, got.Digest())
}

// blockKeys returns the extra keys of each of the len(s.Hashes)*r blocks
// hashed at the candidate's block size (r of them per engine block, each
// given its engine block's keys); nil means None throughout.
func (c *checker) blockKeys(s *Sample, x Extras, r int) []blockhash.BlockExtra {
	if x == ExtrasNone {
		return nil
	}
	if s.ExtraKeys == nil && s.LoRAName == "" {
		return nil
	}
	c.keys = c.keys[:0]
	for j := range s.Hashes {
		var k blockhash.BlockExtra
		switch {
		case s.ExtraKeys != nil:
			k = s.ExtraKeys[j]
		default:
			k = blockhash.BlockExtra{blockhash.Str(s.LoRAName)}
		}
		for range r {
			c.keys = append(c.keys, k)
		}
	}
	return c.keys
}

// valid reports whether the sample's lengths agree (Decode checks them;
// Search is also given samples built elsewhere).
func (s *Sample) valid() bool {
	n := len(s.Hashes)
	return n > 0 && s.BlockSize > 0 && s.BlockSize <= blockhash.MaxBlockSize && len(s.Tokens) == n*s.BlockSize &&
		(s.Digests == nil || len(s.Digests) == n) && (s.ExtraKeys == nil || len(s.ExtraKeys) == n)
}

// digest returns the engine's digest of block j, or nil.
func (s *Sample) digest(j int) []byte {
	if s.Digests == nil {
		return nil
	}
	return s.Digests[j]
}
