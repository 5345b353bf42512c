package kvevents_test

import (
	"math/rand/v2"
	"testing"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/kvevents"
)

// benchBatch is the batch BenchmarkDecode decodes: 64 BlockStored events,
// each one block of 16 Llama-range token ids with an int hash and parent,
// medium "GPU", extra_keys [None], group 0, kind full_attention: what a
// busy engine's step looks like on the wire.
func benchBatch() *kvevents.Batch {
	rng := rand.New(rand.NewPCG(1, 2))
	b := &kvevents.Batch{TS: 1750000000.25, HasDPRank: true}
	parent := rng.Uint64()
	for i := 0; i < 64; i++ {
		toks := make([]uint64, 16)
		for j := range toks {
			toks[j] = uint64(rng.IntN(128256))
		}
		h := rng.Uint64()
		b.Events = append(b.Events, kvevents.Event{
			Kind:      kvevents.BlockStored,
			Hashes:    []uint64{h},
			HasParent: true,
			Parent:    parent,
			TokenIDs:  toks,
			BlockSize: 16,
			Medium:    "GPU",
			ExtraKeys: []blockhash.BlockExtra{nil},
			SpecKind:  "full_attention",
		})
		parent = h
	}
	return b
}

// BenchmarkDecode measures steady-state decoding of benchBatch in the
// current map layout and the older array layout.
func BenchmarkDecode(b *testing.B) {
	batch := benchBatch()
	for _, tc := range []struct {
		name  string
		shape kvevents.Shape
	}{
		{"map", kvevents.ShapeMap},
		{"array", kvevents.ShapeArray},
	} {
		b.Run(tc.name, func(b *testing.B) {
			payload, err := kvevents.AppendBatch(nil, batch, kvevents.EncodeOptions{Shape: tc.shape})
			if err != nil {
				b.Fatal(err)
			}
			var d kvevents.Decoder
			var out kvevents.Batch
			if err := d.Decode(payload, &out); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := d.Decode(payload, &out); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if len(out.Events) != 64 {
				b.Fatalf("decoded %d events, want 64", len(out.Events))
			}
			b.ReportMetric(float64(b.N)*64/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkEncode measures AppendBatch on the same batch.
func BenchmarkEncode(b *testing.B) {
	batch := benchBatch()
	for _, tc := range []struct {
		name  string
		shape kvevents.Shape
	}{
		{"map", kvevents.ShapeMap},
		{"array", kvevents.ShapeArray},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var buf []byte
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				var err error
				if buf, err = kvevents.AppendBatch(buf[:0], batch, kvevents.EncodeOptions{Shape: tc.shape}); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(int64(len(buf)))
			b.ReportMetric(float64(b.N)*64/b.Elapsed().Seconds(), "events/s")
		})
	}
}
