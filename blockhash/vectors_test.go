package blockhash_test

import (
	"encoding/hex"
	"encoding/json"
	"maps"
	"os"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/blockhash"
)

// vllmVectors mirrors testdata/vllm_vectors.json, which
// testdata/gen_vllm_vectors.py computes with the libraries vLLM uses
// (cbor2, pickle, hashlib, xxhash).
type vllmVectors struct {
	NoneHash map[string]map[string]struct {
		Hex string `json:"hex"`
	} `json:"none_hash"`
	Vectors  map[string]map[string]map[string]scenario `json:"vectors"`
	VLLMTest map[string]string                         `json:"vllm_test_hash_block_tokens"`
	HMA      struct {
		MergedHex string `json:"merged_hex"`
		EventInt  uint64 `json:"event_int"`
	} `json:"hma_concat_example"`
}

type scenario struct {
	Tokens []uint64 `json:"tokens"`
	Spec   struct {
		LoRAName  string `json:"lora_name"`
		CacheSalt string `json:"cache_salt"`
		MMLegacy  bool   `json:"mm_legacy_no_offset"`
		MM        []struct {
			Identifier string `json:"identifier"`
			Offset     int    `json:"offset"`
			Length     int    `json:"length"`
		} `json:"mm"`
		PromptEmbeds []struct {
			Start int    `json:"start"`
			Hex   string `json:"sha256_hex"`
		} `json:"prompt_embeds_digests"`
	} `json:"spec"`
	Blocks []struct {
		Index     int             `json:"index"`
		ParentHex string          `json:"parent_hex"`
		HashHex   string          `json:"hash_hex"`
		EventInt  uint64          `json:"event_int"`
		ExtraKeys json.RawMessage `json:"extra_keys"`
		CBORHex   string          `json:"hash_input_cbor_hex"`
	} `json:"blocks"`
}

func loadVectors(t testing.TB) vllmVectors {
	t.Helper()
	raw, err := os.ReadFile("testdata/vllm_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v vllmVectors
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Vectors) != 4 {
		t.Fatalf("want 4 algorithms in the vectors, got %d", len(v.Vectors))
	}
	return v
}

func (s scenario) extras(t testing.TB, blockSize int) *blockhash.Extras {
	x := &blockhash.Extras{LoRAName: s.Spec.LoRAName, CacheSalt: s.Spec.CacheSalt, LegacyMM: s.Spec.MMLegacy}
	for _, m := range s.Spec.MM {
		x.MM = append(x.MM, blockhash.MMItem{Identifier: m.Identifier, Offset: m.Offset, Length: m.Length})
	}
	for _, e := range s.Spec.PromptEmbeds {
		d, err := hex.DecodeString(e.Hex)
		if err != nil {
			t.Fatal(err)
		}
		blk := e.Start / blockSize
		for len(x.PromptEmbeds) <= blk {
			x.PromptEmbeds = append(x.PromptEmbeds, nil)
		}
		x.PromptEmbeds[blk] = d
	}
	return x
}

func TestNoneHashGolden(t *testing.T) {
	v := loadVectors(t)
	for _, algo := range slices.Sorted(maps.Keys(v.NoneHash)) {
		for _, seed := range slices.Sorted(maps.Keys(v.NoneHash[algo])) {
			want := v.NoneHash[algo][seed].Hex
			t.Run(algo+"/"+seed, func(t *testing.T) {
				h, err := blockhash.New(blockhash.Config{Algo: blockhash.Algo(algo), Seed: seed, BlockSize: 16})
				if err != nil {
					t.Fatal(err)
				}
				if got := h.NoneHash(); got.Hex() != want {
					t.Errorf("NONE_HASH = %s, want %s", got.Hex(), want)
				}
			})
		}
	}
}

// TestChainGolden runs every scenario x seed x algorithm of the vectors
// through the one-shot chain, block-by-block extension and Block.
func TestChainGolden(t *testing.T) {
	v := loadVectors(t)
	n := 0
	for _, algo := range slices.Sorted(maps.Keys(v.Vectors)) {
		for _, seed := range slices.Sorted(maps.Keys(v.Vectors[algo])) {
			for _, name := range slices.Sorted(maps.Keys(v.Vectors[algo][seed])) {
				sc := v.Vectors[algo][seed][name]
				n++
				t.Run(algo+"/"+seed+"/"+name, func(t *testing.T) {
					h := blockhash.MustNew(blockhash.Config{Algo: blockhash.Algo(algo), Seed: seed, BlockSize: 16})
					x := sc.extras(t, 16)
					got, err := h.Chain(nil, nil, 0, sc.Tokens, x)
					if err != nil {
						t.Fatal(err)
					}
					if len(got) != len(sc.Blocks) {
						t.Fatalf("%d blocks, want %d (only full blocks are hashed)", len(got), len(sc.Blocks))
					}
					for i, b := range sc.Blocks {
						if got[i].Hex() != b.HashHex || got[i].Key != b.EventInt {
							t.Errorf("block %d = %s, want %d %s", i, got[i], b.EventInt, b.HashHex)
						}
					}
					// Extending one block at a time from each parent gives the same chain.
					var parent *blockhash.Hash
					for i, b := range sc.Blocks {
						if parent != nil && parent.Hex() != b.ParentHex {
							t.Fatalf("block %d parent %s, want %s", i, parent.Hex(), b.ParentHex)
						}
						one, err := h.Chain(nil, parent, i, sc.Tokens[i*16:(i+1)*16], x)
						if err != nil || len(one) != 1 || one[0].Hex() != b.HashHex {
							t.Fatalf("block %d extended from its parent = %v, %v; want %s", i, one, err, b.HashHex)
						}
						parent = &one[0]
					}
				})
			}
		}
	}
	if n != 4*3*9 {
		t.Fatalf("ran %d vectors, want 108", n)
	}
}

