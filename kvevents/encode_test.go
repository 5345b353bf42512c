package kvevents_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/kvevents"
)

// TestEncodeGolden re-encodes every decoded golden payload in the shape
// that produced it and expects msgspec's exact bytes.
func TestEncodeGolden(t *testing.T) {
	v := loadWireVectors(t)
	for _, g := range goldenPayloads {
		t.Run(g.name, func(t *testing.T) {
			want := v.vector(t, g.name).payload(t)
			b := decode(t, &kvevents.Decoder{}, want)
			got, err := kvevents.AppendBatch(nil, b, kvevents.EncodeOptions{Shape: g.shape, BytesHashes: g.bytes})
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("encoding differs from msgspec's\n got %x\nwant %x", got, want)
			}
			// From the JSON form too, so that the bytes do not depend on
			// the decoder.
			got, err = kvevents.AppendBatch([]byte("prefix"), batchFromJSON(t, v.vector(t, g.name).Decoded), kvevents.EncodeOptions{Shape: g.shape, BytesHashes: g.bytes})
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(got, []byte("prefix")) || !bytes.Equal(got[6:], want) {
				t.Fatalf("encoding of the JSON form differs\n got %x\nwant prefix+%x", got, want)
			}
		})
	}
}

func TestEncodeSmallExampleByHand(t *testing.T) {
	b := &kvevents.Batch{TS: 1.5, HasDPRank: true, Events: []kvevents.Event{{
		Kind:      kvevents.BlockStored,
		Hashes:    []uint64{12687895063098490012},
		TokenIDs:  []uint64{1, 2},
		BlockSize: 2,
		Medium:    kvevents.MediumGPU,
		ExtraKeys: []blockhash.BlockExtra{nil},
		SpecKind:  "full_attention",
	}}}
	for _, tc := range []struct {
		shape kvevents.Shape
		hex   string
	}{
		// Both from spec §2.4, verified against msgspec 0.19.0.
		{kvevents.ShapeArray, "93cb3ff8000000000000919cab426c6f636b53746f72656491cfb0147556276afc9cc092010202c0a3475055c091c000ae66756c6c5f617474656e74696f6ec000"},
		{kvevents.ShapeMap, "93cb3ff8000000000000918ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cfb0147556276afc9cb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473920102aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797391c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e00"},
	} {
		got, err := kvevents.AppendBatch(nil, b, kvevents.EncodeOptions{Shape: tc.shape})
		if err != nil {
			t.Fatal(err)
		}
		if hex.EncodeToString(got) != tc.hex {
			t.Errorf("%v:\n got %x\nwant %s", tc.shape, got, tc.hex)
		}
	}
}

// TestEncodeIntWidths pins msgspec's choice of the smallest encoding at
// every boundary, through the fields that carry ints of each sign.
func TestEncodeIntWidths(t *testing.T) {
	unsigned := []struct {
		v    uint64
		want string
	}{
		{0, "00"}, {127, "7f"}, {128, "cc80"}, {255, "ccff"}, {256, "cd0100"}, {65535, "cdffff"},
		{65536, "ce00010000"}, {math.MaxUint32, "ceffffffff"}, {1 << 32, "cf0000000100000000"},
		{math.MaxUint64, "cfffffffffffffffff"},
	}
	for _, tc := range unsigned {
		b := &kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockRemoved, Hashes: []uint64{tc.v}}}}
		got, err := kvevents.AppendBatch(nil, b, kvevents.EncodeOptions{Shape: kvevents.ShapeV090})
		if err != nil {
			t.Fatal(err)
		}
		// [ts, [[tag, [hash]]]]: the hash starts after the fixed prefix.
		prefix := len(got) - len(tc.want)/2
		if h := hex.EncodeToString(got[prefix:]); h != tc.want {
			t.Errorf("hash %d encoded as %s, want %s", tc.v, h, tc.want)
		}
	}
	signed := []struct {
		v    int64
		want string
	}{
		{-1, "ff"}, {-32, "e0"}, {-33, "d0df"}, {-128, "d080"}, {-129, "d1ff7f"}, {-32768, "d18000"},
		{-32769, "d2ffff7fff"}, {math.MinInt32, "d280000000"}, {math.MinInt32 - 1, "d3ffffffff7fffffff"},
		{math.MinInt64, "d38000000000000000"}, {5, "05"}, {300, "cd012c"},
	}
	for _, tc := range signed {
		// An extra-key int is the last value of a v0.10+ array BlockStored
		// written before group_idx, kind and window; read it back out.
		b := &kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockStored, Hashes: []uint64{1}, TokenIDs: []uint64{1}, BlockSize: 1,
			ExtraKeys: []blockhash.BlockExtra{{blockhash.Int(tc.v)}}}}}
		got, err := kvevents.AppendBatch(nil, b, kvevents.EncodeOptions{Shape: kvevents.ShapeArray})
		if err != nil {
			t.Fatal(err)
		}
		tail := "00c0c0c0" // group_idx 0, kind nil, window nil, dp rank nil
		h := hex.EncodeToString(got)
		wantEnd := "9191" + tc.want + tail
		if !strings.HasSuffix(h, wantEnd) {
			t.Errorf("int %d: payload %s does not end in %s", tc.v, h, wantEnd)
		}
		// The decoder reads it back.
		if back := decode(t, &kvevents.Decoder{}, got); back.Events[0].ExtraKeys[0][0].Int != tc.v {
			t.Errorf("int %d decoded as %v", tc.v, back.Events[0].ExtraKeys[0])
		}
	}
}

