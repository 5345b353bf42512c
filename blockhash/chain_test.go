package blockhash_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/kvindex/kvindex/blockhash"
)

func tokensFromBytes(data []byte) []uint64 {
	toks := make([]uint64, len(data)/3)
	for i := range toks {
		// Three bytes per token; the top bits of the first byte pick a width
		// so ids cross every CBOR and pickle integer boundary.
		v := uint64(data[3*i+1])<<8 | uint64(data[3*i+2])
		toks[i] = v << (uint(data[3*i]) % 48)
	}
	return toks
}

// FuzzChainIncremental checks that hashing a sequence in one call equals
// hashing it in two calls, the second extending the first's last hash, for
// every algorithm and any split point, with extra keys.
func FuzzChainIncremental(f *testing.F) {
	f.Add([]byte("0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnop"), uint8(4), uint8(1), "lora", "salt")
	f.Add(make([]byte, 300), uint8(16), uint8(3), "", "")
	f.Add([]byte{0xff, 0xff, 0xff, 47, 1, 2, 200, 3, 4}, uint8(1), uint8(0), "", "s")
	f.Fuzz(func(t *testing.T, data []byte, bs uint8, split uint8, lora, salt string) {
		blockSize := int(bs%32) + 1
		toks := tokensFromBytes(data)
		x := &blockhash.Extras{LoRAName: lora, CacheSalt: salt}
		if len(toks) > 2 {
			x.MM = []blockhash.MMItem{{Identifier: "img", Offset: 1, Length: len(toks) / 2}}
		}
		for _, algo := range blockhash.Algos {
			h := blockhash.MustNew(blockhash.Config{Algo: algo, Seed: "7", BlockSize: blockSize})
			xx := x
			if algo == blockhash.SGLang {
				xx = nil
				for i := range toks {
					toks[i] &= 0xffffffff
				}
			}
			whole, err := h.Chain(nil, nil, 0, toks, xx)
			if err != nil {
				t.Fatalf("%s: %v", algo, err)
			}
			if len(whole) != len(toks)/blockSize {
				t.Fatalf("%s: %d hashes for %d tokens of block size %d", algo, len(whole), len(toks), blockSize)
			}
			if len(whole) == 0 {
				continue
			}
			k := int(split) % len(whole)
			head, err := h.Chain(nil, nil, 0, toks[:k*blockSize], xx)
			if err != nil {
				t.Fatal(err)
			}
			var parent *blockhash.Hash
			if k > 0 {
				parent = &head[k-1]
			}
			tail, err := h.Chain(head, parent, k, toks[k*blockSize:], xx)
			if err != nil {
				t.Fatal(err)
			}
			for i := range whole {
				if whole[i].Hex() != tail[i].Hex() || whole[i].Key != tail[i].Key {
					t.Fatalf("%s: block %d differs between one-shot and split at %d", algo, i, k)
				}
			}
			one, err := h.Block(parent, toks[k*blockSize:(k+1)*blockSize], nil)
			if err != nil {
				t.Fatal(err)
			}
			if xx == nil && one.Hex() != whole[k].Hex() {
				t.Fatalf("%s: Block(%d) differs from Chain", algo, k)
			}
		}
	})
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, c := range []blockhash.Config{
		{Algo: "md5", BlockSize: 16},
		{Algo: blockhash.SHA256CBOR, BlockSize: 0},
		{Algo: blockhash.SHA256CBOR, BlockSize: -3},
		{Algo: blockhash.SHA256CBOR, BlockSize: blockhash.MaxBlockSize + 1},
		{Algo: blockhash.SHA256Pickle, Seed: string(make([]byte, 70000)), BlockSize: 16},
	} {
		if _, err := blockhash.New(c); err == nil {
			t.Errorf("New(%+v): want an error", c.Algo)
		}
	}
}