// TestChainKeysGolden feeds the per-block extra keys exactly as the vectors
// record them (the shape KV events carry) to ChainKeys.
func TestChainKeysGolden(t *testing.T) {
	v := loadVectors(t)
	for _, algo := range slices.Sorted(maps.Keys(v.Vectors)) {
		for _, name := range slices.Sorted(maps.Keys(v.Vectors[algo]["42"])) {
			sc := v.Vectors[algo]["42"][name]
			t.Run(algo+"/"+name, func(t *testing.T) {
				h := blockhash.MustNew(blockhash.Config{Algo: blockhash.Algo(algo), Seed: "42", BlockSize: 16})
				keys := make([]blockhash.BlockExtra, len(sc.Blocks))
				for i, b := range sc.Blocks {
					keys[i] = jsonExtra(t, b.ExtraKeys)
				}
				got, err := h.ChainKeys(nil, nil, sc.Tokens, keys)
				if err != nil {
					t.Fatal(err)
				}
				for i, b := range sc.Blocks {
					if got[i].Key != b.EventInt {
						t.Errorf("block %d key %d, want %d", i, got[i].Key, b.EventInt)
					}
				}
			})
		}
	}
}

// jsonExtra converts the vectors' JSON form of extra keys (null, lists for
// tuples, {"$bytes": hex}) to a BlockExtra.
func jsonExtra(t testing.TB, raw json.RawMessage) blockhash.BlockExtra {
	t.Helper()
	var x any
	if err := json.Unmarshal(raw, &x); err != nil {
		t.Fatal(err)
	}
	if x == nil {
		return nil
	}
	return blockhash.BlockExtra(jsonValue(t, x).Tuple)
}

func jsonValue(t testing.TB, x any) blockhash.Value {
	switch v := x.(type) {
	case string:
		return blockhash.Str(v)
	case float64:
		return blockhash.Int(int64(v))
	case []any:
		vs := make([]blockhash.Value, len(v))
		for i, e := range v {
			vs[i] = jsonValue(t, e)
		}
		return blockhash.Tuple(vs...)
	case map[string]any:
		b, err := hex.DecodeString(v["$bytes"].(string))
		if err != nil {
			t.Fatal(err)
		}
		return blockhash.Bytes(b)
	}
	t.Fatalf("unexpected JSON extra key %T", x)
	return blockhash.Value{}
}

// TestVLLMUnitTestInput hashes the input of vLLM's own test_hash_block_tokens:
// (b"123", (1, 2, 3), ("key1", "key2")).
func TestVLLMUnitTestInput(t *testing.T) {
	v := loadVectors(t)
	for _, algo := range []string{"sha256_cbor", "xxhash_cbor", "sha256", "xxhash"} {
		h := blockhash.MustNew(blockhash.Config{Algo: blockhash.Algo(algo), Seed: "0", BlockSize: 3})
		parent, err := h.HashFromDigest([]byte("123"))
		if err != nil {
			t.Fatal(err)
		}
		got, err := h.Block(&parent, []uint64{1, 2, 3}, blockhash.BlockExtra{blockhash.Str("key1"), blockhash.Str("key2")})
		if err != nil {
			t.Fatal(err)
		}
		if got.Hex() != v.VLLMTest[algo] {
			t.Errorf("%s: %s, want %s", algo, got.Hex(), v.VLLMTest[algo])
		}
	}
}

// TestHMAConcatKey checks that a hybrid-model group hash (the concatenation
// of its constituent digests) maps to the key of its last constituent.
func TestHMAConcatKey(t *testing.T) {
	v := loadVectors(t)
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 16})
	merged, _ := hex.DecodeString(v.HMA.MergedHex)
	if got := blockhash.KeyOfDigest(h.Config().Algo, merged); got != v.HMA.EventInt {
		t.Errorf("key of merged digest = %d, want %d", got, v.HMA.EventInt)
	}
}

// TestSGLang checks SGLang's page hashes for tokens 1..48, page 16, against
// the values SGLang's hash_str_to_int64 gives (pinned by third parties).
func TestSGLang(t *testing.T) {
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SGLang, BlockSize: 16})
	toks := make([]uint64, 48)
	for i := range toks {
		toks[i] = uint64(i + 1)
	}
	got, err := h.Chain(nil, nil, 0, toks, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []int64{8635429971592222890, 1256577331724852459, 5689809685380680247}
	for i, w := range want {
		if int64(got[i].Key) != w {
			t.Errorf("page %d = %d, want %d", i, int64(got[i].Key), w)
		}
	}
	if _, err := h.Chain(nil, nil, 0, toks, &blockhash.Extras{LoRAName: "a"}); err == nil {
		t.Error("SGLang with extra keys: want an error")
	}
	if _, err := h.Chain(nil, nil, 0, append(toks[:15:15], 1<<32), nil); err == nil {
		t.Error("SGLang with a token id >= 2^32: want an error")
	}
}
