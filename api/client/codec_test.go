package client

import (
	"bytes"
	"encoding/binary"
	"maps"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/api/internal/wire"
	"github.com/kvindex/kvindex/api/internal/wiretest"
	"github.com/kvindex/kvindex/api/kvindexv1"
)

var seqTokens = wiretest.SeqTokens

func encodeForTest(t testing.TB, v proto.Message) ([]byte, bool) {
	return marshalTokenRequest(v, func(n int) []byte { return make([]byte, n) })
}

// The hand encoder writes exactly what protobuf-go writes.
func TestTokenRequestEncoding(t *testing.T) {
	p := func(ids []uint64, lora, salt string) *kvindexv1.Prompt {
		pr := TokensPrompt(ids)
		pr.LoraName, pr.CacheSalt = lora, salt
		return pr
	}
	tests := []proto.Message{
		&kvindexv1.LongestPrefixRequest{Model: "m", Prompt: p([]uint64{1, 127, 128, 16383, 16384, 1<<63 + 5}, "", "")},
		&kvindexv1.LongestPrefixRequest{Prompt: p(nil, "", "")},
		&kvindexv1.LongestPrefixRequest{Model: "Qwen/Qwen2.5-7B", Prompt: p(seqTokens(0, 20000), "lora", "salt"), CandidatePods: []string{"a", "", "b"}},
		&kvindexv1.LookupRequest{Model: "m", Prompt: p(seqTokens(100, 300), "", "s")},
	}
	for i, m := range tests {
		got, ok := encodeForTest(t, m)
		if !ok {
			t.Fatalf("%d: not handled", i)
		}
		want, _ := proto.Marshal(m)
		if !bytes.Equal(got, want) {
			t.Errorf("%d: encoding differs from protobuf-go", i)
		}
	}
	// Others are left to protobuf-go.
	mm := TokensPrompt([]uint64{1})
	mm.MmItems = []*kvindexv1.MultimodalItem{{Identifier: "x", Length: 1}}
	for _, m := range []proto.Message{
		&kvindexv1.LongestPrefixRequest{Prompt: TextPrompt("x")},
		&kvindexv1.LongestPrefixRequest{Prompt: mm},
		&kvindexv1.LongestPrefixRequest{},
		&kvindexv1.ListPodsRequest{},
	} {
		if _, ok := encodeForTest(t, m); ok {
			t.Errorf("%v: handled", m)
		}
	}
}

func FuzzTokenRequestEncoding(f *testing.F) {
	f.Add([]byte{1, 2, 3, 200, 1, 0, 0, 0, 0, 0, 0, 0}, "m", "l", "s", "c")
	f.Fuzz(func(t *testing.T, raw []byte, model, lora, salt, cand string) {
		ids := make([]uint64, len(raw)/8)
		for i := range ids {
			ids[i] = binary.LittleEndian.Uint64(raw[8*i:]) >> (raw[8*i] % 64)
		}
		pr := TokensPrompt(ids)
		pr.LoraName, pr.CacheSalt = lora, salt
		m := &kvindexv1.LongestPrefixRequest{Model: model, Prompt: pr, CandidatePods: []string{cand}}
		got, ok := encodeForTest(t, m)
		if !ok {
			t.Fatal("not handled")
		}
		want, err := proto.Marshal(m)
		if err != nil {
			return // invalid UTF-8: protobuf-go refuses, the server's decoder too
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("encoding differs from protobuf-go")
		}
	})
}

func BenchmarkEncodeTokenRequest(b *testing.B) {
	m := &kvindexv1.LongestPrefixRequest{Model: "m", Prompt: TokensPrompt(seqTokens(100_000, 16384))}
	buf := make([]byte, 0, 64<<10)
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			marshalTokenRequest(m, func(int) []byte { return buf })
		}
	})
	b.Run("protobuf-go", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			proto.MarshalOptions{}.MarshalAppend(buf[:0], m)
		}
	})
}