// TestEncodeLengths pins the str, bin and array header forms.
func TestEncodeLengths(t *testing.T) {
	for _, tc := range []struct {
		n    int
		str  string
		bin  string
		list string
	}{
		{0, "a0", "c400", "90"},
		{15, "af", "c40f", "9f"},
		{16, "b0", "c410", "dc0010"},
		{31, "bf", "c41f", "dc001f"},
		{32, "d920", "c420", "dc0020"},
		{255, "d9ff", "c4ff", "dc00ff"},
		{256, "da0100", "c50100", "dc0100"},
		{65535, "daffff", "c5ffff", "dcffff"},
		{65536, "db00010000", "c600010000", "dd00010000"},
	} {
		s := strings.Repeat("x", tc.n)
		b := &kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockRemoved, Medium: s, Hashes: make([]uint64, tc.n)}}}
		if tc.n == 0 {
			b.Events[0].Medium = "" // "" is written as nil; check the header below directly
		}
		got, err := kvevents.AppendBatch(nil, b, kvevents.EncodeOptions{Shape: kvevents.ShapeArray})
		if err != nil {
			t.Fatal(err)
		}
		h := hex.EncodeToString(got)
		if !strings.Contains(h, "ac"+hex.EncodeToString([]byte("BlockRemoved"))+tc.list) {
			t.Errorf("array of %d: header is not %s", tc.n, tc.list)
		}
		if tc.n > 0 && !strings.Contains(h, tc.str+hex.EncodeToString([]byte(s))+"00c0") {
			t.Errorf("str of %d: header is not %s", tc.n, tc.str)
		}
		d := make([]byte, tc.n)
		for i := range d {
			d[i] = 0x5a
		}
		if tc.n == 0 {
			continue // a digest is never empty
		}
		b = &kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockRemoved, Hashes: []uint64{1}, Digests: [][]byte{d}}}}
		got, err = kvevents.AppendBatch(nil, b, kvevents.EncodeOptions{Shape: kvevents.ShapeV090, BytesHashes: true})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(hex.EncodeToString(got), "91"+tc.bin+hex.EncodeToString(d)) {
			t.Errorf("bin of %d: header is not %s", tc.n, tc.bin)
		}
	}
}

