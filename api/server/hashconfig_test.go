package server

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/blockhash"
)

// GetHashConfig says how the index hashes, over gRPC, and a query by
// block hashes is answered only when its config_digest is 0 or the
// index's own.
func TestHashConfigAndDigest(t *testing.T) {
	other := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "other", BlockSize: testBlockSize})
	cases := []struct {
		name    string
		hasher  *blockhash.Hasher
		digest  uint64
		code    codes.Code
		message string
	}{
		{"no digest", testHasher, 0, codes.OK, ""},
		{"the index's digest", testHasher, testHasher.Digest(), codes.OK, ""},
		{"another digest", testHasher, other.Digest(), codes.FailedPrecondition, "were not made with this kvindex's hashing"},
		{"an index that does not say", nil, other.Digest(), codes.FailedPrecondition, "does not say how it hashes"},
		{"an index that does not say, no digest", nil, 0, codes.OK, ""},
	}
	ctx := context.Background()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, func(c *Config) { c.Hasher = tc.hasher })
			hc, err := f.client.Index.GetHashConfig(ctx, &kvindexv1.GetHashConfigRequest{})
			if tc.hasher == nil {
				if status.Code(err) != codes.Unimplemented {
					t.Fatalf("GetHashConfig without a hasher: %v; want Unimplemented", err)
				}
			} else {
				c := tc.hasher.Config()
				if err != nil || hc.GetAlgo() != string(c.Algo) || hc.GetSeed() != c.Seed || int(hc.GetBlockSize()) != c.BlockSize || hc.GetDigest() != tc.hasher.Digest() {
					t.Fatalf("GetHashConfig: %v, %v; want %+v with digest %x", hc, err, c, tc.hasher.Digest())
				}
			}
			keys := chainKeys(t, testTokens(4*testBlockSize), nil)
			_, err = f.client.Index.LongestPrefix(ctx, &kvindexv1.LongestPrefixRequest{Model: testModel, Prompt: &kvindexv1.Prompt{
				Input: &kvindexv1.Prompt_BlockHashes{BlockHashes: &kvindexv1.BlockHashes{Hashes: keys, ConfigDigest: tc.digest}}}})
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.message) {
				t.Fatalf("query with digest %x: %v; want %v saying %q", tc.digest, err, tc.code, tc.message)
			}
		})
	}
}

func testTokens(n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(i + 1)
	}
	return out
}

// A Hasher whose block size is not the server's is a configuration error.
func TestHasherBlockSize(t *testing.T) {
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 2 * testBlockSize})
	if _, err := New(Config{Index: newFixture(t, nil).index, BlockSize: testBlockSize, Hasher: h}); err == nil {
		t.Fatal("a Hasher of another block size accepted")
	}
}
