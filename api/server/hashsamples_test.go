package server

import (
	"context"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
)

// HashSamples returns the kept events of the engines flagged mismatch,
// as they were sent (extra keys with None kept apart), filtered by pod.
func TestHashSamples(t *testing.T) {
	f := newFixture(t, nil)
	other := blockhash.MustNew(blockhash.Config{Algo: blockhash.XXHashCBOR, Seed: "0", BlockSize: testBlockSize})
	toks := testutil.Seq(100, 2*testBlockSize)
	hs, err := other.Chain(nil, nil, 0, toks, nil)
	if err != nil {
		t.Fatal(err)
	}
	mm := blockhash.BlockExtra{blockhash.Str("lora"), blockhash.Tuple(blockhash.Str("img"), blockhash.Int(3)), blockhash.Bytes([]byte{7})}
	ev := kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{hs[0].Key, hs[1].Key}, Digests: [][]byte{hs[0].Digest(), hs[1].Digest()},
		TokenIDs: toks, BlockSize: testBlockSize, LoRAName: "lora", ExtraKeys: []blockhash.BlockExtra{mm, nil}}
	f.index.Apply(engine("bad", 0), 1, []kvevents.Event{ev})
	f.index.Apply(engine("good", 0), 1, []kvevents.Event{stored(t, toks, 2)})

	ctx := context.Background()
	r, err := f.client.HashSamples(ctx, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.GetEngines()) != 1 || r.GetEngines()[0].GetPod() != "bad" || len(r.GetEngines()[0].GetSamples()) != 1 {
		t.Fatalf("engines %v, want bad's one sample", r.GetEngines())
	}
	s := r.GetEngines()[0].GetSamples()[0]
	if !slices.Equal(s.GetBlockHashes(), ev.Hashes) || !slices.Equal(s.GetTokenIds(), toks) || s.GetBlockSize() != testBlockSize ||
		len(s.GetBlockDigests()) != 2 || s.GetLoraName() != "lora" || !s.GetHasExtraKeys() || len(s.GetExtraKeys()) != 2 {
		t.Fatalf("sample %v", s)
	}
	k0, k1 := s.GetExtraKeys()[0], s.GetExtraKeys()[1]
	if k0.GetNone() || len(k0.GetValues()) != 3 || k0.GetValues()[0].GetStr() != "lora" ||
		k0.GetValues()[1].GetTuple().GetValues()[1].GetInt() != 3 || string(k0.GetValues()[2].GetBytes()) != "\x07" || !k1.GetNone() {
		t.Errorf("extra keys %v", s.GetExtraKeys())
	}
	if r, err := f.client.HashSamples(ctx, "", []string{"good"}); err != nil || len(r.GetEngines()) != 0 {
		t.Errorf("good only: %v, %v", r, err)
	}
	if r, err := f.client.HashSamples(ctx, "other-model", nil); err != nil || len(r.GetEngines()) != 0 {
		t.Errorf("another model: %v, %v", r, err)
	}
	if _, err := f.client.HashSamples(ctx, "", []string{""}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("empty pod: %v", err)
	}
}
