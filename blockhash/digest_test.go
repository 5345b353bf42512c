package blockhash

import "testing"

// Every configuration has its own digest, and the same configuration the
// same digest in every Hasher built from it.
func TestDigest(t *testing.T) {
	seen := map[uint64]Config{}
	for _, algo := range Algos {
		for _, seed := range []string{DefaultSeed, "0", "42"} {
			for _, bs := range []int{1, 16, 32, 256} {
				cfg := Config{Algo: algo, Seed: seed, BlockSize: bs}
				d := MustNew(cfg).Digest()
				if d == 0 {
					t.Fatalf("%+v: digest 0", cfg)
				}
				if again := MustNew(cfg).Digest(); again != d {
					t.Fatalf("%+v: digest %x, then %x", cfg, d, again)
				}
				if prev, dup := seen[d]; dup {
					t.Fatalf("%+v and %+v share digest %x", cfg, prev, d)
				}
				seen[d] = cfg
			}
		}
	}
}
