package server

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/internal/wire"
	"github.com/kvindex/kvindex/api/internal/wiretest"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/internal/testutil"
)

func roundTrip(t *testing.T, in proto.Message, out proto.Message) {
	t.Helper()
	b, err := proto.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if err := (poolingCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, out); err != nil {
		t.Fatal(err)
	}
}

// The pooling codec decodes exactly what the standard one does.
func TestPoolingCodec(t *testing.T) {
	text := client.TextPrompt("hi")
	text.LoraName = "l"
	tests := []struct {
		name string
		in   *kvindexv1.LongestPrefixRequest
	}{
		{"tokens", &kvindexv1.LongestPrefixRequest{Model: "m", Prompt: client.TokensPrompt([]uint64{1, 2, 1 << 40}), CandidatePods: []string{"a"}}},
		{"empty tokens", &kvindexv1.LongestPrefixRequest{Model: "m", Prompt: client.TokensPrompt(nil)}},
		{"no prompt", &kvindexv1.LongestPrefixRequest{Model: "m"}},
		{"text", &kvindexv1.LongestPrefixRequest{Model: "m", Prompt: text}},
		{"hashes", &kvindexv1.LongestPrefixRequest{Prompt: client.HashesPrompt([]uint64{7})}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for range 3 { // again with recycled buffers
				var got kvindexv1.LongestPrefixRequest
				roundTrip(t, tc.in, &got)
				if !proto.Equal(&got, tc.in) || got.GetPrompt() == nil && tc.in.GetPrompt() != nil {
					t.Fatalf("decoded %v, want %v", &got, tc.in)
				}
				releaseRequestTokens(got.GetPrompt())
			}
		})
	}
}

// A oneof whose tokens are followed by text on the wire ends as text (the
// last field wins), as the standard codec decides.
func TestPoolingCodecOneofOrder(t *testing.T) {
	a, _ := proto.Marshal(&kvindexv1.LongestPrefixRequest{Prompt: client.TokensPrompt([]uint64{1, 2})})
	b, _ := proto.Marshal(&kvindexv1.LongestPrefixRequest{Prompt: client.TextPrompt("x")})
	wire := append(a, b...) // two prompt fields: messages merge
	var want, got kvindexv1.LongestPrefixRequest
	if err := proto.Unmarshal(wire, &want); err != nil {
		t.Fatal(err)
	}
	if err := (poolingCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, &got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&got, &want) || got.GetPrompt().GetText() != "x" {
		t.Errorf("got %v, want %v", &got, &want)
	}
}

// The pooling codec decodes a request split over several buffers, as
// gRPC hands them over.
func TestPoolingCodecSplit(t *testing.T) {
	in := &kvindexv1.LongestPrefixRequest{Model: "m", Prompt: client.TokensPrompt(testutil.Seq(0, 20000))}
	b, err := proto.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out kvindexv1.LongestPrefixRequest
	if err := (poolingCodec{}).Unmarshal(wiretest.Split(mem.BufferSlice{mem.SliceBuffer(b)}), &out); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&out, in) {
		t.Error("decoded message differs")
	}
	releaseRequestTokens(out.GetPrompt())
}

func TestPoolingCodecLookup(t *testing.T) {
	in := &kvindexv1.LookupRequest{Model: "m", Prompt: client.TokensPrompt(testutil.Seq(0, 1000))}
	var got kvindexv1.LookupRequest
	roundTrip(t, in, &got)
	if !slices.Equal(got.GetPrompt().GetTokens().GetIds(), in.GetPrompt().GetTokens().GetIds()) {
		t.Error("lookup tokens differ")
	}
}

func FuzzPoolingCodec(f *testing.F) {
	for _, m := range []*kvindexv1.LongestPrefixRequest{
		{Model: "m", Prompt: client.TokensPrompt([]uint64{1, 2, 3})},
		{Prompt: client.TextPrompt("t")},
		{Prompt: client.MessagesPrompt(&kvindexv1.ChatMessage{Role: "user", Content: "x"})},
		{Prompt: client.HashesPrompt([]uint64{1<<64 - 1, 1 << 63, 1<<56 + 1, 1<<35 - 3, 5})},
	} {
		b, _ := proto.Marshal(m)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var want, got kvindexv1.LongestPrefixRequest
		wantErr := proto.Unmarshal(b, &want)
		gotErr := (poolingCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &got)
		if (wantErr == nil) != (gotErr == nil) {
			t.Fatalf("errors differ: standard %v, pooling %v", wantErr, gotErr)
		}
		wiretest.DiscardUnknown(want.ProtoReflect())
		if wantErr == nil && !proto.Equal(&got, &want) {
			t.Fatalf("decoded %v, want %v", &got, &want)
		}
		releaseRequestTokens(got.GetPrompt())
	})
}

// Pooled buffers are reused: decoding the same request again allocates
// no new id or hash storage.
func TestPoolingCodecReusesBuffers(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	for _, p := range []*kvindexv1.Prompt{client.TokensPrompt(testutil.Seq(0, 16384)), client.HashesPrompt(testutil.Seq(1<<60, 1024))} {
		b, _ := proto.Marshal(&kvindexv1.LongestPrefixRequest{Model: "m", Prompt: p})
		data := mem.BufferSlice{mem.SliceBuffer(b)}
		allocs := testing.AllocsPerRun(100, func() {
			var m kvindexv1.LongestPrefixRequest
			if err := (poolingCodec{}).Unmarshal(data, &m); err != nil {
				t.Fatal(err)
			}
			releaseRequestTokens(m.GetPrompt())
			releaseRequestHashes(m.GetPrompt())
		})
		// The model string, the Prompt and its oneof wrapper; never the ids.
		if allocs > 4 {
			t.Errorf("%T: %v allocations per decode, want <= 4", p.GetInput(), allocs)
		}
	}
}

