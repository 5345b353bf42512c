package client_test

import (
	"context"
	"maps"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/api/server"
	"github.com/kvindex/kvindex/api/watchhub"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents"
)

const testModel = "qwen"

var testHasher = blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: blockhash.DefaultSeed, BlockSize: 16})

// startServer runs a kvindex on loopback and returns a client of it and
// the hub that feeds its index.
func startServer(t *testing.T) (*client.Client, *watchhub.Hub) {
	t.Helper()
	ix, err := indexer.New(indexer.Options{Hasher: testHasher})
	if err != nil {
		t.Fatal(err)
	}
	hub := watchhub.New(ix, watchhub.Limits{})
	srv, err := server.New(server.Config{Index: ix, BlockSize: 16, Hub: hub, DefaultModel: testModel, ReadyGrace: -1})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := srv.NewGRPCServer()
	go gs.Serve(lis)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		srv.Shutdown()
		gs.Stop()
	})
	return c, hub
}

// storeKeys makes pod hold the first blocks of tokens, hashed with x.
func storeKeys(t *testing.T, hub *watchhub.Hub, pod string, tokens []uint64, blocks int, x *blockhash.Extras) {
	t.Helper()
	hs, err := testHasher.Chain(nil, nil, 0, tokens, x)
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]uint64, blocks)
	for i := range keys {
		keys[i] = hs[i].Key
	}
	hub.Apply(kvevents.EngineID{Model: testModel, Pod: pod}, 0, []kvevents.Event{{Kind: kvevents.BlockStored, Hashes: keys, BlockSize: 16}})
}

