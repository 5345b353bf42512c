package enginesim_test

import (
	"math/rand/v2"
	"testing"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/kvevents/enginesim"
)

// BenchmarkProcess measures one engine serving 1024-token prompts built
// from 64 shared 512-token prefixes (system prompts, documents) and a
// unique tail, through a pool that holds a fraction of them: the model
// alone (hashing, cache, encoding, replay buffer), with no Publisher;
// on sockets, zmqtransport adds one PUB send per batch.
func BenchmarkProcess(b *testing.B) {
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 16})
	e, err := enginesim.New(enginesim.Config{Hasher: h, CapacityBlocks: 2048, BufferSteps: 1000})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	prefixes := make([][]uint64, 64)
	for i := range prefixes {
		prefixes[i] = make([]uint64, 512)
		for j := range prefixes[i] {
			prefixes[i][j] = uint64(rng.IntN(128000))
		}
	}
	prompts := make([][]uint64, 1024)
	for i := range prompts {
		p := append([]uint64(nil), prefixes[rng.IntN(len(prefixes))]...)
		for range 512 {
			p = append(p, uint64(rng.IntN(128000)))
		}
		prompts[i] = p
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := e.Process(prompts[i%len(prompts)], nil); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "requests/s")
	b.ReportMetric(float64(e.Hits())/float64(e.Queries()), "hit-rate")
}
