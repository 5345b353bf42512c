package indexer

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/kvevents"
)

// benchApplyEvents pregenerates BlockStored events of 16 blocks of 16
// tokens with real sha256_cbor hashes: conversations of 8 events, each event
// chained to the previous one by its parent's 64-bit key.
func benchApplyEvents(b *testing.B, h *blockhash.Hasher, n int) []kvevents.Event {
	b.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	events := make([]kvevents.Event, 0, n)
	var parent blockhash.Hash
	var hashes []blockhash.Hash
	for i := range n {
		toks := make([]uint64, 16*16)
		for j := range toks {
			toks[j] = uint64(rng.IntN(150000))
		}
		ev := kvevents.Event{Kind: kvevents.BlockStored, TokenIDs: toks, BlockSize: 16}
		var p *blockhash.Hash
		if i%8 != 0 {
			p = &parent
			ev.HasParent, ev.Parent = true, parent.Key
		}
		var err error
		hashes, err = h.Chain(hashes[:0], p, 1, toks, nil)
		if err != nil {
			b.Fatal(err)
		}
		ev.Hashes = keysOf(hashes)
		parent = hashes[len(hashes)-1]
		events = append(events, ev)
	}
	return events
}

// cpuTime returns the CPU time the process has used (user + system). The
// benchmarks report per-CPU-second rates next to wall-clock ones: on a
// shared machine the wall clock also counts time other processes held the
// cores.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkApply measures ingest of BlockStored batches (one event of 16
// blocks of 16 tokens per Apply), one engine stream at a time:
//
//   - store: into a growing index (passes of 512K blocks over 8 engines,
//     reset between passes outside the timing), table growth included;
//   - churn: at a steady size, each batch also removing the 16 blocks
//     its engine stored 4,096 batches earlier, as an engine evicting
//     blocks to store new ones does;
//
// each without a Hasher (no verification), with the default sampling, and
// with every event verified (sha256_cbor).
func BenchmarkApply(b *testing.B) {
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 16})
	events := benchApplyEvents(b, h, 1<<15)
	engines := make([]kvevents.EngineID, 8)
	for i := range engines {
		engines[i] = kvevents.EngineID{Model: "m", Pod: fmt.Sprintf("pod-%d", i)}
	}
	const window = 4096 // batches kept per pass in churn mode (a multiple of 8 conversations x 8 engines)
	for _, mode := range []string{"store", "churn"} {
		for _, bc := range []struct {
			name string
			opts Options
		}{
			{"noverify", Options{}},
			{"sampled", Options{Hasher: h}},
			{"verify", Options{Hasher: h, VerifyFirst: 1, VerifyEvery: 1}},
		} {
			b.Run(mode+"/"+bc.name, func(b *testing.B) {
				ix := mustNew(b, bc.opts)
				next := 0
				batch := make([]kvevents.Event, 2)
				batch[0].Kind = kvevents.BlockRemoved
				b.ReportAllocs()
				c0 := cpuTime()
				var untimed time.Duration
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if next == len(events) {
						if mode == "store" {
							b.StopTimer()
							u0 := cpuTime()
							for _, e := range engines {
								ix.Reset(e, kvevents.ResetRestart)
							}
							untimed += cpuTime() - u0
							b.StartTimer()
						}
						next = 0
					}
					// Conversation c (8 consecutive events) goes to engine c%8.
					e := engines[(next/8)%len(engines)]
					if mode == "churn" {
						old := next - window
						if old < 0 {
							old += len(events)
						}
						batch[0].Hashes = events[old].Hashes
						batch[1] = events[next]
						ix.Apply(e, uint64(i), batch)
					} else {
						ix.Apply(e, uint64(i), events[next:next+1])
					}
					next++
				}
				b.ReportMetric(float64(b.N*16)/b.Elapsed().Seconds(), "blocks/s")
				b.ReportMetric(float64(b.N*16)/(cpuTime()-c0-untimed).Seconds(), "blocks/cpu-s")
				if bc.name == "verify" {
					for _, e := range ix.Engines() {
						if e.Mismatches != 0 || e.Unverifiable != 0 {
							b.Fatalf("verification: %+v", e)
						}
					}
				}
			})
		}
	}
}

