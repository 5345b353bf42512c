package client_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"strings"
	"time"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/server"
	"github.com/kvindex/kvindex/api/watchhub"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents"
)

// A kvindex in-process, fed one engine's BlockStored event by hand, then
// asked through the Go client which pods hold a prompt's prefix.
func ExampleDial() {
	hasher := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: blockhash.DefaultSeed, BlockSize: 16})
	ix, _ := indexer.New(indexer.Options{Hasher: hasher})
	hub := watchhub.New(ix, watchhub.Limits{})
	srv, _ := server.New(server.Config{Index: ix, BlockSize: 16, Hub: hub, DefaultModel: "qwen"})
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	gs := srv.NewGRPCServer()
	go gs.Serve(lis)
	defer gs.Stop()

	// Pod "a" stores the first two blocks of a 40-token prompt.
	prompt := make([]uint64, 40)
	for i := range prompt {
		prompt[i] = uint64(100 + i)
	}
	chain, _ := hasher.Chain(nil, nil, 0, prompt[:32], nil)
	hub.Apply(kvevents.EngineID{Model: "qwen", Pod: "a"}, 0, []kvevents.Event{{
		Kind:      kvevents.BlockStored,
		Hashes:    []uint64{chain[0].Key, chain[1].Key},
		TokenIDs:  prompt[:32],
		BlockSize: 16,
	}})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, lis.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	r, err := c.LongestPrefixTokens(ctx, "qwen", prompt, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d full blocks of %d tokens\n", r.GetBlocksTotal(), r.GetBlockSize())
	for _, p := range r.GetPods() {
		fmt.Printf("%s rank %d: %d blocks (%d tokens) %v, hashes %s\n", p.GetPod(), p.GetDpRank(),
			p.GetMatchedBlocks(), p.GetMatchedTokens(), p.GetTiers(), client.HashCheckName(p.GetHashCheck()))
	}
	// Output:
	// 2 full blocks of 16 tokens
	// a rank 0: 2 blocks (32 tokens) map[GPU:2], hashes verified
}

// Dial reports an address where no kvindex listens in one line.
func ExampleDial_unreachable() {
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := lis.Addr().String()
	lis.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := client.Dial(ctx, addr)
	fmt.Println(strings.TrimPrefix(err.Error(), "cannot reach kvindex at "+addr+": dial tcp "+addr+": "))
	// Output:
	// connect: connection refused
}
