package server

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents"
)

// Load shape of the LongestPrefix benchmarks: prompts of 1,024 blocks
// (16,384 token ids) sharing a 128-block system prefix, held by a fleet
// of engines at various depths.
const (
	benchEngines      = 32
	benchPrompts      = 64
	benchBlocks       = 1024
	benchSharedBlocks = 128
	benchHolders      = 4 // engines holding each prompt beyond the shared prefix
	benchConcurrency  = 64
)

// benchFleet is an index loaded as a fleet would load it: every engine
// holds the shared prefix; each prompt is held by benchHolders engines,
// the first in full and the others to shallower depths.
type benchFleet struct {
	index   *indexer.Index
	prompts [][]uint64
}

var (
	fleetOnce sync.Once
	fleet     benchFleet
)

func loadFleet(*testing.B) *benchFleet { return sharedFleet() }

// sharedFleet builds the fleet once per process: the benchmarks' and a
// benchmark server child's (servercpu_test.go), which has no testing.B.
func sharedFleet() *benchFleet {
	fleetOnce.Do(func() {
		rng := rand.New(rand.NewPCG(1, 2))
		shared := make([]uint64, benchSharedBlocks*testBlockSize)
		for i := range shared {
			shared[i] = uint64(rng.IntN(150_000))
		}
		ix, err := indexer.New(indexer.Options{Hasher: testHasher})
		if err != nil {
			panic(err)
		}
		seq := make([]uint64, benchEngines)
		for p := range benchPrompts {
			toks := make([]uint64, benchBlocks*testBlockSize)
			copy(toks, shared)
			for i := len(shared); i < len(toks); i++ {
				toks[i] = uint64(rng.IntN(150_000))
			}
			fleet.prompts = append(fleet.prompts, toks)
			keys := mustChainKeys(toks)
			for k := range benchHolders {
				e := (p + k*7) % benchEngines
				depth := benchBlocks - k*benchBlocks/benchHolders
				ix.Apply(kvevents.EngineID{Model: testModel, Pod: fmt.Sprintf("pod-%02d", e)}, seq[e], []kvevents.Event{{
					Kind: kvevents.BlockStored, Hashes: keys[:depth], TokenIDs: toks[:depth*testBlockSize], BlockSize: testBlockSize,
				}})
				seq[e]++
			}
		}
		fleet.index = ix
	})
	return &fleet
}

// mustChainKeys is chainKeys for code without a testing.TB.
func mustChainKeys(tokens []uint64) []uint64 {
	hs, err := testHasher.Chain(nil, nil, 0, tokens, nil)
	if err != nil {
		panic(err)
	}
	keys := make([]uint64, len(hs))
	for i := range hs {
		keys[i] = hs[i].Key
	}
	return keys
}

