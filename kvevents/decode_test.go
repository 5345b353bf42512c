package kvevents_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
)

// ---------------------------------------------------------------------
// Building msgpack payloads in tests, with vmihailenco's encoder (an
// encoder independent of the one under test) and explicit int widths.

type (
	u8  uint8
	u16 uint16
	u32 uint32
	u64 uint64
	i8  int8
	i16 int16
	i32 int32
	i64 int64
	f32 float32
	bin []byte
	raw []byte // appended verbatim: hand-made (often broken) msgpack
	kv  []any  // a map, as key, value, key, value... in wire order
)

func pack(t testing.TB, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	if err := packValue(e, &buf, v); err != nil {
		t.Fatalf("pack %v: %v", v, err)
	}
	return buf.Bytes()
}

func packValue(e *msgpack.Encoder, buf *bytes.Buffer, v any) error {
	switch v := v.(type) {
	case nil:
		return e.EncodeNil()
	case bool:
		return e.EncodeBool(v)
	case int:
		return e.EncodeInt(int64(v)) // smallest encoding, like msgspec
	case uint64:
		return e.EncodeUint(v)
	case u8:
		return e.EncodeUint8(uint8(v))
	case u16:
		return e.EncodeUint16(uint16(v))
	case u32:
		return e.EncodeUint32(uint32(v))
	case u64:
		return e.EncodeUint64(uint64(v))
	case i8:
		return e.EncodeInt8(int8(v))
	case i16:
		return e.EncodeInt16(int16(v))
	case i32:
		return e.EncodeInt32(int32(v))
	case i64:
		return e.EncodeInt64(int64(v))
	case float64:
		return e.EncodeFloat64(v)
	case f32:
		return e.EncodeFloat32(float32(v))
	case string:
		return e.EncodeString(v)
	case bin:
		return e.EncodeBytes(v)
	case raw:
		_, err := buf.Write(v)
		return err
	case []any:
		if err := e.EncodeArrayLen(len(v)); err != nil {
			return err
		}
		for _, x := range v {
			if err := packValue(e, buf, x); err != nil {
				return err
			}
		}
		return nil
	case kv:
		if err := e.EncodeMapLen(len(v) / 2); err != nil {
			return err
		}
		for _, x := range v {
			if err := packValue(e, buf, x); err != nil {
				return err
			}
		}
		return nil
	case []uint64:
		if err := e.EncodeArrayLen(len(v)); err != nil {
			return err
		}
		for _, x := range v {
			if err := e.EncodeUint(x); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("packValue: unsupported %T", v)
}

// ---------------------------------------------------------------------
// Golden vectors.

type wireVector struct {
	Note       string          `json:"note"`
	PayloadHex string          `json:"payload_hex"`
	Decoded    json.RawMessage `json:"decoded"`
}

type wireVectors struct {
	Wire    map[string]json.RawMessage `json:"wire"`
	Range48 struct {
		Tokens []uint64 `json:"tokens"`
		Blocks []struct {
			Index   int    `json:"index"`
			HashHex string `json:"hash_hex"`
			Int     uint64 `json:"event_int"`
		} `json:"blocks"`
	} `json:"range48_sha256_cbor_seed0"`
}

// goldenPayloads lists the wire vectors that are payloads, with the shape
// that produced them.
var goldenPayloads = []struct {
	name  string
	shape kvevents.Shape
	bytes bool
}{
	{"map_events_current", kvevents.ShapeMap, false},
	{"array_events_all_fields", kvevents.ShapeArray, false},
	{"array_events_v0_9_0", kvevents.ShapeV090, false},
	{"map_events_bytes_hashes", kvevents.ShapeMap, true},
	{"small_example", kvevents.ShapeMap, false},
	{"small_example_array", kvevents.ShapeArray, false},
}

func loadWireVectors(t testing.TB) wireVectors {
	t.Helper()
	raw, err := os.ReadFile("testdata/wire_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v wireVectors
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func (v wireVectors) vector(t testing.TB, name string) wireVector {
	t.Helper()
	var w wireVector
	if err := json.Unmarshal(v.Wire[name], &w); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return w
}

func (w wireVector) payload(t testing.TB) []byte {
	t.Helper()
	p, err := hex.DecodeString(w.PayloadHex)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// batchFromJSON builds the Batch a JSON "decoded" form stands for. It is a
// second, independent reading of the wire layouts (from the generic JSON
// tree rather than the msgpack stream), so the decoder is checked against
// it rather than against itself.
func batchFromJSON(t testing.TB, rawJSON json.RawMessage) *kvevents.Batch {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(rawJSON))
	dec.UseNumber()
	var top []any
	if err := dec.Decode(&top); err != nil {
		t.Fatal(err)
	}
	num := func(x any) json.Number { return x.(json.Number) }
	u64 := func(x any) uint64 {
		var v uint64
		if _, err := fmt.Sscan(string(num(x)), &v); err != nil {
			t.Fatalf("uint64 %v: %v", x, err)
		}
		return v
	}
	hash := func(x any) (uint64, []byte) {
		if m, ok := x.(map[string]any); ok {
			d, err := hex.DecodeString(m["$bytes"].(string))
			if err != nil {
				t.Fatal(err)
			}
			return blockhash.KeyOfDigest(blockhash.SHA256CBOR, d), d
		}
		return u64(x), nil
	}
	str := func(x any) string {
		if x == nil {
			return ""
		}
		return x.(string)
	}
	b := &kvevents.Batch{}
	ts, _ := num(top[0]).Float64()
	b.TS = ts
	if len(top) > 2 && top[2] != nil {
		b.HasDPRank, b.DPRank = true, int(u64(top[2]))
	}
	stored := []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
	removed := []string{"block_hashes", "medium", "group_idx"}
	for _, e := range top[1].([]any) {
		fields := map[string]any{}
		var tag string
		switch e := e.(type) {
		case map[string]any:
			tag = e["type"].(string)
			for k, v := range e {
				fields[k] = v
			}
		case []any:
			tag = e[0].(string)
			names := stored
			if tag == "BlockRemoved" {
				names = removed
			}
			for i, v := range e[1:] {
				fields[names[i]] = v
			}
		}
		var ev kvevents.Event
		switch tag {
		case "BlockStored":
			ev.Kind = kvevents.BlockStored
		case "BlockRemoved":
			ev.Kind = kvevents.BlockRemoved
		case "AllBlocksCleared":
			ev.Kind = kvevents.AllBlocksCleared
		default:
			t.Fatalf("tag %q", tag)
		}
		if hs, ok := fields["block_hashes"].([]any); ok {
			for _, h := range hs {
				k, d := hash(h)
				ev.Hashes = append(ev.Hashes, k)
				if d != nil {
					ev.Digests = append(ev.Digests, d)
				}
			}
		}
		if p := fields["parent_block_hash"]; p != nil {
			ev.HasParent = true
			ev.Parent, ev.ParentDigest = hash(p)
		}
		if ts, ok := fields["token_ids"].([]any); ok {
			for _, x := range ts {
				ev.TokenIDs = append(ev.TokenIDs, u64(x))
			}
		}
		if x := fields["block_size"]; x != nil {
			ev.BlockSize = int(u64(x))
		}
		if x := fields["lora_id"]; x != nil {
			ev.HasLoRAID, ev.LoRAID = true, int64(u64(x))
		}
		ev.Medium = str(fields["medium"])
		ev.LoRAName = str(fields["lora_name"])
		if x, ok := fields["extra_keys"].([]any); ok {
			ev.ExtraKeys = make([]blockhash.BlockExtra, len(x))
			for i, k := range x {
				if k != nil {
					t.Fatalf("golden extra keys beyond None are not expected: %v", k)
				}
				ev.ExtraKeys[i] = nil
			}
		}
		if x := fields["group_idx"]; x != nil {
			ev.GroupIdx = int(u64(x))
		}
		ev.SpecKind = str(fields["kv_cache_spec_kind"])
		if x := fields["kv_cache_spec_sliding_window"]; x != nil {
			ev.SlidingWindow = int(u64(x))
		}
		b.Events = append(b.Events, ev)
	}
	return b
}

// diffBatch describes how two batches differ, or returns "". Slices
// compare by content, except that the nil-ness of ExtraKeys, of each
// BlockExtra and of Digests is significant (it carries meaning).
// Skipped is not compared.
func diffBatch(got, want *kvevents.Batch) string {
	if math.Float64bits(got.TS) != math.Float64bits(want.TS) {
		return fmt.Sprintf("TS %v, want %v", got.TS, want.TS)
	}
	if got.HasDPRank != want.HasDPRank || got.DPRank != want.DPRank {
		return fmt.Sprintf("dp rank (%v, %d), want (%v, %d)", got.HasDPRank, got.DPRank, want.HasDPRank, want.DPRank)
	}
	if len(got.Events) != len(want.Events) {
		return fmt.Sprintf("%d events, want %d", len(got.Events), len(want.Events))
	}
	for i := range got.Events {
		if d := diffEvent(&got.Events[i], &want.Events[i]); d != "" {
			return fmt.Sprintf("event %d: %s", i, d)
		}
	}
	return ""
}

func diffEvent(g, w *kvevents.Event) string {
	switch {
	case g.Kind != w.Kind:
		return fmt.Sprintf("kind %v, want %v", g.Kind, w.Kind)
	case !slices.Equal(g.Hashes, w.Hashes):
		return fmt.Sprintf("hashes %v, want %v", g.Hashes, w.Hashes)
	case (g.Digests == nil) != (w.Digests == nil) || !slices.EqualFunc(g.Digests, w.Digests, bytes.Equal):
		return fmt.Sprintf("digests %x, want %x", g.Digests, w.Digests)
	case g.Medium != w.Medium:
		return fmt.Sprintf("medium %q, want %q", g.Medium, w.Medium)
	case g.GroupIdx != w.GroupIdx:
		return fmt.Sprintf("group %d, want %d", g.GroupIdx, w.GroupIdx)
	case g.HasParent != w.HasParent || g.Parent != w.Parent:
		return fmt.Sprintf("parent (%v, %d), want (%v, %d)", g.HasParent, g.Parent, w.HasParent, w.Parent)
	case !bytes.Equal(g.ParentDigest, w.ParentDigest):
		return fmt.Sprintf("parent digest %x, want %x", g.ParentDigest, w.ParentDigest)
	case !slices.Equal(g.TokenIDs, w.TokenIDs):
		return fmt.Sprintf("tokens %v, want %v", g.TokenIDs, w.TokenIDs)
	case g.BlockSize != w.BlockSize:
		return fmt.Sprintf("block size %d, want %d", g.BlockSize, w.BlockSize)
	case g.HasLoRAID != w.HasLoRAID || g.LoRAID != w.LoRAID:
		return fmt.Sprintf("lora id (%v, %d), want (%v, %d)", g.HasLoRAID, g.LoRAID, w.HasLoRAID, w.LoRAID)
	case g.LoRAName != w.LoRAName:
		return fmt.Sprintf("lora name %q, want %q", g.LoRAName, w.LoRAName)
	case g.SpecKind != w.SpecKind:
		return fmt.Sprintf("spec kind %q, want %q", g.SpecKind, w.SpecKind)
	case g.SlidingWindow != w.SlidingWindow:
		return fmt.Sprintf("sliding window %d, want %d", g.SlidingWindow, w.SlidingWindow)
	}
	if d := diffExtraKeys(g.ExtraKeys, w.ExtraKeys); d != "" {
		return "extra keys: " + d
	}
	return ""
}

func diffExtraKeys(g, w []blockhash.BlockExtra) string {
	if (g == nil) != (w == nil) || len(g) != len(w) {
		return fmt.Sprintf("%v (nil %v), want %v (nil %v)", g, g == nil, w, w == nil)
	}
	for i := range g {
		if (g[i] == nil) != (w[i] == nil) || !valuesEqual(g[i], w[i]) {
			return fmt.Sprintf("block %d: %v, want %v", i, g[i], w[i])
		}
	}
	return ""
}

func valuesEqual(a, b []blockhash.Value) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.Kind != y.Kind || x.Str != y.Str || x.Int != y.Int || !bytes.Equal(x.Bytes, y.Bytes) || !valuesEqual(x.Tuple, y.Tuple) {
			return false
		}
	}
	return true
}

func decode(t testing.TB, d *kvevents.Decoder, payload []byte) *kvevents.Batch {
	t.Helper()
	var b kvevents.Batch
	if err := d.Decode(payload, &b); err != nil {
		t.Fatalf("Decode: %v", err)
	}
	return &b
}

// TestDecodeGolden decodes every msgspec payload of the golden vectors and
// compares it with the vectors' JSON form.
func TestDecodeGolden(t *testing.T) {
	v := loadWireVectors(t)
	for _, g := range goldenPayloads {
		t.Run(g.name, func(t *testing.T) {
			w := v.vector(t, g.name)
			got := decode(t, &kvevents.Decoder{}, w.payload(t))
			want := batchFromJSON(t, w.Decoded)
			if d := diffBatch(got, want); d != "" {
				t.Fatal(d)
			}
			if got.Skipped != 0 {
				t.Errorf("Skipped = %d", got.Skipped)
			}
		})
	}
}

// TestDecodeGoldenKnownValues checks the golden payloads against values
// known independently of the JSON form: the range48 block hashes of
// sha256_cbor with seed "0", tokens 0..47, block size 16.
func TestDecodeGoldenKnownValues(t *testing.T) {
	v := loadWireVectors(t)
	var want []uint64
	for _, b := range v.Range48.Blocks {
		want = append(want, b.Int)
	}
	// The blockhash package computes the same keys from the tokens.
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 16})
	chain, err := h.Chain(nil, nil, 0, testutil.Seq(0, 48), nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range chain {
		if chain[i].Key != want[i] {
			t.Fatalf("blockhash block %d = %d, vectors say %d", i, chain[i].Key, want[i])
		}
	}
	for _, name := range []string{"map_events_current", "array_events_all_fields", "array_events_v0_9_0", "map_events_bytes_hashes"} {
		t.Run(name, func(t *testing.T) {
			b := decode(t, &kvevents.Decoder{}, v.vector(t, name).payload(t))
			if b.TS != 1750000000.5 {
				t.Errorf("TS = %v", b.TS)
			}
			wantEvents := 3
			if name == "map_events_bytes_hashes" {
				wantEvents = 2
			}
			if len(b.Events) != wantEvents {
				t.Fatalf("%d events, want %d", len(b.Events), wantEvents)
			}
			st := b.Events[0]
			if st.Kind != kvevents.BlockStored || !slices.Equal(st.Hashes, want) || !slices.Equal(st.TokenIDs, testutil.Seq(0, 48)) ||
				st.BlockSize != 16 || st.HasParent || st.HasLoRAID {
				t.Errorf("BlockStored = %+v", st)
			}
			rm := b.Events[1]
			if rm.Kind != kvevents.BlockRemoved || !slices.Equal(rm.Hashes, want[2:]) {
				t.Errorf("BlockRemoved = %+v", rm)
			}
			if name == "array_events_v0_9_0" {
				if b.HasDPRank || st.Medium != "" || st.ExtraKeys != nil || st.SpecKind != "" {
					t.Errorf("v0.9.0 batch has fields that version lacks: %+v", b)
				}
			} else {
				if !b.HasDPRank || b.DPRank != 0 || st.Medium != "GPU" || rm.Medium != "GPU" || st.SpecKind != "full_attention" ||
					len(st.ExtraKeys) != 3 || st.ExtraKeys[0] != nil {
					t.Errorf("batch = %+v", b)
				}
			}
			if name == "map_events_bytes_hashes" {
				for i, d := range st.Digests {
					if hex.EncodeToString(d) != v.Range48.Blocks[i].HashHex {
						t.Errorf("digest %d = %x", i, d)
					}
					if !bytes.Equal(d, chain[i].Digest()) {
						t.Errorf("digest %d differs from blockhash's", i)
					}
				}
			} else if st.Digests != nil {
				t.Errorf("int hashes produced digests %x", st.Digests)
			}
			if wantEvents == 3 && b.Events[2].Kind != kvevents.AllBlocksCleared {
				t.Errorf("event 2 = %v", b.Events[2].Kind)
			}
		})
	}
}

// storedFields are the positional BlockStored fields after the tag, in
// the newest layout, with non-default values.
func storedFields() []any {
	return []any{
		[]any{uint64(11), uint64(22)}, // block_hashes
		uint64(10),                    // parent_block_hash
		testutil.Seq(0, 8),            // token_ids
		4,                             // block_size
		7,                             // lora_id
		"CPU",                         // medium
		"sql-lora",                    // lora_name
		[]any{nil, []any{"tenant-a", []any{"img", -12}}}, // extra_keys
		2,                // group_idx
		"sliding_window", // kv_cache_spec_kind
		4096,             // kv_cache_spec_sliding_window
	}
}

// storedAfter returns the Event the first n fields of storedFields give.
func storedAfter(n int) kvevents.Event {
	ev := kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{11, 22}, HasParent: true, Parent: 10, TokenIDs: testutil.Seq(0, 8), BlockSize: 4}
	if n > 4 {
		ev.HasLoRAID, ev.LoRAID = true, 7
	}
	if n > 5 {
		ev.Medium = "CPU"
	}
	if n > 6 {
		ev.LoRAName = "sql-lora"
	}
	if n > 7 {
		ev.ExtraKeys = []blockhash.BlockExtra{nil, {blockhash.Str("tenant-a"), blockhash.Tuple(blockhash.Str("img"), blockhash.Int(-12))}}
	}
	if n > 8 {
		ev.GroupIdx = 2
	}
	if n > 9 {
		ev.SpecKind = "sliding_window"
	}
	if n > 10 {
		ev.SlidingWindow = 4096
	}
	return ev
}

