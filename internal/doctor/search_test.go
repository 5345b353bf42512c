package doctor

import (
	"fmt"
	"testing"

	"github.com/kvindex/kvindex/blockhash"
)

// engine describes a simulated engine's hashing and what its events carry.
type engine struct {
	cfg     blockhash.Config
	hashBS  int    // the block size it hashes at (0: cfg.BlockSize); cfg.BlockSize is what it reports
	lora    string // LoRA name on every block
	salt    string // cache salt on each sequence's first block
	digests bool   // sends full digests (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)
	noKeys  bool   // sends no extra_keys field (older vLLM): only the LoRA name
}

// samples returns the BlockStored events the engine sends for two
// sequences: the first stored in two events (the second naming its parent
// by key, and by digest when the engine sends digests), the second in one.
func (e engine) samples(t testing.TB) []Sample {
	t.Helper()
	hbs := e.hashBS
	if hbs == 0 {
		hbs = e.cfg.BlockSize
	}
	h, err := blockhash.New(blockhash.Config{Algo: e.cfg.Algo, Seed: e.cfg.Seed, BlockSize: hbs})
	if err != nil {
		t.Fatal(err)
	}
	r := e.cfg.BlockSize / hbs
	var out []Sample
	for seq, blocks := range [][]int{{3, 2}, {2}} {
		var parent *blockhash.Hash
		start := 0
		for _, n := range blocks {
			tokens := make([]uint64, n*e.cfg.BlockSize)
			for i := range tokens {
				tokens[i] = uint64(1000*seq + (start*e.cfg.BlockSize+i)*7 + 3)
			}
			keys := make([]blockhash.BlockExtra, n)
			for i := range keys {
				var k blockhash.BlockExtra
				if e.lora != "" {
					k = append(k, blockhash.Str(e.lora))
				}
				if e.salt != "" && start+i == 0 {
					k = append(k, blockhash.Str(e.salt))
				}
				keys[i] = k
			}
			sub := make([]blockhash.BlockExtra, 0, n*r)
			for _, k := range keys {
				for range r {
					sub = append(sub, k)
				}
			}
			hs, err := h.ChainKeys(nil, parent, tokens, sub)
			if err != nil {
				t.Fatal(err)
			}
			s := Sample{Tokens: tokens, BlockSize: e.cfg.BlockSize, LoRAName: e.lora}
			if !e.noKeys {
				s.ExtraKeys = keys
			}
			if parent != nil {
				s.HasParent, s.Parent = true, parent.Key
				if e.digests {
					s.ParentDigest = parent.Digest()
				}
			}
			for i := range n {
				last := hs[(i+1)*r-1]
				s.Hashes = append(s.Hashes, last.Key)
				if e.digests {
					s.Digests = append(s.Digests, last.Digest())
				}
			}
			out = append(out, s)
			parent = &hs[len(hs)-1]
			start += n
		}
	}
	return out
}

// kvindex's configuration in the tests: none of the engines' below.
var configured = blockhash.Config{Algo: blockhash.SHA256Pickle, Seed: "7", BlockSize: 16}

func TestSearchFindsConfiguration(t *testing.T) {
	type tc struct {
		name   string
		e      engine
		seeds  []string
		want   blockhash.Config
		extras Extras
	}
	var cases []tc
	for _, algo := range blockhash.Algos {
		for _, seed := range []string{"0", "42", blockhash.DefaultSeed} {
			if algo == blockhash.SGLang && seed != "0" {
				continue
			}
			for _, bs := range DefaultBlockSizes {
				for _, digests := range []bool{false, true} {
					e := engine{cfg: blockhash.Config{Algo: algo, Seed: seed, BlockSize: bs}, digests: digests}
					want := e.cfg
					if algo == blockhash.SGLang {
						want.Seed = "" // no seed in SGLang's scheme
					}
					cases = append(cases, tc{fmt.Sprintf("%s/seed=%s/bs=%d/digests=%v", algo, seed, bs, digests), e, nil, want, ExtrasReported})
				}
			}
		}
	}
	cfg := blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "42", BlockSize: 16}
	cases = append(cases,
		tc{"lora and salt keys", engine{cfg: cfg, lora: "sql-lora", salt: "tenant-a"}, nil, cfg, ExtrasReported},
		tc{"lora without extra_keys", engine{cfg: cfg, lora: "sql-lora", noKeys: true}, nil, cfg, ExtrasReported},
		tc{"the configured seed", engine{cfg: blockhash.Config{Algo: blockhash.XXHashCBOR, Seed: "7", BlockSize: 32}}, nil, blockhash.Config{Algo: blockhash.XXHashCBOR, Seed: "7", BlockSize: 32}, ExtrasReported},
		tc{"a --seed candidate", engine{cfg: blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "1234", BlockSize: 16}}, []string{"99", "1234"}, blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "1234", BlockSize: 16}, ExtrasReported},
		tc{"hashes at 16, stores blocks of 64", engine{cfg: blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 64}, hashBS: 16, digests: true}, nil, blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 16}, ExtrasReported},
	)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := Search(c.e.samples(t), NewGrid(configured, c.seeds))
			if d.Outcome != Found || d.Config != c.want || d.Extras != c.extras {
				t.Fatalf("%+v, want found %+v with %s extras", d, c.want, c.extras)
			}
			if want := 7; d.Blocks != want {
				t.Errorf("%d blocks reproduced, want %d", d.Blocks, want)
			}
		})
	}
}

