package doctor

import (
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/api/server"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/kvevents"
)

// toProto is the wire form of s, as the server sends it.
func toProto(s Sample) *kvindexv1.StoredSample {
	return server.StoredSample(&kvevents.Event{
		Kind: kvevents.BlockStored, Hashes: s.Hashes, Digests: s.Digests, HasParent: s.HasParent, Parent: s.Parent,
		ParentDigest: s.ParentDigest, TokenIDs: s.Tokens, BlockSize: s.BlockSize, LoRAName: s.LoRAName, ExtraKeys: s.ExtraKeys,
	})
}

func TestDecodeRoundTrip(t *testing.T) {
	mm := blockhash.BlockExtra{blockhash.Str("sql"), blockhash.Tuple(blockhash.Str("img-1"), blockhash.Int(4)), blockhash.Bytes([]byte{1, 2})}
	s := Sample{Hashes: []uint64{1, 2}, Digests: [][]byte{{1}, {2}}, HasParent: true, Parent: 9, ParentDigest: []byte{9},
		Tokens: []uint64{1, 2, 3, 4}, BlockSize: 2, LoRAName: "sql", ExtraKeys: []blockhash.BlockExtra{mm, nil}}
	got, err := Decode(toProto(s))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, s) {
		t.Fatalf("decoded %+v\nwant %+v", got, s)
	}
	s.ExtraKeys[1] = blockhash.BlockExtra{} // the empty tuple is not None
	if got, err := Decode(toProto(s)); err != nil || got.ExtraKeys[1] == nil {
		t.Fatalf("empty tuple decoded as %#v, %v", got.ExtraKeys[1], err)
	}
}

func TestDecodeErrors(t *testing.T) {
	ok := func() *kvindexv1.StoredSample {
		return &kvindexv1.StoredSample{BlockHashes: []uint64{1, 2}, TokenIds: []uint64{1, 2, 3, 4}, BlockSize: 2}
	}
	deep := &kvindexv1.ExtraKeyValue{Value: &kvindexv1.ExtraKeyValue_Str{Str: "x"}}
	for range maxExtraDepth + 1 {
		deep = &kvindexv1.ExtraKeyValue{Value: &kvindexv1.ExtraKeyValue_Tuple{Tuple: &kvindexv1.ExtraKeyTuple{Values: []*kvindexv1.ExtraKeyValue{deep}}}}
	}
	tests := []struct {
		name   string
		modify func(*kvindexv1.StoredSample)
		want   string
	}{
		{"no hashes", func(p *kvindexv1.StoredSample) { p.BlockHashes = nil }, "no block_hashes"},
		{"block size 0", func(p *kvindexv1.StoredSample) { p.BlockSize = 0 }, "block_size 0 out of range"},
		{"tokens short", func(p *kvindexv1.StoredSample) { p.TokenIds = p.TokenIds[:3] }, "3 token_ids for 2 blocks of 2"},
		{"digests", func(p *kvindexv1.StoredSample) { p.BlockDigests = [][]byte{{1}} }, "1 block_digests for 2"},
		{"empty digest", func(p *kvindexv1.StoredSample) { p.BlockDigests = [][]byte{{1}, {}} }, "block_digests[1]: 0 bytes"},
		{"parent digest", func(p *kvindexv1.StoredSample) { p.ParentDigest = make([]byte, 33) }, "parent_digest of 33 bytes"},
		{"extra keys count", func(p *kvindexv1.StoredSample) {
			p.HasExtraKeys, p.ExtraKeys = true, []*kvindexv1.BlockExtraKeys{{None: true}}
		}, "1 extra_keys for 2"},
		{"extra keys unflagged", func(p *kvindexv1.StoredSample) { p.ExtraKeys = []*kvindexv1.BlockExtraKeys{{None: true}, {None: true}} }, "without has_extra_keys"},
		{"none with values", func(p *kvindexv1.StoredSample) {
			p.HasExtraKeys, p.ExtraKeys = true, []*kvindexv1.BlockExtraKeys{{None: true, Values: []*kvindexv1.ExtraKeyValue{deep}}, {None: true}}
		}, "extra_keys[0]: none with values"},
		{"untyped value", func(p *kvindexv1.StoredSample) {
			p.HasExtraKeys, p.ExtraKeys = true, []*kvindexv1.BlockExtraKeys{{None: true}, {Values: []*kvindexv1.ExtraKeyValue{{}}}}
		}, "extra_keys[1]: value 0 has no type"},
		{"too deep", func(p *kvindexv1.StoredSample) {
			p.HasExtraKeys, p.ExtraKeys = true, []*kvindexv1.BlockExtraKeys{{None: true}, {Values: []*kvindexv1.ExtraKeyValue{deep}}}
		}, "nested deeper than"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := ok()
			tc.modify(p)
			_, err := Decode(p)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	if _, err := Decode(ok()); err != nil {
		t.Fatal(err)
	}
}

// FuzzDecode feeds arbitrary wire bytes through Decode and Search: a
// bad sample is an error, and what Decode accepts Search takes without
// panicking.
func FuzzDecode(f *testing.F) {
	for _, e := range []engine{
		{cfg: blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 4}, lora: "l", salt: "s", digests: true},
		{cfg: blockhash.Config{Algo: blockhash.SGLang, BlockSize: 2}},
	} {
		for _, s := range e.samples(f) {
			b, err := proto.Marshal(toProto(s))
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
	g := Grid{Algos: blockhash.Algos, Seeds: []string{"0"}, BlockSizes: []int{1, 2, 4}}
	f.Fuzz(func(t *testing.T, b []byte) {
		var p kvindexv1.StoredSample
		if proto.Unmarshal(b, &p) != nil {
			return
		}
		s, err := Decode(&p)
		if err != nil {
			return
		}
		if !s.valid() {
			t.Fatalf("Decode accepted an invalid sample: %+v", s)
		}
		if len(s.Tokens) > 1<<12 {
			return // keeps each input fast
		}
		Search([]Sample{s, s}, g)
	})
}