// TestDecodeArrayLengths decodes BlockStored arrays of every historical
// length (5 to 12 elements with the tag) and longer ones from the future.
func TestDecodeArrayLengths(t *testing.T) {
	all := storedFields()
	for n := 4; n <= len(all)+2; n++ {
		t.Run(fmt.Sprintf("%d_elements", n+1), func(t *testing.T) {
			fields := slices.Clone(all[:min(n, len(all))])
			for len(fields) < n {
				fields = append(fields, kv{"future", []any{1, 2}}) // unknown trailing fields
			}
			payload := pack(t, []any{1.5, []any{append([]any{"BlockStored"}, fields...)}, 0})
			got := decode(t, &kvevents.Decoder{}, payload)
			want := &kvevents.Batch{TS: 1.5, HasDPRank: true, Events: []kvevents.Event{storedAfter(n)}}
			if d := diffBatch(got, want); d != "" {
				t.Fatal(d)
			}
		})
	}
	removed := []any{[]any{uint64(5)}, "GPU", 3, "future"}
	for n := 1; n <= len(removed); n++ {
		t.Run(fmt.Sprintf("BlockRemoved_%d_elements", n+1), func(t *testing.T) {
			payload := pack(t, []any{1.5, []any{append([]any{"BlockRemoved"}, removed[:n]...)}})
			want := kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: []uint64{5}}
			if n > 1 {
				want.Medium = "GPU"
			}
			if n > 2 {
				want.GroupIdx = 3
			}
			if d := diffEvent(&decode(t, &kvevents.Decoder{}, payload).Events[0], &want); d != "" {
				t.Fatal(d)
			}
		})
	}
}