// BenchmarkApplyOverBudget measures ingest into an index held at its
// memory budget (16 MiB): eight engines store new blocks (one event of 16
// blocks per Apply, without verification) while a ninth holds 4,096
// blocks within its fair share; the eviction passes the stores cause are
// included, so blocks/s is the steady rate of a flooded index.
func BenchmarkApplyOverBudget(b *testing.B) {
	const budget = 16 << 20
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 16})
	events := benchApplyEvents(b, h, 1<<15)
	engines := make([]kvevents.EngineID, 8)
	for i := range engines {
		engines[i] = kvevents.EngineID{Model: "m", Pod: fmt.Sprintf("pod-%d", i)}
	}
	ix := mustNew(b, Options{MemoryBudget: budget})
	small := kvevents.EngineID{Model: "m", Pod: "small"}
	keys := make([]uint64, 4096)
	for i := range keys {
		keys[i] = 1<<63 | uint64(i)
	}
	ix.Apply(small, 1, []kvevents.Event{{Kind: kvevents.BlockStored, Hashes: keys, BlockSize: 16}})
	next, pass := 0, uint64(0)
	apply := func(i int) {
		if next == len(events) {
			// New keys for the next pass over the events: the index
			// keeps growing past its budget.
			pass++
			for _, ev := range events {
				for j := range ev.Hashes {
					ev.Hashes[j] += pass << 40
				}
			}
			next = 0
		}
		ix.Apply(engines[(next/8)%len(engines)], uint64(i), events[next:next+1])
		next++
	}
	for i := 0; ix.Stats().Evictions == 0; i++ {
		apply(i)
	}
	ev0 := ix.Stats().Evictions
	b.ReportAllocs()
	c0 := cpuTime()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		apply(i)
	}
	b.ReportMetric(float64(b.N*16)/b.Elapsed().Seconds(), "blocks/s")
	b.ReportMetric(float64(b.N*16)/(cpuTime()-c0).Seconds(), "blocks/cpu-s")
	b.ReportMetric(float64(ix.Stats().Evictions-ev0)/float64(b.N*16), "evicted/stored")
	if st := ix.Stats(); st.Bytes > budget {
		b.Fatalf("%d bytes over the budget of %d", st.Bytes, budget)
	}
}

// benchIndex is a realistic fleet index of 64 engines with more than 10M
// holder-blocks:
//   - 32 system prompts of 128 blocks, each held by 16 to 64 engines;
//   - conversations (a system prompt plus 128 to 1024 blocks of their own),
//     each held by 1 to 3 of its system prompt's engines, stored in
//     events of 16 to 64 blocks;
//   - the query: system prompt 0 plus a 896-block conversation (16,384 tokens
//     in all), held fully by 3 engines and partially (older, shorter turns
//     of the same conversation) by 8 others, the rest holding only the
//     system prompt or nothing.
type benchIndex struct {
	ix       *Index
	tokens   []uint64
	keys     []uint64
	holdings int64
}

const benchHolderBlocks = 10_500_000

func buildBenchIndex(tb testing.TB, h *blockhash.Hasher, target int64) *benchIndex {
	tb.Helper()
	rng := rand.New(rand.NewPCG(3, 4))
	bi := &benchIndex{ix: mustNew(tb, Options{Hasher: h})}
	engines := make([]kvevents.EngineID, 64)
	for i := range engines {
		engines[i] = kvevents.EngineID{Model: "fleet", Pod: fmt.Sprintf("pod-%02d", i)}
	}
	var seqNo uint64
	apply := func(e int, parent uint64, hasParent bool, keys []uint64) {
		for len(keys) > 0 {
			n := min(len(keys), 16+rng.IntN(49))
			ev := kvevents.Event{Kind: kvevents.BlockStored, Hashes: keys[:n], BlockSize: 16, HasParent: hasParent, Parent: parent}
			seqNo++
			bi.ix.Apply(engines[e], seqNo, []kvevents.Event{ev})
			bi.holdings += int64(n)
			parent, hasParent, keys = keys[n-1], true, keys[n:]
		}
	}
	// System prompts: real hash chains.
	sysTokens := make([][]uint64, 32)
	sysKeys := make([][]uint64, 32)
	sysHolders := make([][]int, 32)
	for s := range sysKeys {
		toks := make([]uint64, 128*16)
		for j := range toks {
			toks[j] = uint64(rng.IntN(150000))
		}
		hs, err := h.Chain(nil, nil, 0, toks, nil)
		if err != nil {
			tb.Fatal(err)
		}
		sysTokens[s], sysKeys[s] = toks, keysOf(hs)
		sysHolders[s] = rng.Perm(64)[:16+rng.IntN(49)]
		for _, e := range sysHolders[s] {
			apply(e, 0, false, sysKeys[s])
		}
	}
	// The query's conversation on system prompt 0.
	bi.tokens = slices.Clone(sysTokens[0])
	for range 896 * 16 {
		bi.tokens = append(bi.tokens, uint64(rng.IntN(150000)))
	}
	hs, err := h.Chain(nil, nil, 0, bi.tokens, nil)
	if err != nil {
		tb.Fatal(err)
	}
	bi.keys = keysOf(hs)
	holders := sysHolders[0]
	if len(holders) < 11 {
		tb.Fatalf("system prompt 0 has %d holders", len(holders))
	}
	for i, e := range holders[:11] {
		end := len(bi.keys)
		if i >= 3 {
			end = 128 + rng.IntN(896)
		}
		apply(e, bi.keys[127], true, bi.keys[128:end])
	}
	// Background conversations until the index is big enough.
	buf := make([]uint64, 1024)
	for bi.holdings < target {
		s := rng.IntN(32)
		n := 128 + rng.IntN(897)
		keys := buf[:n]
		for j := range keys {
			keys[j] = rng.Uint64()
		}
		hs := sysHolders[s]
		for _, j := range rng.Perm(len(hs))[:1+rng.IntN(3)] {
			apply(hs[j], sysKeys[s][127], true, keys)
		}
	}
	return bi
}