func TestSearchOutcomes(t *testing.T) {
	random := "9f3c2a8e17b64d05a1c3e5f7092b4d6f8a0c2e4f6a8b0c2d4e6f8a0b2c4d6e8f" // a seed nobody configures
	tests := []struct {
		name    string
		samples []Sample
		want    Outcome
		algo    blockhash.Algo
		bs      int
	}{
		{"random seed, digests sent", engine{cfg: blockhash.Config{Algo: blockhash.XXHashCBOR, Seed: random, BlockSize: 32}, digests: true}.samples(t), RandomSeed, blockhash.XXHashCBOR, 32},
		{"random seed, pickle", engine{cfg: blockhash.Config{Algo: blockhash.SHA256Pickle, Seed: random, BlockSize: 16}, digests: true, lora: "l"}.samples(t), RandomSeed, blockhash.SHA256Pickle, 16},
		{"random seed, keys only", engine{cfg: blockhash.Config{Algo: blockhash.XXHashCBOR, Seed: random, BlockSize: 32}}.samples(t), NotFound, "", 0},
		{"no samples", nil, NoSamples, "", 0},
		{"continuations by key only", engine{cfg: blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 16}}.samples(t)[1:2], NoSamples, "", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := Search(tc.samples, NewGrid(configured, nil))
			if d.Outcome != tc.want || d.Config.Algo != tc.algo || d.Config.BlockSize != tc.bs {
				t.Fatalf("%+v, want %s with %s, block size %d", d, tc.want, tc.algo, tc.bs)
			}
		})
	}
}

// A sample whose lengths disagree fails every candidate rather than
// panic.
func TestSearchInvalidSample(t *testing.T) {
	s := engine{cfg: blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 16}}.samples(t)
	s[0].Tokens = s[0].Tokens[:5]
	if d := Search(s, NewGrid(configured, nil)); d.Outcome == Found {
		t.Fatalf("found %+v from a malformed sample", d)
	}
}

// BenchmarkSearchGrid searches the full default grid (two --seed values
// added; an engine block size of 128, so that every grid block size
// applies; extra keys, so both variants) for samples no candidate
// reproduces: every candidate tried, then the random-seed probe, the
// worst case of kvindex doctor per engine. It reports the candidates
// tried.
func BenchmarkSearchGrid(b *testing.B) {
	random := "5d1e0c9b8a7f6e5d4c3b2a190817263544536271809f8e7d6c5b4a3928171605"
	samples := engine{cfg: blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: random, BlockSize: 128}, lora: "l", salt: "s", digests: true}.samples(b)
	g := NewGrid(configured, []string{"1", "2"})
	b.ReportAllocs()
	var d Diagnosis
	for b.Loop() {
		if d = Search(samples, g); d.Outcome != RandomSeed {
			b.Fatal(d)
		}
	}
	b.ReportMetric(float64(d.Tried), "candidates")
}

// BenchmarkSearchFound finds a configuration late in the grid.
func BenchmarkSearchFound(b *testing.B) {
	samples := engine{cfg: blockhash.Config{Algo: blockhash.SGLang, BlockSize: 16}}.samples(b)
	g := NewGrid(configured, nil)
	b.ReportAllocs()
	for b.Loop() {
		if d := Search(samples, g); d.Outcome != Found {
			b.Fatal(d)
		}
	}
}