// TestDecodeTable covers layouts and value encodings one by one.
func TestDecodeTable(t *testing.T) {
	stored := func(hashes any, parent any) []any {
		return []any{"BlockStored", hashes, parent, testutil.Seq(0, 4), 4, nil}
	}
	ev := func(e kvevents.Event) []kvevents.Event { return []kvevents.Event{e} }
	digest := bytes.Repeat([]byte{0xab}, 31)
	digest = append(digest, 0x01)
	hybrid := make([]byte, 64)
	for i := range hybrid {
		hybrid[i] = byte(i)
	}
	tests := []struct {
		name    string
		flavor  kvevents.Flavor
		payload any
		want    kvevents.Batch
		skipped int
	}{
		{
			name:    "two-element batch",
			payload: []any{2.5, []any{[]any{"AllBlocksCleared"}}},
			want:    kvevents.Batch{TS: 2.5, Events: ev(kvevents.Event{Kind: kvevents.AllBlocksCleared})},
		},
		{
			name:    "nil dp rank",
			payload: []any{2.5, []any{}, nil},
			want:    kvevents.Batch{TS: 2.5},
		},
		{
			name:    "dp rank and trailing batch elements",
			payload: []any{2.5, []any{}, 3, "future", kv{"x", 1}},
			want:    kvevents.Batch{TS: 2.5, HasDPRank: true, DPRank: 3},
		},
		{
			name:    "int timestamp",
			payload: []any{1750000000, []any{}},
			want:    kvevents.Batch{TS: 1750000000},
		},
		{
			name:    "float32 timestamp",
			payload: []any{f32(0.5), []any{}},
			want:    kvevents.Batch{TS: 0.5},
		},
		{
			name:    "map-shaped batch",
			payload: kv{"data_parallel_rank", 1, "events", []any{[]any{"AllBlocksCleared"}}, "ts", 3.0, "other", []any{1}},
			want:    kvevents.Batch{TS: 3, HasDPRank: true, DPRank: 1, Events: ev(kvevents.Event{Kind: kvevents.AllBlocksCleared})},
		},
		{
			name: "hash int widths",
			payload: []any{1.0, []any{stored([]any{
				5, u8(200), u16(60000), u32(4000000000), u64(1 << 63), i8(5), i16(-2), i32(-3), i64(math.MinInt64), -1,
			}, nil)}},
			want: kvevents.Batch{TS: 1, Events: ev(kvevents.Event{Kind: kvevents.BlockStored, BlockSize: 4, TokenIDs: testutil.Seq(0, 4),
				Hashes: []uint64{5, 200, 60000, 4000000000, 1 << 63, 5, math.MaxUint64 - 1, math.MaxUint64 - 2, 1 << 63, math.MaxUint64}})},
		},
		{
			name:    "negative int64 hash and parent (SGLang, old builtin hash)",
			payload: []any{1.0, []any{stored([]any{i64(-5758849010611061604)}, i64(-1))}},
			want: kvevents.Batch{TS: 1, Events: ev(kvevents.Event{Kind: kvevents.BlockStored, BlockSize: 4, TokenIDs: testutil.Seq(0, 4),
				Hashes: []uint64{12687895063098490012}, HasParent: true, Parent: math.MaxUint64})},
		},
		{
			name:    "bytes hashes of every length, bin and str",
			payload: []any{1.0, []any{stored([]any{bin(digest), bin([]byte{1, 2}), string([]byte{0, 0, 0, 0, 0, 0, 0, 0, 9}), bin(hybrid)}, bin(digest))}},
			want: kvevents.Batch{TS: 1, Events: ev(kvevents.Event{Kind: kvevents.BlockStored, BlockSize: 4, TokenIDs: testutil.Seq(0, 4),
				Hashes:    []uint64{0xabababababab_ab01, 0x0102, 9, 0x38393a3b3c3d3e3f},
				Digests:   [][]byte{digest, {1, 2}, {0, 0, 0, 0, 0, 0, 0, 0, 9}, hybrid},
				HasParent: true, Parent: 0xababababababab01, ParentDigest: digest})},
		},
		{
			name:    "int and bytes hashes mixed",
			payload: []any{1.0, []any{stored([]any{7, bin([]byte{8})}, nil)}},
			want: kvevents.Batch{TS: 1, Events: ev(kvevents.Event{Kind: kvevents.BlockStored, BlockSize: 4, TokenIDs: testutil.Seq(0, 4),
				Hashes: []uint64{7, 8}, Digests: [][]byte{nil, {8}}})},
		},
		{
			name:    "empty bytes parent means none",
			payload: []any{1.0, []any{stored([]any{7}, bin([]byte{}))}},
			want:    kvevents.Batch{TS: 1, Events: ev(kvevents.Event{Kind: kvevents.BlockStored, BlockSize: 4, TokenIDs: testutil.Seq(0, 4), Hashes: []uint64{7}})},
		},
		{
			name: "token ids of every width",
			payload: []any{1.0, []any{[]any{"BlockStored", []any{1}, nil,
				[]any{0, 127, u8(128), u16(65535), u32(1 << 31), u64(1 << 40), i8(3), i16(300), i32(70000), i64(1 << 33)}, 10, nil}}},
			want: kvevents.Batch{TS: 1, Events: ev(kvevents.Event{Kind: kvevents.BlockStored, BlockSize: 10, Hashes: []uint64{1},
				TokenIDs: []uint64{0, 127, 128, 65535, 1 << 31, 1 << 40, 3, 300, 70000, 1 << 33}})},
		},
		{
			name: "unknown tags in the middle of a batch are skipped",
			payload: []any{1.0, []any{
				[]any{"AllBlocksCleared"},
				[]any{"BlockOffloaded", []any{1, 2}, kv{"deep", []any{[]any{[]any{}}}}},
				kv{"type", "BlockPinned", "block_hashes", []any{1}},
				[]any{7, "int tag"},
				[]any{bin("BlockRemoved"), []any{3}},
				kv{"block_hashes", []any{4}, "type", "Mystery"},
			}},
			want: kvevents.Batch{TS: 1, Events: []kvevents.Event{
				{Kind: kvevents.AllBlocksCleared},
				{Kind: kvevents.BlockRemoved, Hashes: []uint64{3}},
			}},
			skipped: 4,
		},
		{
			name: "map events with defaults omitted and unknown keys",
			payload: []any{1.0, []any{
				kv{"type", "BlockStored", "block_hashes", []any{1}, "parent_block_hash", nil, "token_ids", testutil.Seq(5, 2), "block_size", 2,
					"lora_id", nil, "medium", nil, "lora_name", nil, "locality", kv{"node", "a"}},
				kv{"type", "BlockRemoved", "block_hashes", []any{1}, "medium", "CPU", "ownership", 1},
				kv{"type", "AllBlocksCleared", "reason", "reset"},
			}, 0},
			want: kvevents.Batch{TS: 1, HasDPRank: true, Events: []kvevents.Event{
				{Kind: kvevents.BlockStored, Hashes: []uint64{1}, TokenIDs: testutil.Seq(5, 2), BlockSize: 2},
				{Kind: kvevents.BlockRemoved, Hashes: []uint64{1}, Medium: "CPU"},
				{Kind: kvevents.AllBlocksCleared},
			}},
		},
		{
			name: "map event with the tag not first",
			payload: []any{1.0, []any{
				kv{"block_hashes", []any{9}, "medium", "GPU", "type", "BlockRemoved", "group_idx", 1},
			}},
			want: kvevents.Batch{TS: 1, Events: ev(kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: []uint64{9}, Medium: "GPU", GroupIdx: 1})},
		},
		{
			name: "extra keys: nil, None entries, empty tuple, nesting, bytes",
			payload: []any{1.0, []any{
				[]any{"BlockStored", []any{1, 2, 3}, nil, testutil.Seq(0, 3), 1, nil, nil, nil,
					[]any{nil, []any{}, []any{"lora", bin([]byte{1, 2}), []any{"img", u16(4), []any{i8(-1)}}}}},
				[]any{"BlockStored", []any{1}, nil, testutil.Seq(0, 1), 1, nil, nil, nil, nil},
				[]any{"BlockStored", []any{}, nil, []any{}, 1, nil, nil, nil, []any{}},
			}},
			want: kvevents.Batch{TS: 1, Events: []kvevents.Event{
				{Kind: kvevents.BlockStored, Hashes: []uint64{1, 2, 3}, TokenIDs: testutil.Seq(0, 3), BlockSize: 1,
					ExtraKeys: []blockhash.BlockExtra{nil, {}, {blockhash.Str("lora"), blockhash.Bytes([]byte{1, 2}),
						blockhash.Tuple(blockhash.Str("img"), blockhash.Int(4), blockhash.Tuple(blockhash.Int(-1)))}}},
				{Kind: kvevents.BlockStored, Hashes: []uint64{1}, TokenIDs: testutil.Seq(0, 1), BlockSize: 1},
				{Kind: kvevents.BlockStored, BlockSize: 1, ExtraKeys: []blockhash.BlockExtra{}},
			}},
		},
		{
			name:    "str tag as bin",
			payload: []any{1.0, []any{[]any{bin("AllBlocksCleared"), "future"}}},
			want:    kvevents.Batch{TS: 1, Events: ev(kvevents.Event{Kind: kvevents.AllBlocksCleared})},
		},
		{
			name:   "SGLang positional fields, medium, later fields ignored",
			flavor: kvevents.FlavorSGLang,
			payload: []any{1.0, []any{
				[]any{"BlockStored", []any{i64(-2), i64(3)}, i64(-9), testutil.Seq(1, 8), 4, nil, "GPU", kv{"meta", 1}, []any{"x"}},
				[]any{"BlockRemoved", []any{i64(-2)}, "GPU", 5},
			}, 1},
			want: kvevents.Batch{TS: 1, HasDPRank: true, DPRank: 1, Events: []kvevents.Event{
				{Kind: kvevents.BlockStored, Hashes: []uint64{math.MaxUint64 - 1, 3}, HasParent: true, Parent: math.MaxUint64 - 8,
					TokenIDs: testutil.Seq(1, 8), BlockSize: 4, Medium: "GPU"},
				{Kind: kvevents.BlockRemoved, Hashes: []uint64{math.MaxUint64 - 1}, Medium: "GPU"},
			}},
		},
		{
			name:    "SGLang bytes hashes key on their first 8 bytes",
			flavor:  kvevents.FlavorSGLang,
			payload: []any{1.0, []any{[]any{"BlockRemoved", []any{bin(digest)}}}},
			want: kvevents.Batch{TS: 1, Events: ev(kvevents.Event{Kind: kvevents.BlockRemoved,
				Hashes: []uint64{0xabababababababab}, Digests: [][]byte{digest}})},
		},
		{
			name:    "SGLang attn_dp_rank in a map batch",
			flavor:  kvevents.FlavorSGLang,
			payload: kv{"ts", 1.0, "events", []any{}, "attn_dp_rank", 2},
			want:    kvevents.Batch{TS: 1, HasDPRank: true, DPRank: 2},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := &kvevents.Decoder{Flavor: tc.flavor}
			got := decode(t, d, pack(t, tc.payload))
			if diff := diffBatch(got, &tc.want); diff != "" {
				t.Fatal(diff)
			}
			if got.Skipped != tc.skipped {
				t.Errorf("Skipped = %d, want %d", got.Skipped, tc.skipped)
			}
		})
	}
}