func TestEncodeErrors(t *testing.T) {
	good := kvevents.Event{Kind: kvevents.AllBlocksCleared}
	tests := []struct {
		name string
		b    kvevents.Batch
		opts kvevents.EncodeOptions
		msg  string
	}{
		{"unknown shape", kvevents.Batch{}, kvevents.EncodeOptions{}, "kvevents: encode batch: unknown shape Shape(0)"},
		{"unknown kind", kvevents.Batch{Events: []kvevents.Event{good, {Kind: 9}}}, kvevents.EncodeOptions{Shape: kvevents.ShapeMap},
			"kvevents: encode event 1: unknown event kind Kind(9)"},
		{"bytes hashes without digests", kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockRemoved, Hashes: []uint64{1}}}},
			kvevents.EncodeOptions{Shape: kvevents.ShapeMap, BytesHashes: true}, "carries 0 digests for 1 hashes"},
		{"bytes hashes with an empty digest", kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockRemoved, Hashes: []uint64{1}, Digests: [][]byte{nil}}}},
			kvevents.EncodeOptions{Shape: kvevents.ShapeMap, BytesHashes: true}, "hash 0 has no digest"},
		{"bytes hashes without a parent digest", kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockStored, Hashes: []uint64{1}, Digests: [][]byte{{1}}, HasParent: true}}},
			kvevents.EncodeOptions{Shape: kvevents.ShapeMap, BytesHashes: true}, "parent has no digest"},
		{"extra key of no kind", kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockStored, ExtraKeys: []blockhash.BlockExtra{{{}}}}}},
			kvevents.EncodeOptions{Shape: kvevents.ShapeArray}, "extra key value of unknown kind 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst := []byte("keep")
			out, err := kvevents.AppendBatch(dst, &tc.b, tc.opts)
			if err == nil {
				t.Fatalf("encoded %x", out)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not contain %q", err, tc.msg)
			}
			var ee *kvevents.EncodeError
			if !errors.As(err, &ee) {
				t.Errorf("error %T is not an *EncodeError", err)
			}
			if string(out) != "keep" {
				t.Errorf("dst changed to %q", out)
			}
		})
	}
}

// randomBatch builds a batch using every field, for round trips.
func randomBatch(rng *rand.Rand, bytesHashes bool) *kvevents.Batch {
	b := &kvevents.Batch{TS: rng.Float64() * 2e9}
	if rng.IntN(2) == 0 {
		b.HasDPRank, b.DPRank = true, rng.IntN(8)
	}
	str := func() string {
		return []string{"", "GPU", "CPU", "lora-" + fmt.Sprint(rng.IntN(5)), strings.Repeat("s", rng.IntN(300))}[rng.IntN(5)]
	}
	digest := func() []byte {
		d := make([]byte, []int{16, 32, 64}[rng.IntN(3)])
		for i := range d {
			d[i] = byte(rng.Uint32())
		}
		return d
	}
	var value func(depth int) blockhash.Value
	value = func(depth int) blockhash.Value {
		switch rng.IntN(4) {
		case 0:
			return blockhash.Str(str())
		case 1:
			return blockhash.Int(rng.Int64() >> rng.IntN(64))
		case 2:
			return blockhash.Bytes(digest())
		}
		if depth >= 3 {
			return blockhash.Int(-rng.Int64N(1000))
		}
		t := []blockhash.Value{}
		for range rng.IntN(3) {
			t = append(t, value(depth+1))
		}
		return blockhash.Tuple(t...)
	}
	for range rng.IntN(6) {
		var ev kvevents.Event
		ev.Kind = kvevents.Kind(1 + rng.IntN(3))
		if ev.Kind == kvevents.AllBlocksCleared {
			b.Events = append(b.Events, ev)
			continue
		}
		n := 1 + rng.IntN(20)
		for range n {
			if bytesHashes {
				d := digest()
				ev.Digests = append(ev.Digests, d)
				ev.Hashes = append(ev.Hashes, blockhash.KeyOfDigest(blockhash.SHA256CBOR, d))
			} else {
				ev.Hashes = append(ev.Hashes, rng.Uint64()>>rng.IntN(64))
			}
		}
		ev.Medium = str()
		ev.GroupIdx = rng.IntN(3)
		if ev.Kind == kvevents.BlockStored {
			if rng.IntN(2) == 0 {
				ev.HasParent = true
				if bytesHashes {
					ev.ParentDigest = digest()
					ev.Parent = blockhash.KeyOfDigest(blockhash.SHA256CBOR, ev.ParentDigest)
				} else {
					ev.Parent = rng.Uint64()
				}
			}
			ev.BlockSize = []int{1, 16, 64, 1024}[rng.IntN(4)]
			for range n * 4 {
				ev.TokenIDs = append(ev.TokenIDs, rng.Uint64()>>rng.IntN(64))
			}
			if rng.IntN(2) == 0 {
				ev.HasLoRAID, ev.LoRAID = true, rng.Int64()>>rng.IntN(64)-rng.Int64N(2)*math.MaxInt32
			}
			ev.LoRAName = str()
			if rng.IntN(3) > 0 {
				ev.ExtraKeys = make([]blockhash.BlockExtra, n-rng.IntN(2)*n) // sometimes [], which is not None
				for i := range ev.ExtraKeys {
					if rng.IntN(2) == 0 {
						ev.ExtraKeys[i] = blockhash.BlockExtra{}
						for range rng.IntN(3) {
							ev.ExtraKeys[i] = append(ev.ExtraKeys[i], value(2))
						}
					}
				}
			}
			ev.SpecKind = str()
			if rng.IntN(2) == 0 {
				ev.SlidingWindow = rng.IntN(1 << 20)
			}
		}
		b.Events = append(b.Events, ev)
	}
	return b
}

