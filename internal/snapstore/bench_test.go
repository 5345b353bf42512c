package snapstore

import (
	"fmt"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/statefile"
	"github.com/kvindex/kvindex/kvevents"
)

// benchFleet fills an index as indexer's BenchmarkSnapshot does (its
// helper is the indexer package's own): 64 engines, 32 system prompts of
// 128 blocks held by 16 to 64 engines each, then conversations of 128 to
// 1024 blocks on a system prompt, each held by 1 to 3 of its engines,
// stored in events of 16 to 64 blocks, until target holder-blocks.
func benchFleet(b *testing.B, h *blockhash.Hasher, target int64) *indexer.Index {
	b.Helper()
	rng := rand.New(rand.NewPCG(3, 4))
	ix, err := indexer.New(indexer.Options{Hasher: h})
	if err != nil {
		b.Fatal(err)
	}
	engines := make([]kvevents.EngineID, 64)
	for i := range engines {
		engines[i] = kvevents.EngineID{Model: "fleet", Pod: fmt.Sprintf("pod-%02d", i)}
	}
	var seq uint64
	var holdings int64
	apply := func(e int, parent uint64, hasParent bool, keys []uint64) {
		for len(keys) > 0 {
			n := min(len(keys), 16+rng.IntN(49))
			seq++
			ix.Apply(engines[e], seq, []kvevents.Event{{Kind: kvevents.BlockStored, Hashes: keys[:n], BlockSize: 16, HasParent: hasParent, Parent: parent}})
			holdings += int64(n)
			parent, hasParent, keys = keys[n-1], true, keys[n:]
		}
	}
	sysKeys := make([][]uint64, 32)
	sysHolders := make([][]int, 32)
	for s := range sysKeys {
		toks := make([]uint64, 128*16)
		for j := range toks {
			toks[j] = uint64(rng.IntN(150000))
		}
		hs, err := h.Chain(nil, nil, 0, toks, nil)
		if err != nil {
			b.Fatal(err)
		}
		for _, x := range hs {
			sysKeys[s] = append(sysKeys[s], x.Key)
		}
		sysHolders[s] = rng.Perm(64)[:16+rng.IntN(49)]
		for _, e := range sysHolders[s] {
			apply(e, 0, false, sysKeys[s])
		}
	}
	buf := make([]uint64, 1024)
	for holdings < target {
		s := rng.IntN(32)
		keys := buf[:128+rng.IntN(897)]
		for j := range keys {
			keys[j] = rng.Uint64()
		}
		hs := sysHolders[s]
		for _, j := range rng.Perm(len(hs))[:1+rng.IntN(3)] {
			apply(hs[j], sysKeys[s][127], true, keys)
		}
	}
	return ix
}

// BenchmarkFreshReplicaReady measures what a fresh replica spends before
// it replays the stream's tail: opening the newest snapshot of a 10M
// holder-block index in an (embedded) JetStream object store and
// restoring it into an empty index. The snapshot is stored once, before
// the timing; put-s is that upload (the ingest pause of a streamed
// snapshot), spool-s the write to a local file instead (the pause with a
// spool directory), fetch-only-s the fetch without the restore. It is
// heavy: run it with -benchtime=1x.
func BenchmarkFreshReplicaReady(b *testing.B) {
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 16})
	ix := benchFleet(b, h, 10_500_000)
	url := startServer(b)
	s, _ := openStore(b, url, Config{Model: "fleet"})
	putStart := time.Now()
	info, err := s.Put(b.Context(), &statefile.Header{Written: time.Now().UTC(), Stream: "KVEVENTS", StreamSeq: 1}, ix.Snapshot)
	if err != nil {
		b.Fatal(err)
	}
	putTook := time.Since(putStart)
	// The ingest pause with a spool directory: the local write alone.
	spoolStart := time.Now()
	spool, err := spoolSnapshot(b.TempDir(), ix.Snapshot)
	if err != nil {
		b.Fatal(err)
	}
	spoolTook := time.Since(spoolStart)
	spool.Close()
	want := ix.Digest()
	holderBlocks := ix.Stats().HolderBlocks
	ix = nil // a replica holds only what it restores
	var fresh *indexer.Index
	for b.Loop() {
		_, body, err := s.Latest(b.Context())
		if err != nil {
			b.Fatal(err)
		}
		fresh, _ = indexer.New(indexer.Options{Hasher: h})
		if err := fresh.Restore(body); err != nil {
			b.Fatal(err)
		}
		body.Close()
	}
	b.StopTimer()
	if fresh.Digest() != want {
		b.Fatal("the restored index differs from the one stored")
	}
	// The fetch alone, for how the time divides between NATS and Restore.
	fetchStart := time.Now()
	_, body, err := s.Latest(b.Context())
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, body); err != nil {
		b.Fatal(err)
	}
	body.Close()
	b.ReportMetric(time.Since(fetchStart).Seconds(), "fetch-only-s")
	b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/ready")
	b.ReportMetric(float64(info.Size)/1e6, "snapshot-MB")
	b.ReportMetric(putTook.Seconds(), "put-s")
	b.ReportMetric(spoolTook.Seconds(), "spool-s")
	b.ReportMetric(float64(holderBlocks), "holder-blocks")
}
