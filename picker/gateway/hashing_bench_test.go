package gateway

import (
	"fmt"
	"testing"

	"github.com/kvindex/kvindex/blockhash"
)

// BenchmarkPickerHashTurn is the picker's hashing of an agent
// conversation's turn: a 16,384-token prompt whose last turn added 304
// tokens to the 16,080 of the one before. "memo": the turn before is in
// the memo, so only the new blocks (and every block's fingerprint) are
// hashed; "no-memo": the whole chain is hashed, as without a memo.
// Each iteration is a different new turn on the same earlier prompt.
func BenchmarkPickerHashTurn(b *testing.B) {
	const total, added = 16384, 304
	m, err := newMetrics(nil, func() int64 { return 0 })
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]uint64, total)
	x := uint64(12345)
	for i := range ids {
		x = x*6364136223846793005 + 1442695040888963407
		ids[i] = x >> 47 // below 2^17, like a 150k vocabulary's ids
	}
	for _, algo := range []blockhash.Algo{blockhash.SHA256Pickle, blockhash.SHA256CBOR, blockhash.XXHashCBOR} {
		h := blockhash.MustNew(blockhash.Config{Algo: algo, Seed: "0", BlockSize: 16})
		b.Run(fmt.Sprintf("%s/memo", algo), func(b *testing.B) {
			hs := newHashing(h, h.Digest(), 0, m)
			if _, err := hs.keys(ids[:total-added], nil); err != nil {
				b.Fatal(err)
			}
			turn := make([]uint64, total)
			copy(turn, ids)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				turn[total-added] = uint64(i) // a new turn every time
				if _, err := hs.keys(turn, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("%s/no-memo", algo), func(b *testing.B) {
			var hashes []blockhash.Hash
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				hashes, err = h.Chain(hashes[:0], nil, 0, ids, nil)
				if err != nil {
					b.Fatal(err)
				}
				keys := make([]uint64, len(hashes))
				for i := range hashes {
					keys[i] = hashes[i].Key
				}
			}
		})
	}
}