// TestRoundTrip encodes random batches in every shape, decodes them, and
// compares: the encoder and the decoder agree on every field a shape
// carries.
func TestRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var d kvevents.Decoder
	for i := 0; i < 300; i++ {
		bytesHashes := i%3 == 0
		b := randomBatch(rng, bytesHashes)
		for _, shape := range []kvevents.Shape{kvevents.ShapeMap, kvevents.ShapeArray} {
			p, err := kvevents.AppendBatch(nil, b, kvevents.EncodeOptions{Shape: shape, BytesHashes: bytesHashes})
			if err != nil {
				t.Fatal(err)
			}
			if diff := diffBatch(decode(t, &d, p), b); diff != "" {
				t.Fatalf("batch %d, %v: %s", i, shape, diff)
			}
		}
		// v0.9.0 carries only the original fields.
		p, err := kvevents.AppendBatch(nil, b, kvevents.EncodeOptions{Shape: kvevents.ShapeV090, BytesHashes: bytesHashes})
		if err != nil {
			t.Fatal(err)
		}
		want := &kvevents.Batch{TS: b.TS}
		for _, ev := range b.Events {
			want.Events = append(want.Events, kvevents.Event{Kind: ev.Kind, Hashes: ev.Hashes, Digests: ev.Digests,
				HasParent: ev.HasParent && ev.Kind == kvevents.BlockStored, Parent: ev.Parent, ParentDigest: ev.ParentDigest,
				TokenIDs: ev.TokenIDs, BlockSize: ev.BlockSize, HasLoRAID: ev.HasLoRAID, LoRAID: ev.LoRAID})
		}
		if diff := diffBatch(decode(t, &d, p), want); diff != "" {
			t.Fatalf("batch %d, v0.9.0: %s", i, diff)
		}
	}
}

func TestEncodeSteadyStateAllocs(t *testing.T) {
	b := benchBatch()
	buf := make([]byte, 0, 64<<10)
	allocs := testing.AllocsPerRun(50, func() {
		var err error
		if buf, err = kvevents.AppendBatch(buf[:0], b, kvevents.EncodeOptions{Shape: kvevents.ShapeMap}); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per AppendBatch into a large enough buffer", allocs)
	}
}

func ExampleAppendBatch() {
	b := &kvevents.Batch{TS: 1.5, HasDPRank: true, Events: []kvevents.Event{
		{Kind: kvevents.BlockRemoved, Hashes: []uint64{12687895063098490012}, Medium: kvevents.MediumGPU},
		{Kind: kvevents.AllBlocksCleared},
	}}
	for _, shape := range []kvevents.Shape{kvevents.ShapeV090, kvevents.ShapeArray, kvevents.ShapeMap} {
		p, err := kvevents.AppendBatch(nil, b, kvevents.EncodeOptions{Shape: shape})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%-6v %x\n", shape, p)
	}
	// Output:
	// v0.9.0 92cb3ff80000000000009292ac426c6f636b52656d6f76656491cfb0147556276afc9c91b0416c6c426c6f636b73436c6561726564
	// array  93cb3ff80000000000009294ac426c6f636b52656d6f76656491cfb0147556276afc9ca34750550091b0416c6c426c6f636b73436c656172656400
	// map    93cb3ff80000000000009284a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cfb0147556276afc9ca66d656469756da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656400
}