// The hand decoder reads what protobuf-go writes. (The server's
// TestPrefixResponseEncoding checks the other half: protobuf-go reads
// what the server's hand encoder writes.)
func TestPrefixResponseDecoding(t *testing.T) {
	for _, r := range []*kvindexv1.LongestPrefixResponse{wiretest.SampleResponse(), {}} {
		want, _ := proto.Marshal(r)
		var got kvindexv1.LongestPrefixResponse
		if err := decodePrefixResponse(want, &got); err != nil || !proto.Equal(&got, r) {
			t.Errorf("the hand decoder reads protobuf-go's encoding differently: %v", err)
		}
	}
}

func FuzzPrefixResponseDecode(f *testing.F) {
	b, _ := proto.Marshal(wiretest.SampleResponse())
	f.Add(b)
	f.Add([]byte{0x1a, 0x05, 0x2a, 0x03, 0x0a, 0x01, 0x47})
	f.Fuzz(func(t *testing.T, b []byte) {
		var want, got kvindexv1.LongestPrefixResponse
		wantErr := proto.Unmarshal(b, &want)
		gotErr := decodePrefixResponse(b, &got)
		if (wantErr == nil) != (gotErr == nil) {
			t.Fatalf("errors differ: protobuf-go %v, hand %v", wantErr, gotErr)
		}
		wiretest.DiscardUnknown(want.ProtoReflect())
		if wantErr == nil && !proto.Equal(&got, &want) {
			t.Fatalf("decoded %v, want %v", &got, &want)
		}
	})
}

// The codec round-trips messages split over several buffers, as gRPC
// hands them over: a request it encodes by hand, and an answer it decodes
// by hand.
func TestCodecSplit(t *testing.T) {
	tests := []struct {
		in  proto.Message
		out proto.Message
	}{
		{&kvindexv1.LongestPrefixRequest{Model: "m", Prompt: TokensPrompt(seqTokens(0, 20000))}, new(kvindexv1.LongestPrefixRequest)},
		{wiretest.SampleResponse(), new(kvindexv1.LongestPrefixResponse)},
	}
	for _, tc := range tests {
		data, err := codec{}.Marshal(tc.in)
		if err != nil {
			t.Fatal(err)
		}
		if err := (codec{}).Unmarshal(wiretest.Split(data), tc.out); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(tc.out, tc.in) {
			t.Errorf("%T: decoded message differs", tc.in)
		}
	}
}

// The encoder does what wire.ClientEncodes declares for each field of a
// token prompt: a field it handles by hand is written as protobuf-go
// writes it, a field left to protobuf-go sends the request there.
func TestTokenRequestFollowsTable(t *testing.T) {
	fields := (&kvindexv1.Prompt{}).ProtoReflect().Descriptor().Fields()
	table := wire.ClientEncodes.Fields[wire.PromptName]
	for _, num := range slices.Sorted(maps.Keys(table)) {
		h, fd := table[num], fields.ByNumber(num)
		if fd == nil {
			t.Fatalf("Prompt has no field %d (TestCodecsKnowEveryField says more)", num)
		}
		t.Run(string(fd.Name()), func(t *testing.T) {
			p := TokensPrompt([]uint64{1, 300, 70000})
			wiretest.SetSample(p.ProtoReflect(), fd)
			req := &kvindexv1.LongestPrefixRequest{Model: "m", Prompt: p, CandidatePods: []string{"a"}}
			got, ok := encodeForTest(t, req)
			if h == wire.ByLibrary {
				if ok {
					t.Errorf("encoded by hand; %s leaves field %s to protobuf-go", wire.ClientEncodes.Table, fd.Name())
				}
				return
			}
			want, _ := proto.Marshal(req)
			if !ok || !bytes.Equal(got, want) {
				t.Errorf("handled %v; encoding equals protobuf-go's: %v", ok, bytes.Equal(got, want))
			}
		})
	}
}