// BenchmarkLongestPrefixGRPC measures LongestPrefix end to end over
// loopback gRPC: 64 (and 1) concurrent callers on one connection, each
// query 16,384 token ids. Client and server share the machine's cores, so
// the numbers are the whole round trip's cost, both sides included.
func BenchmarkLongestPrefixGRPC(b *testing.B) {
	fl := loadFleet(b)
	srv, err := New(Config{Index: fl.index, BlockSize: testBlockSize, DefaultModel: testModel})
	if err != nil {
		b.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	gs := srv.NewGRPCServer()
	go gs.Serve(lis)
	defer gs.Stop()
	ctx := context.Background()
	c, err := client.Dial(ctx, lis.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	reqs := make([]*kvindexv1.LongestPrefixRequest, len(fl.prompts))
	for i, p := range fl.prompts {
		reqs[i] = &kvindexv1.LongestPrefixRequest{Model: testModel, Prompt: client.TokensPrompt(p)}
	}
	// One warm query checks the answer (and warms the memo and pools).
	r, err := c.Index.LongestPrefix(ctx, reqs[0])
	if err != nil {
		b.Fatal(err)
	}
	if r.GetBlocksTotal() != benchBlocks || r.GetPods()[0].GetMatchedBlocks() != benchBlocks {
		b.Fatalf("warm-up answer: %d blocks, best %d", r.GetBlocksTotal(), r.GetPods()[0].GetMatchedBlocks())
	}
	// c64 is the load the service is sized for; c1 shows the latency of
	// a query on an idle server.
	for _, conc := range []int{benchConcurrency, 1} {
		b.Run(fmt.Sprintf("c%d", conc), func(b *testing.B) {
			runLoad(b, conc, func(i int) error {
				_, err := c.Index.LongestPrefix(ctx, reqs[i%len(reqs)])
				return err
			})
		})
	}
	// The same prompts as their 1,024 block keys, as a caller that hashes
	// them itself (kvindex picker) sends them.
	byHashes := make([]*kvindexv1.LongestPrefixRequest, len(fl.prompts))
	for i, p := range fl.prompts {
		byHashes[i] = &kvindexv1.LongestPrefixRequest{Model: testModel, Prompt: client.HashesPrompt(chainKeys(b, p, nil))}
	}
	b.Run(fmt.Sprintf("hashes-c%d", benchConcurrency), func(b *testing.B) {
		runLoad(b, benchConcurrency, func(i int) error {
			_, err := c.Index.LongestPrefix(ctx, byHashes[i%len(byHashes)])
			return err
		})
	})
}

// BenchmarkLongestPrefixServer measures the server's own work for the
// same queries (by token ids and by block hashes), without transport or
// encoding: the floor under the gRPC numbers.
func BenchmarkLongestPrefixServer(b *testing.B) {
	fl := loadFleet(b)
	srv, err := New(Config{Index: fl.index, BlockSize: testBlockSize, DefaultModel: testModel})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	hashes := make([][]uint64, len(fl.prompts))
	for i, p := range fl.prompts {
		hashes[i] = mustChainKeys(p)
	}
	for _, q := range []struct {
		name   string
		prompt func(i int) *kvindexv1.Prompt
	}{
		{"ids", func(i int) *kvindexv1.Prompt { return client.TokensPrompt(fl.prompts[i]) }},
		{"hashes", func(i int) *kvindexv1.Prompt { return client.HashesPrompt(hashes[i]) }},
	} {
		b.Run(q.name, func(b *testing.B) {
			runLoad(b, benchConcurrency, func(i int) error {
				req := &kvindexv1.LongestPrefixRequest{Model: testModel, Prompt: q.prompt(i % len(fl.prompts))}
				r, err := srv.longestPrefix(ctx, req)
				if err == nil {
					putPrefixResponse(r)
				}
				return err
			})
		})
	}
}

// BenchmarkFleetWalk is the index walk of BenchmarkLongestPrefixServerCPU's
// queries by block hashes, alone: one query after another in one
// goroutine (alone), and the same with 4 MiB of other memory written
// between queries (cache-cold), as a server's transport and callers
// evict the fleet's slots from the caches between its walks. walk-ns/op
// is the walk's own time, without the writes.
func BenchmarkFleetWalk(b *testing.B) {
	fl := loadFleet(b)
	qs := make([]indexer.Query, len(fl.prompts))
	for i, p := range fl.prompts {
		qs[i] = indexer.Query{Model: testModel, BlockHashes: mustChainKeys(p)}
	}
	for _, v := range []struct {
		name  string
		other []uint64
	}{{"alone", nil}, {"cache-cold", make([]uint64, 4<<20/8)}} {
		b.Run(v.name, func(b *testing.B) {
			var res indexer.Result
			var walking time.Duration
			for i := 0; b.Loop(); i++ {
				for j := 0; j < len(v.other); j += 8 { // one write per cache line
					v.other[j]++
				}
				t0 := time.Now()
				err := fl.index.LongestPrefix(&qs[i%len(qs)], &res)
				walking += time.Since(t0)
				if err != nil {
					b.Fatal(err)
				}
				if res.Pods[0].MatchedBlocks != benchBlocks {
					b.Fatalf("query %d: the first pod matched %d blocks", i%len(qs), res.Pods[0].MatchedBlocks)
				}
			}
			b.ReportMetric(float64(walking.Nanoseconds())/float64(b.N), "walk-ns/op")
		})
	}
}

// runLoad runs b.N calls of do from conc goroutines and reports
// throughput and latency percentiles.
func runLoad(b *testing.B, conc int, do func(i int) error) {
	b.ReportAllocs()
	lat := make([][]time.Duration, conc)
	var next sync.Mutex
	n := 0
	claim := func() (int, bool) {
		next.Lock()
		defer next.Unlock()
		if n >= b.N {
			return 0, false
		}
		n++
		return n, true
	}
	var wg sync.WaitGroup
	var failed error
	var failOnce sync.Once
	b.ResetTimer()
	cpu0 := processCPU()
	start := time.Now()
	for g := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := make([]time.Duration, 0, b.N/conc+1)
			for {
				i, ok := claim()
				if !ok {
					break
				}
				t0 := time.Now()
				if err := do(i); err != nil {
					failOnce.Do(func() { failed = err })
					break
				}
				mine = append(mine, time.Since(t0))
			}
			lat[g] = mine
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := processCPU() - cpu0
	b.StopTimer()
	if failed != nil {
		b.Fatal(failed)
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[min(int(p*float64(len(all))), len(all)-1)].Microseconds())
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "qps")
	b.ReportMetric(pct(0.50), "p50-us")
	b.ReportMetric(pct(0.99), "p99-us")
	// CPU time of the whole process (callers and server) per query: on a
	// shared machine, wall-clock throughput depends on the neighbours,
	// while this does not; cores / cpu-us-per-op bounds the throughput of
	// an otherwise idle machine.
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-us/op")
}

// processCPU is the user and system CPU time the process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