// TestDecodeErrors feeds malformed and hostile payloads and checks the
// error class and message.
func TestDecodeErrors(t *testing.T) {
	bigLen := func(code byte) raw { return raw{code, 0xff, 0xff, 0xff, 0xff} }
	deep := []any{"x"}
	for i := 0; i < 9; i++ {
		deep = []any{deep}
	}
	nested := make([]byte, 0, 200001)
	for i := 0; i < 200000; i++ {
		nested = append(nested, 0x91)
	}
	nested = append(nested, 0xc0)
	small := kvevents.Limits{MaxEvents: 2, MaxHashes: 2, MaxTokens: 3, MaxDigest: 40, MaxPayload: 1 << 10}
	good := []any{"BlockStored", []any{1}, nil, testutil.Seq(0, 2), 2, nil}
	tests := []struct {
		name    string
		flavor  kvevents.Flavor
		limits  kvevents.Limits
		payload any
		class   error
		msg     string
	}{
		{"empty payload", 0, kvevents.Limits{}, raw{}, kvevents.ErrMalformed, "kvevents: batch: truncated"},
		{"batch is an int", 0, kvevents.Limits{}, 5, kvevents.ErrMalformed, "batch: expected array or map, got int"},
		{"one-element batch", 0, kvevents.Limits{}, []any{1.0}, kvevents.ErrMalformed, "got 1 elements"},
		{"ts is a str", 0, kvevents.Limits{}, []any{"now", []any{}}, kvevents.ErrMalformed, "batch: ts: expected float, got str"},
		{"events is a map", 0, kvevents.Limits{}, []any{1.0, kv{}}, kvevents.ErrMalformed, "batch: events: expected array, got map"},
		{"negative dp rank", 0, kvevents.Limits{}, []any{1.0, []any{}, -1}, kvevents.ErrMalformed, "data_parallel_rank: negative value -1"},
		{"map batch without events", 0, kvevents.Limits{}, kv{"ts", 1.0}, kvevents.ErrMalformed, "has no events"},
		{"trailing bytes", 0, kvevents.Limits{}, raw(append(pack(t, []any{1.0, []any{}}), 0xc0)), kvevents.ErrMalformed,
			"batch: 1 trailing bytes after the batch"},
		{"event is an int", 0, kvevents.Limits{}, []any{1.0, []any{1}}, kvevents.ErrMalformed, "event 0: expected array or map, got int"},
		{"empty event array", 0, kvevents.Limits{}, []any{1.0, []any{[]any{}}}, kvevents.ErrMalformed, "event 0: empty event array has no tag"},
		{"BlockStored too short", 0, kvevents.Limits{}, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil}}}, kvevents.ErrMalformed,
			"event 0 (BlockStored): expected at least 4 fields after the tag, got 2"},
		{"BlockRemoved without hashes", 0, kvevents.Limits{}, []any{1.0, []any{[]any{"BlockRemoved"}}}, kvevents.ErrMalformed,
			"event 0 (BlockRemoved): expected at least 1 fields"},
		{"token ids is a str", 0, kvevents.Limits{}, []any{1.0, []any{good, []any{"AllBlocksCleared"}, []any{"AllBlocksCleared"},
			[]any{"BlockStored", []any{1}, nil, "0 1 2", 2, nil}}}, kvevents.ErrMalformed,
			"kvevents: event 3 (BlockStored): token_ids: expected array, got str"},
		{"token is a str", 0, kvevents.Limits{}, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{1, "2"}, 2, nil}}}, kvevents.ErrMalformed,
			"token_ids[1]: expected int, got str"},
		{"negative token", 0, kvevents.Limits{}, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{1, -2}, 2, nil}}}, kvevents.ErrMalformed,
			"token_ids[1]: negative token id"},
		{"hash is nil", 0, kvevents.Limits{}, []any{1.0, []any{[]any{"BlockRemoved", []any{1, nil}}}}, kvevents.ErrMalformed,
			"block_hashes[1]: expected int or bytes, got nil"},
		{"hash is a float", 0, kvevents.Limits{}, []any{1.0, []any{[]any{"BlockRemoved", []any{1.5}}}}, kvevents.ErrMalformed,
			"block_hashes[0]: expected int or bytes, got float"},
		{"empty digest", 0, kvevents.Limits{}, []any{1.0, []any{[]any{"BlockRemoved", []any{bin{}}}}}, kvevents.ErrMalformed,
			"block_hashes[0]: empty digest"},
		{"parent is an array", 0, kvevents.Limits{}, []any{1.0, []any{[]any{"BlockStored", []any{1}, []any{}, testutil.Seq(0, 2), 2}}}, kvevents.ErrMalformed,
			"parent_block_hash: expected int, bytes or nil, got array"},
		{"block size is nil", 0, kvevents.Limits{}, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, testutil.Seq(0, 2), nil}}}, kvevents.ErrMalformed,
			"block_size: expected int, got nil"},
		{"negative block size", 0, kvevents.Limits{}, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, testutil.Seq(0, 2), -16}}}, kvevents.ErrMalformed,
			"block_size: negative value -16"},
		{"medium is an int", 0, kvevents.Limits{}, []any{1.0, []any{[]any{"BlockRemoved", []any{1}, 1}}}, kvevents.ErrMalformed,
			"medium: expected str or nil, got int"},
		{"lora id is a str", 0, kvevents.Limits{}, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, testutil.Seq(0, 2), 2, "x"}}}, kvevents.ErrMalformed,
			"lora_id: expected int or nil, got str"},
		{"lora id out of int64", 0, kvevents.Limits{}, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, testutil.Seq(0, 2), 2, uint64(1 << 63)}}}, kvevents.ErrMalformed,
			"lora_id: value 9223372036854775808 out of range"},
		{"extra keys is a str", 0, kvevents.Limits{}, []any{1.0, []any{append(slices.Clone(good), nil, nil, "x")}}, kvevents.ErrMalformed,
			"extra_keys: expected array, got str"},
		{"extra key entry is an int", 0, kvevents.Limits{}, []any{1.0, []any{append(slices.Clone(good), nil, nil, []any{5})}}, kvevents.ErrMalformed,
			"extra_keys[0]: expected array or nil, got int"},
		{"extra key value is nil", 0, kvevents.Limits{}, []any{1.0, []any{append(slices.Clone(good), nil, nil, []any{[]any{nil}})}}, kvevents.ErrMalformed,
			"extra_keys[0]: unsupported extra-key value nil"},
		{"extra keys too deep", 0, kvevents.Limits{}, []any{1.0, []any{append(slices.Clone(good), nil, nil, []any{deep})}}, kvevents.ErrTooLarge,
			"extra_keys[0]: extra keys nested deeper than 8"},
		{"map event without type", 0, kvevents.Limits{}, []any{1.0, []any{kv{"block_hashes", []any{1}}}}, kvevents.ErrMalformed,
			"event 0: event map has no \"type\" tag"},
		{"map key is an int", 0, kvevents.Limits{}, []any{1.0, []any{kv{1, 2}}}, kvevents.ErrMalformed, "expected a str map key, got int"},
		{"map BlockStored missing token_ids", 0, kvevents.Limits{}, []any{1.0, []any{kv{"type", "BlockStored", "block_hashes", []any{1}, "block_size", 2}}},
			kvevents.ErrMalformed, "event 0 (BlockStored): token_ids: missing field"},
		{"duplicate map key", 0, kvevents.Limits{}, []any{1.0, []any{kv{"type", "BlockRemoved", "block_hashes", []any{1}, "block_hashes", []any{2}}}},
			kvevents.ErrMalformed, "block_hashes: duplicate key"},
		{"truncated token list", 0, kvevents.Limits{}, raw(pack(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, testutil.Seq(1000, 4), 4}}})[:35]),
			kvevents.ErrMalformed, "token_ids[2]: truncated"},
		{"truncated inside a uint16 token", 0, kvevents.Limits{}, raw{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x95, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0x91, 1, 0xc0, 0x91, 0xcd, 0x01},
			kvevents.ErrMalformed, "token_ids[0]: truncated"},
		{"array declares more elements than bytes", 0, kvevents.Limits{}, bigLen(0xdd), kvevents.ErrMalformed,
			"batch: declares 4294967295 elements but only 0 bytes remain"},
		{"events declare more than bytes", 0, kvevents.Limits{}, []any{1.0, raw{0xdd, 0, 0x10, 0, 0}}, kvevents.ErrMalformed,
			"events: declares 1048576 elements but only"},
		{"token list declares more than bytes", 0, kvevents.Limits{}, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, raw{0xdd, 0, 0x3f, 0, 0}, 2}}},
			kvevents.ErrMalformed, "token_ids: declares 4128768 elements"},
		{"str declares more than bytes", 0, kvevents.Limits{}, []any{1.0, []any{[]any{"BlockRemoved", []any{1}, raw{0xdb, 0x7f, 0xff, 0xff, 0xff}}}},
			kvevents.ErrMalformed, "medium: truncated"},
		{"skipped value declares more than bytes", 0, kvevents.Limits{}, []any{1.0, []any{[]any{"Unknown", raw{0xdf, 0x7f, 0xff, 0xff, 0xff}}}},
			kvevents.ErrMalformed, "truncated"},
		{"deeply nested skipped value", 0, kvevents.Limits{}, []any{1.0, []any{[]any{"Unknown", raw(nested)}}, raw{0xc0}},
			nil, ""}, // fine: skipping is iterative; see below
		{"never-used code 0xc1", 0, kvevents.Limits{}, []any{1.0, []any{[]any{"Unknown", raw{0xc1}}}}, kvevents.ErrMalformed, "0xc1"},
		{"payload over the limit", 0, small, raw(make([]byte, 1025)), kvevents.ErrTooLarge, "payload of 1025 bytes exceeds the limit of 1024"},
		{"too many events", 0, small, []any{1.0, []any{[]any{"AllBlocksCleared"}, []any{"AllBlocksCleared"}, []any{"AllBlocksCleared"}}}, kvevents.ErrTooLarge,
			"events: 3 elements exceed the limit of 2"},
		{"too many hashes", 0, small, []any{1.0, []any{[]any{"BlockRemoved", []any{1, 2, 3}}}}, kvevents.ErrTooLarge,
			"block_hashes: 3 elements exceed the limit of 2"},
		{"too many tokens", 0, small, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, testutil.Seq(0, 4), 4}}}, kvevents.ErrTooLarge,
			"token_ids: 4 elements exceed the limit of 3"},
		{"too many hashes in the batch", 0, kvevents.Limits{MaxBatchHashes: 3}, []any{1.0, []any{[]any{"BlockRemoved", []any{1, 2}}, []any{"BlockRemoved", []any{3, 4}}}},
			kvevents.ErrTooLarge, "event 1 (BlockRemoved): block_hashes: the batch's hashes exceed the limit of 3"},
		{"too many tokens in the batch", 0, kvevents.Limits{MaxBatchTokens: 5}, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, testutil.Seq(0, 3), 3}, []any{"BlockStored", []any{1}, nil, testutil.Seq(0, 3), 3}}},
			kvevents.ErrTooLarge, "event 1 (BlockStored): token_ids: the batch's token ids exceed the limit of 5"},
		{"digest too long", 0, small, []any{1.0, []any{[]any{"BlockRemoved", []any{bin(make([]byte, 41))}}}}, kvevents.ErrTooLarge,
			"block_hashes[0]: digest of 41 bytes exceeds the limit of 40"},
		{"SGLang wrong type", kvevents.FlavorSGLang, kvevents.Limits{}, []any{1.0, []any{[]any{"BlockStored", "h", nil, testutil.Seq(0, 2), 2}}}, kvevents.ErrMalformed,
			"block_hashes: expected array, got str"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			payload := pack(t, tc.payload)
			d := &kvevents.Decoder{Flavor: tc.flavor, Limits: tc.limits}
			out := kvevents.Batch{Events: make([]kvevents.Event, 1, 4)}
			err := d.Decode(payload, &out)
			if tc.class == nil {
				if err != nil {
					t.Fatalf("Decode: %v", err)
				}
				if out.Skipped != 1 {
					t.Fatalf("Skipped = %d", out.Skipped)
				}
				return
			}
			if err == nil {
				t.Fatalf("case %d: Decode succeeded: %+v", i, out)
			}
			if !errors.Is(err, tc.class) {
				t.Errorf("error %q is not %v", err, tc.class)
			}
			other := kvevents.ErrTooLarge
			if tc.class == kvevents.ErrTooLarge {
				other = kvevents.ErrMalformed
			}
			if errors.Is(err, other) {
				t.Errorf("error %q is also %v", err, other)
			}
			var de *kvevents.DecodeError
			if !errors.As(err, &de) || de.Offset < 0 || de.Offset > len(payload) {
				t.Errorf("error %q is not a *DecodeError with a valid offset", err)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not contain %q", err, tc.msg)
			}
			if len(out.Events) != 0 || out.Skipped != 0 {
				t.Errorf("failed Decode left %d events, %d skipped", len(out.Events), out.Skipped)
			}
		})
	}
}