// The client never drops a prompt field it was given: QueryOptions only
// fill the fields the prompt leaves empty, and a field set differently in
// both is refused. Each query goes to a real server, whose engines hold
// the prompt hashed with different extras; the pods that match tell which
// extras reached the server.
func TestQueryOptionsFillPrompt(t *testing.T) {
	c, hub := startServer(t)
	tokens := make([]uint64, 64)
	for i := range tokens {
		tokens[i] = uint64(500 + i)
	}
	img := []*kvindexv1.MultimodalItem{{Identifier: "img-1", Offset: 4, Length: 8}}
	storeKeys(t, hub, "base", tokens, 4, nil)
	storeKeys(t, hub, "lora", tokens, 3, &blockhash.Extras{LoRAName: "x"})
	storeKeys(t, hub, "salted", tokens, 2, &blockhash.Extras{CacheSalt: "s"})
	storeKeys(t, hub, "image", tokens, 1, &blockhash.Extras{MM: []blockhash.MMItem{{Identifier: "img-1", Offset: 4, Length: 8}}})

	prompt := func(lora, salt string, mm []*kvindexv1.MultimodalItem) *kvindexv1.Prompt {
		p := client.TokensPrompt(tokens)
		p.LoraName, p.CacheSalt, p.MmItems = lora, salt, mm
		return p
	}
	tests := []struct {
		name   string
		prompt *kvindexv1.Prompt
		opts   *client.QueryOptions
		want   map[string]uint32 // pods matching > 0 blocks
		err    string            // InvalidArgument containing it
	}{
		{"no options", prompt("", "", nil), nil, map[string]uint32{"base": 4}, ""},
		{"lora in the prompt, candidates in the options", prompt("x", "", nil),
			&client.QueryOptions{Candidates: []string{"base", "lora"}}, map[string]uint32{"lora": 3}, ""},
		{"lora in the options", prompt("", "", nil), &client.QueryOptions{LoRAName: "x"}, map[string]uint32{"lora": 3}, ""},
		{"lora in both, equal", prompt("x", "", nil), &client.QueryOptions{LoRAName: "x"}, map[string]uint32{"lora": 3}, ""},
		{"salt in the prompt, empty options", prompt("", "s", nil), &client.QueryOptions{}, map[string]uint32{"salted": 2}, ""},
		{"salt in the options", prompt("", "", nil), &client.QueryOptions{CacheSalt: "s"}, map[string]uint32{"salted": 2}, ""},
		{"mm in the prompt", prompt("", "", img), &client.QueryOptions{Candidates: []string{"image"}}, map[string]uint32{"image": 1}, ""},
		{"mm in the options", prompt("", "", nil), &client.QueryOptions{MMItems: img}, map[string]uint32{"image": 1}, ""},
		{"lora differs", prompt("x", "", nil), &client.QueryOptions{LoRAName: "y"}, nil,
			`the prompt's lora_name "x" differs from QueryOptions.LoRAName "y"`},
		{"salt differs", prompt("", "s", nil), &client.QueryOptions{CacheSalt: "t"}, nil,
			`the prompt's cache_salt "s" differs from QueryOptions.CacheSalt "t"`},
		{"mm differs", prompt("", "", img), &client.QueryOptions{MMItems: []*kvindexv1.MultimodalItem{{Identifier: "img-2", Offset: 4, Length: 8}}}, nil,
			"the prompt's mm_items differ from QueryOptions.MMItems"},
	}
	ctx := context.Background()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := proto.Clone(tc.prompt)
			r, err := c.LongestPrefix(ctx, testModel, tc.prompt, tc.opts)
			lk, lkErr := c.Lookup(ctx, testModel, tc.prompt, tc.opts)
			if !proto.Equal(before, tc.prompt) {
				t.Errorf("the caller's prompt changed: lora_name %q cache_salt %q mm_items %v", tc.prompt.GetLoraName(), tc.prompt.GetCacheSalt(), tc.prompt.GetMmItems())
			}
			if tc.err != "" {
				for _, e := range []error{err, lkErr} {
					if st := status.Convert(e); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.err) {
						t.Errorf("got %v, want InvalidArgument containing %q", e, tc.err)
					}
				}
				return
			}
			if err != nil || lkErr != nil {
				t.Fatal(err, lkErr)
			}
			got := map[string]uint32{}
			for _, p := range r.GetPods() {
				if p.GetMatchedBlocks() > 0 {
					got[p.GetPod()] = p.GetMatchedBlocks()
				}
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("LongestPrefix matched %v, want %v", got, tc.want)
			}
			// Lookup, with the same prompt and options, agrees.
			held := map[string]uint32{}
			for _, b := range lk.GetBlocks() {
				for _, h := range b.GetHolders() {
					if held[h.GetPod()] == b.GetIndex() {
						held[h.GetPod()]++
					}
				}
			}
			if tc.opts != nil && len(tc.opts.Candidates) > 0 {
				maps.DeleteFunc(held, func(pod string, _ uint32) bool { return !slices.Contains(tc.opts.Candidates, pod) })
			}
			if !maps.Equal(held, tc.want) {
				t.Errorf("Lookup holders %v, want %v", held, tc.want)
			}
		})
	}
}

// PodNames lists each pod once, sorted, whatever its ranks and models.
func TestPodNames(t *testing.T) {
	c, hub := startServer(t)
	ctx := context.Background()
	if names, err := c.PodNames(ctx, ""); err != nil || len(names) != 0 {
		t.Errorf("no engines: PodNames = %v, %v", names, err)
	}
	for _, e := range []kvevents.EngineID{{Model: testModel, Pod: "pod-b", DPRank: 1}, {Model: testModel, Pod: "pod-b"}, {Model: "other", Pod: "pod-b"}, {Model: "other", Pod: "pod-a"}} {
		hub.Apply(e, 0, []kvevents.Event{{Kind: kvevents.BlockStored, Hashes: []uint64{1}, BlockSize: 16}})
	}
	for model, want := range map[string][]string{"": {"pod-a", "pod-b"}, testModel: {"pod-b"}, "none": {}} {
		if names, err := c.PodNames(ctx, model); err != nil || !slices.Equal(names, want) {
			t.Errorf("PodNames(%q) = %v, %v; want %v", model, names, err, want)
		}
	}
}
