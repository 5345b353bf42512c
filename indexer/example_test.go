package indexer_test

import (
	"fmt"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents"
)

func Example() {
	// The fleet hashes with sha256_cbor, PYTHONHASHSEED=0, 16-token blocks.
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 16})
	ix, err := indexer.New(indexer.Options{Hasher: h})
	if err != nil {
		panic(err)
	}

	// A 48-token prompt; pod-a caches all three blocks, pod-b the first.
	prompt := make([]uint64, 48)
	for i := range prompt {
		prompt[i] = uint64(i)
	}
	hashes, _ := h.Chain(nil, nil, 0, prompt, nil)
	keys := []uint64{hashes[0].Key, hashes[1].Key, hashes[2].Key}
	podA := kvevents.EngineID{Model: "qwen", Pod: "pod-a"}
	podB := kvevents.EngineID{Model: "qwen", Pod: "pod-b"}
	ix.Apply(podA, 0, []kvevents.Event{{Kind: kvevents.BlockStored, Hashes: keys, TokenIDs: prompt, BlockSize: 16}})
	ix.Apply(podB, 0, []kvevents.Event{{Kind: kvevents.BlockStored, Hashes: keys[:1], TokenIDs: prompt[:16], BlockSize: 16}})
	ix.Apply(kvevents.EngineID{Model: "qwen", Pod: "pod-c"}, 0, nil) // known, cold

	// Which pod holds the longest prefix of the prompt plus a new question?
	var res indexer.Result
	q := &indexer.Query{Model: "qwen", Tokens: append(prompt, 900, 901, 902)}
	if err := ix.LongestPrefix(q, &res); err != nil {
		panic(err)
	}
	fmt.Printf("%d full blocks of %d tokens\n", res.BlocksTotal, res.BlockSize)
	for _, p := range res.Pods {
		fmt.Printf("%s: %d blocks, %d tokens, %v, hashes %s\n", p.Engine, p.MatchedBlocks, p.MatchedTokens, p.Tiers, p.HashCheck)
	}

	// Evictions and resets keep it current.
	ix.Apply(podA, 1, []kvevents.Event{{Kind: kvevents.BlockRemoved, Hashes: keys[2:]}})
	ix.Reset(podB, kvevents.ResetRestart)
	_ = ix.LongestPrefix(q, &res)
	fmt.Println(res.Pods[0].Engine, res.Pods[0].MatchedBlocks, res.Pods[1].Engine, res.Pods[1].MatchedBlocks)
	// Output:
	// 3 full blocks of 16 tokens
	// pod-a: 3 blocks, 48 tokens, [{GPU 3}], hashes verified
	// pod-b: 1 blocks, 16 tokens, [{GPU 1}], hashes verified
	// pod-c: 0 blocks, 0 tokens, [], hashes unknown
	// pod-a 2 pod-b 0
}