// TestDecodeHugeDeclaredSizesAllocateLittle checks that lengths an
// attacker declares are not trusted: a few bytes claiming billions of
// elements must fail without allocating for them.
func TestDecodeHugeDeclaredSizesAllocateLittle(t *testing.T) {
	payloads := [][]byte{
		{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff},
		{0x92, 0x00, 0x91, 0x95, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0x91, 1, 0xc0, 0xdd, 0x00, 0x3f, 0xff, 0xff},
		{0x92, 0x00, 0x91, 0x92, 0xac, 'B', 'l', 'o', 'c', 'k', 'R', 'e', 'm', 'o', 'v', 'e', 'd', 0x91, 0xc6, 0xff, 0xff, 0xff, 0xff},
		{0x92, 0x00, 0x91, 0x92, 0xa1, 'X', 0xdf, 0xff, 0xff, 0xff, 0xff},
		// Skipped values (unknown tag) with hostile lengths: bin32, str32, ext32.
		{0x92, 0x00, 0x91, 0x92, 0xa1, 'X', 0xc6, 0xff, 0xff, 0xff, 0xff, 1, 2, 3},
		{0x92, 0x00, 0x91, 0x92, 0xa1, 'X', 0xdb, 0xff, 0xff, 0xff, 0xff, 1, 2, 3},
		{0x92, 0x00, 0x91, 0x92, 0xa1, 'X', 0xc9, 0xff, 0xff, 0xff, 0xff, 7, 1, 2, 3},
	}
	var d kvevents.Decoder
	var out kvevents.Batch
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 4 { // a decoder that kept what a hostile length made it grow would show here
		for _, p := range payloads {
			_ = d.Decode(p, &out)
		}
	}
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 256<<10 {
		t.Fatalf("hostile payloads allocated %d bytes", n)
	}
	for i, p := range payloads {
		var err error
		allocs := testing.AllocsPerRun(20, func() { err = d.Decode(p, &out) })
		if err == nil {
			t.Fatalf("payload %d decoded", i)
		}
		if !errors.Is(err, kvevents.ErrMalformed) && !errors.Is(err, kvevents.ErrTooLarge) {
			t.Errorf("payload %d: %v", i, err)
		}
		// Only the error itself is allocated.
		if allocs > 10 {
			t.Errorf("payload %d: %v allocations", i, allocs)
		}
		if t.Failed() {
			return
		}
	}
}

