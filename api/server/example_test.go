package server_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/kvindex/kvindex/api/server"
	"github.com/kvindex/kvindex/api/watchhub"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents"
)

// A server over an index fed through a watch hub, asked over HTTP/JSON which
// pods hold a prompt's prefix. (The gRPC side: ExampleDial in api/client.)
func ExampleServer_Handler() {
	hasher := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: blockhash.DefaultSeed, BlockSize: 16})
	ix, _ := indexer.New(indexer.Options{Hasher: hasher})
	hub := watchhub.New(ix, watchhub.Limits{}) // the event subscriber's Sink
	srv, err := server.New(server.Config{Index: ix, BlockSize: 16, Hub: hub, DefaultModel: "qwen"})
	if err != nil {
		log.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler(server.HTTPOptions{}))
	defer hs.Close()

	// Pod "a" stores the first block of a 20-token prompt.
	prompt := make([]uint64, 20)
	ids := make([]string, len(prompt))
	for i := range prompt {
		prompt[i] = uint64(100 + i)
		ids[i] = fmt.Sprint(prompt[i])
	}
	chain, _ := hasher.Chain(nil, nil, 0, prompt[:16], nil)
	hub.Apply(kvevents.EngineID{Model: "qwen", Pod: "a"}, 0, []kvevents.Event{{
		Kind:      kvevents.BlockStored,
		Hashes:    []uint64{chain[0].Key},
		TokenIDs:  prompt[:16],
		BlockSize: 16,
	}})

	body := `{"tokens": [` + strings.Join(ids, ",") + `]}`
	resp, err := http.Post(hs.URL+"/v1/longest-prefix", "application/json", strings.NewReader(body))
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	fmt.Print(resp.StatusCode, " ", string(out))
	// Output:
	// 200 {"blocks_total":1,"block_size":16,"prompt_tokens":20,"token_source":"caller","index_seq":0,"pods":[{"pod":"a","dp_rank":0,"matched_blocks":1,"matched_tokens":16,"tiers":{"GPU":1},"hash_check":"verified","health":"unknown"}]}
}