var (
	benchOnce sync.Once
	benchBig  *benchIndex
)

func bigIndex(b *testing.B) *benchIndex {
	benchOnce.Do(func() {
		h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 16})
		benchBig = buildBenchIndex(b, h, benchHolderBlocks)
	})
	return benchBig
}

// BenchmarkLongestPrefix answers a 1,024-block (16,384-token) prompt over
// 64 engines and more than 10M holder-blocks: cold (tokens hashed, memo
// miss), warm (memoized chain), and by precomputed block hashes.
func BenchmarkLongestPrefix(b *testing.B) {
	bi := bigIndex(b)
	st := bi.ix.Stats()
	check := func(b *testing.B, res *Result) {
		if res.BlocksTotal != 1024 || res.Pods[0].MatchedBlocks != 1024 || res.Pods[3].MatchedBlocks >= 1024 || len(res.Pods) != 64 {
			b.Fatalf("unexpected answer: %d blocks, first %+v", res.BlocksTotal, res.Pods[0])
		}
	}
	for _, bc := range []struct {
		name string
		q    Query
		cold bool
	}{
		{"cold", Query{Model: "fleet", Tokens: bi.tokens}, true},
		{"warm", Query{Model: "fleet", Tokens: bi.tokens}, false},
		{"hashes", Query{Model: "fleet", BlockHashes: bi.keys}, false},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var res Result
			if err := bi.ix.LongestPrefix(&bc.q, &res); err != nil {
				b.Fatal(err)
			}
			check(b, &res)
			b.ReportAllocs()
			c0 := cpuTime()
			b.ResetTimer()
			for b.Loop() {
				if bc.cold {
					bi.ix.memo.purge()
				}
				if err := bi.ix.LongestPrefix(&bc.q, &res); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((cpuTime()-c0).Nanoseconds())/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(st.HolderBlocks), "holder-blocks")
		})
	}
}

// BenchmarkMemory loads more than 10M holder-blocks into a fresh index and
// reports the live heap they cost (runtime.ReadMemStats after GC), per
// holder-block and per distinct block, next to what Stats.Bytes accounts.
func BenchmarkMemory(b *testing.B) {
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 16})
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		bi := buildBenchIndex(b, h, benchHolderBlocks)
		bi.tokens, bi.keys = nil, nil
		runtime.GC()
		runtime.ReadMemStats(&after)
		st := bi.ix.Stats()
		heap := float64(after.HeapAlloc - before.HeapAlloc)
		b.ReportMetric(heap/float64(st.HolderBlocks), "B/holder-block")
		b.ReportMetric(heap/float64(st.Blocks), "B/distinct-block")
		b.ReportMetric(float64(st.Bytes)/float64(st.HolderBlocks), "accounted-B/holder-block")
		b.ReportMetric(float64(st.HolderBlocks), "holder-blocks")
		runtime.KeepAlive(bi)
	}
}

// BenchmarkSnapshot streams the 10M holder-block index of
// BenchmarkLongestPrefix to a file, as serve's --state-dir does while
// ingest is parked (the pause), and restores it (a restart's start-up).
func BenchmarkSnapshot(b *testing.B) {
	bi := bigIndex(b)
	path := filepath.Join(b.TempDir(), "snap")
	var size int64
	b.Run("write", func(b *testing.B) {
		for b.Loop() {
			f, err := os.Create(path)
			if err != nil {
				b.Fatal(err)
			}
			bw := bufio.NewWriterSize(f, 1<<20)
			if err := bi.ix.Snapshot(bw); err != nil {
				b.Fatal(err)
			}
			if err := bw.Flush(); err != nil {
				b.Fatal(err)
			}
			fi, _ := f.Stat()
			size = fi.Size()
			f.Close()
		}
		b.ReportMetric(float64(size)/float64(bi.ix.Stats().HolderBlocks), "B/holder-block")
	})
	b.Run("restore", func(b *testing.B) {
		for b.Loop() {
			f, err := os.Open(path)
			if err != nil {
				b.Fatal(err)
			}
			ix, _ := New(Options{Hasher: bi.ix.opts.Hasher})
			if err := ix.Restore(bufio.NewReaderSize(f, 1<<20)); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
	})
}