// TestDecodeReusesSlots decodes different payloads into one Batch and
// checks each result against a fresh decode: reused slots must not leak
// values from earlier batches.
func TestDecodeReusesSlots(t *testing.T) {
	v := loadWireVectors(t)
	var payloads [][]byte
	for _, g := range goldenPayloads {
		payloads = append(payloads, v.vector(t, g.name).payload(t))
	}
	payloads = append(payloads,
		pack(t, []any{1.0, []any{append([]any{"BlockStored"}, storedFields()...), []any{"BlockRemoved", []any{bin{1, 2, 3}}, "CPU", 4}}, 3}),
		pack(t, []any{1.0, []any{[]any{"BlockRemoved", []any{5}}, []any{"BlockStored", []any{1}, nil, testutil.Seq(0, 1), 1}}}),
		pack(t, []any{1.0, []any{[]any{"BlockStored", []any{1, 2}, bin{9}, testutil.Seq(0, 2), 1, nil, nil, "lora-b", []any{[]any{"lora-b", []any{"img", 3}}, []any{"lora-b"}}}}}),
		pack(t, []any{1.0, []any{[]any{"BlockStored", []any{1, 2}, nil, testutil.Seq(0, 2), 1, nil, nil, "lora-b", []any{[]any{"lora-c", []any{"img", 4}}, nil}}}}),
	)
	var d kvevents.Decoder
	var reused kvevents.Batch
	for round := 0; round < 3; round++ {
		for i, p := range payloads {
			if err := d.Decode(p, &reused); err != nil {
				t.Fatalf("payload %d: %v", i, err)
			}
			fresh := decode(t, &d, p)
			if diff := diffBatch(&reused, fresh); diff != "" {
				t.Fatalf("round %d payload %d: reused batch differs: %s", round, i, diff)
			}
		}
	}
}