// BenchmarkDecodeIDs measures the token-id decoding of a 16,384-token
// prompt (ids below 150,000: 1 to 3 bytes each).
func BenchmarkDecodeIDs(b *testing.B) {
	tokens := make([]uint64, 16384)
	for i := range tokens {
		tokens[i] = uint64(i*7919) % 150_000
	}
	hashes := make([]uint64, 1024)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range hashes {
		hashes[i] = rng.Uint64()
	}
	for _, bc := range []struct {
		name string
		ids  []uint64
	}{{"tokens", tokens}, {"hashes", hashes}} {
		b.Run(bc.name, func(b *testing.B) {
			wire, _ := proto.Marshal(&kvindexv1.TokenIds{Ids: bc.ids})
			dst := make([]uint64, 0, len(bc.ids))
			b.SetBytes(int64(len(wire)))
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if dst, err = decodeIDs(wire, dst[:0], nil); err != nil || len(dst) != len(bc.ids) {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(bc.ids)), "ns/id")
		})
	}
}

// wideVarint reads every length of varint as protowire does, bad ones
// included: a run of continuation bytes, a tenth byte above 1.
func TestWideVarint(t *testing.T) {
	var cases [][]byte
	for _, x := range []uint64{0, 1, 127, 128, 1<<14 - 1, 1 << 14, 1<<21 + 5, 1<<28 + 3, 1<<35 - 1, 1 << 42, 1<<49 + 7, 1<<56 - 1, 1 << 56, 1<<63 - 1, 1 << 63, 1<<64 - 1} {
		cases = append(cases, protowire.AppendVarint(nil, x))
	}
	cases = append(cases,
		[]byte{0x80, 0x00},                          // not minimal, still valid
		bytes.Repeat([]byte{0xff}, 9),               // no end within ten bytes
		append(bytes.Repeat([]byte{0xff}, 9), 0x02), // bit 64 and above
		append(bytes.Repeat([]byte{0xff}, 9), 0x01),
		append(bytes.Repeat([]byte{0x80}, 9), 0x00),
	)
	for _, c := range cases {
		padded := append(slices.Clone(c), make([]byte, 10)...) // wideVarint needs ten bytes
		for i := len(c); i < len(padded); i++ {
			padded[i] = 0xff // the bytes after the varint must not matter
		}
		wantX, wantN := protowire.ConsumeVarint(padded)
		if wantN < 0 {
			wantX = 0
		}
		x, n := wideVarint(padded)
		if n < 0 {
			n = -1
		}
		if wantN < 0 {
			wantN = -1
		}
		if x != wantX || n != wantN {
			t.Errorf("% x: got %d (%d bytes), protowire %d (%d bytes)", c, x, n, wantX, wantN)
		}
	}
}

// The decoder reads every field wire.ServerDecodes declares for a request
// and its prompt as protobuf-go does, whether by hand or through
// protobuf-go.
func TestPoolingCodecFollowsTable(t *testing.T) {
	for _, name := range []protoreflect.FullName{wire.LongestPrefixRequestName, wire.LookupRequestName, wire.PromptName} {
		for _, num := range slices.Sorted(maps.Keys(wire.ServerDecodes.Fields[name])) {
			t.Run(fmt.Sprintf("%s/%d", name, num), func(t *testing.T) {
				for _, in := range []proto.Message{
					&kvindexv1.LongestPrefixRequest{Model: "m", Prompt: client.TokensPrompt([]uint64{1, 300})},
					&kvindexv1.LookupRequest{Model: "m", Prompt: client.TokensPrompt([]uint64{1, 300})},
				} {
					m := in.ProtoReflect()
					if name == wire.PromptName {
						m = m.Mutable(m.Descriptor().Fields().ByNumber(wire.RequestPrompt)).Message()
					} else if m.Descriptor().FullName() != name {
						continue
					}
					fd := m.Descriptor().Fields().ByNumber(num)
					if fd == nil {
						t.Fatalf("%s has no field %d (TestCodecsKnowEveryField says more)", name, num)
					}
					wiretest.SetSample(m, fd)
					got := in.ProtoReflect().New().Interface()
					roundTrip(t, in, got)
					if !proto.Equal(got, in) {
						t.Errorf("%s with %s set: decoded %v, want %v", in.ProtoReflect().Descriptor().Name(), fd.Name(), got, in)
					}
				}
			})
		}
	}
}

// An in-process caller keeps its block hashes: only requests the gRPC
// server decoded give theirs to the pool.
func TestInProcessHashesNotRecycled(t *testing.T) {
	f := newFixture(t, nil)
	keys := chainKeys(t, testutil.Seq(0, 4*testBlockSize), nil)
	req := &kvindexv1.LongestPrefixRequest{Model: testModel, Prompt: client.HashesPrompt(keys)}
	if _, err := f.srv.LongestPrefix(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if got := req.GetPrompt().GetBlockHashes().GetHashes(); len(got) == 0 || &got[0] != &keys[0] {
		t.Error("the caller's hashes were taken for the pool")
	}
}