func TestUnsupportedShapes(t *testing.T) {
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256Pickle, Seed: "0", BlockSize: 2})
	_, err := h.Chain(nil, nil, 0, []uint64{1, 2}, &blockhash.Extras{LoRAName: string(make([]byte, 1<<16))})
	if !errors.Is(err, blockhash.ErrUnsupported) {
		t.Errorf("64 KiB LoRA name under pickle: err = %v, want ErrUnsupported", err)
	}
	deep := blockhash.Str("x")
	for i := 0; i < 20; i++ {
		deep = blockhash.Tuple(deep)
	}
	for _, algo := range []blockhash.Algo{blockhash.SHA256CBOR, blockhash.XXHashPickle} {
		h := blockhash.MustNew(blockhash.Config{Algo: algo, Seed: "0", BlockSize: 2})
		if _, err := h.ChainKeys(nil, nil, []uint64{1, 2}, []blockhash.BlockExtra{{deep}}); !errors.Is(err, blockhash.ErrUnsupported) {
			t.Errorf("%s: 20-deep extra keys: err = %v, want ErrUnsupported", algo, err)
		}
		if _, err := h.ChainKeys(nil, nil, []uint64{1, 2}, []blockhash.BlockExtra{{{Kind: 99}}}); err == nil {
			t.Errorf("%s: invalid value kind: want an error", algo)
		}
	}
	if _, err := h.HashFromDigest(nil); err == nil {
		t.Error("HashFromDigest(nil): want an error")
	}
	if _, err := h.HashFromDigest(make([]byte, 33)); err == nil {
		t.Error("HashFromDigest(33 bytes): want an error")
	}
}

// TestChainAllocs pins the steady-state hot path at zero allocations per
// call once dst has room, for both entry points of the one hashing loop.
func TestChainAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	toks := make([]uint64, 1024)
	for i := range toks {
		toks[i] = uint64(i * 7919 % 151000)
	}
	x := &blockhash.Extras{LoRAName: "a", CacheSalt: "s", MM: []blockhash.MMItem{{Identifier: "img", Offset: 3, Length: 40}}}
	for _, algo := range blockhash.Algos {
		h := blockhash.MustNew(blockhash.Config{Algo: algo, Seed: "0", BlockSize: 16})
		xx := x
		if algo == blockhash.SGLang {
			xx = nil
		}
		var keys []blockhash.BlockExtra
		for blk := 0; blk < len(toks)/16; blk++ {
			keys = append(keys, xx.BlockKeys(blk, 16))
		}
		dst := make([]blockhash.Hash, 0, 64)
		for _, c := range []struct {
			name string
			run  func()
		}{
			{"Chain", func() { dst, _ = h.Chain(dst[:0], nil, 0, toks, xx) }},
			{"ChainKeys", func() { dst, _ = h.ChainKeys(dst[:0], nil, toks, keys) }},
		} {
			c.run() // warm the buffer pool
			if n := testing.AllocsPerRun(50, c.run); n != 0 {
				t.Errorf("%s: %.1f allocations per %s, want 0", algo, n, c.name)
			}
		}
	}
}

func benchTokens(n int) []uint64 {
	toks := make([]uint64, n)
	var b [8]byte
	for i := range toks {
		binary.LittleEndian.PutUint64(b[:], uint64(i)*0x9e3779b97f4a7c15)
		toks[i] = binary.LittleEndian.Uint64(b[:]) % 151936 // Qwen2.5's vocabulary
	}
	return toks
}

// BenchmarkChain hashes a 1,024-block (16,384-token) prompt and reports
// ns/block.
func BenchmarkChain(b *testing.B) {
	toks := benchTokens(16384)
	for _, algo := range blockhash.Algos {
		b.Run(string(algo), func(b *testing.B) {
			h := blockhash.MustNew(blockhash.Config{Algo: algo, Seed: "0", BlockSize: 16})
			dst := make([]blockhash.Hash, 0, 1024)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				dst, _ = h.Chain(dst[:0], nil, 0, toks, nil)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*1024), "ns/block")
		})
	}
}

func ExampleHasher_Chain() {
	h, err := blockhash.New(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 16})
	if err != nil {
		panic(err)
	}
	tokens := make([]uint64, 40) // 2 full blocks; the last 8 tokens are not hashed
	for i := range tokens {
		tokens[i] = uint64(100 + i)
	}
	hashes, _ := h.Chain(nil, nil, 0, tokens, nil)
	for i, hh := range hashes {
		fmt.Println(i, hh.Key)
	}
	// Output:
	// 0 8468860364822751900
	// 1 5659426989048894505
}