// TestDecodeSteadyStateAllocs checks that decoding the benchmark batch
// into a warm Batch does not allocate.
func TestDecodeSteadyStateAllocs(t *testing.T) {
	for _, shape := range []kvevents.Shape{kvevents.ShapeMap, kvevents.ShapeArray} {
		payload, err := kvevents.AppendBatch(nil, benchBatch(), kvevents.EncodeOptions{Shape: shape})
		if err != nil {
			t.Fatal(err)
		}
		var d kvevents.Decoder
		var out kvevents.Batch
		allocs := testing.AllocsPerRun(100, func() {
			if err := d.Decode(payload, &out); err != nil {
				t.Fatal(err)
			}
		})
		// A GC emptying the state pool costs one allocation now and then.
		if allocs >= 1 {
			t.Errorf("%v: %v allocations per Decode, want 0", shape, allocs)
		}
	}
}

func ExampleDecoder() {
	// A vLLM v0.26 payload: [ts, [BlockStored as a tagged map], dp_rank].
	payload, _ := hex.DecodeString("93cb3ff8000000000000918ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cfb0147556276afc9cb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473920102aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797391c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e00")
	var d kvevents.Decoder
	var b kvevents.Batch
	if err := d.Decode(payload, &b); err != nil {
		fmt.Println(err)
		return
	}
	ev := b.Events[0]
	fmt.Println(b.TS, b.DPRank, ev.Kind, ev.Hashes, ev.TokenIDs, ev.BlockSize, ev.Medium, ev.SpecKind)

	// Hostile input is an error of a countable class, never a panic.
	err := d.Decode([]byte{0x92, 0xa3, 'n', 'o', 'w', 0x90}, &b)
	fmt.Println(errors.Is(err, kvevents.ErrMalformed))
	fmt.Println(err)
	// Output:
	// 1.5 0 BlockStored [12687895063098490012] [1 2] 2 GPU full_attention
	// true
	// kvevents: batch: ts: expected float, got str (at byte 1)
}
