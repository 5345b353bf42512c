package blockhash

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/fxamacker/cbor/v2"
)

// TestPickleEdges compares the pickle writer with CPython's C pickler on
// shapes the vLLM vectors do not reach: every integer opcode, negative
// ints, long and non-ASCII strings, long bytes, empty and long tuples, and
// 64 KiB frame boundaries (testdata/gen_pickle_edges.py made the file).
func TestPickleEdges(t *testing.T) {
	raw, err := os.ReadFile("testdata/pickle_edges.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Blocks []struct {
			Name      string   `json:"name"`
			ParentHex string   `json:"parent_hex"`
			Tokens    []uint64 `json:"tokens"`
			TokenRule *struct {
				Start, Count, Mod uint64
			} `json:"token_rule"`
			Extra     json.RawMessage `json:"extra"`
			PickleHex string          `json:"pickle_hex"`
			Len       int             `json:"pickle_len"`
			SHA256    string          `json:"pickle_sha256"`
		} `json:"blocks"`
		Seeds []struct {
			Seed      string `json:"seed"`
			PickleHex string `json:"pickle_hex"`
		} `json:"seeds"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Blocks) < 15 || len(doc.Seeds) < 4 {
		t.Fatalf("pickle_edges.json holds %d blocks and %d seeds; regenerate it", len(doc.Blocks), len(doc.Seeds))
	}
	for _, c := range doc.Blocks {
		t.Run(c.Name, func(t *testing.T) {
			parent, _ := hex.DecodeString(c.ParentHex)
			toks := c.Tokens
			if r := c.TokenRule; r != nil {
				toks = make([]uint64, r.Count)
				for i := range toks {
					toks[i] = r.Start + uint64(i)
					if r.Mod != 0 {
						toks[i] %= r.Mod
					}
				}
			}
			got, err := pickleCodec{}.appendBlock(nil, parent, toks, extraFromJSON(t, c.Extra))
			if err != nil {
				t.Fatal(err)
			}
			if c.PickleHex != "" {
				if want, _ := hex.DecodeString(c.PickleHex); !bytes.Equal(got, want) {
					t.Fatalf("pickle differs\n got %x\nwant %x", got, want)
				}
				return
			}
			sum := sha256.Sum256(got)
			if len(got) != c.Len || hex.EncodeToString(sum[:]) != c.SHA256 {
				t.Fatalf("pickle of %d bytes (sha256 %x), want %d bytes (sha256 %s)", len(got), sum, c.Len, c.SHA256)
			}
		})
	}
	for _, s := range doc.Seeds {
		got, err := pickleCodec{}.appendSeed(nil, s.Seed)
		if err != nil {
			t.Fatal(err)
		}
		if hex.EncodeToString(got) != s.PickleHex {
			t.Errorf("seed %.10q: pickle %x, want %s", s.Seed, got, s.PickleHex)
		}
	}
}

func extraFromJSON(t *testing.T, raw json.RawMessage) BlockExtra {
	var x any
	if err := json.Unmarshal(raw, &x); err != nil {
		t.Fatal(err)
	}
	if x == nil {
		return nil
	}
	var conv func(any) Value
	conv = func(x any) Value {
		switch v := x.(type) {
		case string:
			return Str(v)
		case float64:
			return Int(int64(v))
		case []any:
			vs := make([]Value, len(v))
			for i, e := range v {
				vs[i] = conv(e)
			}
			return Tuple(vs...)
		case map[string]any:
			b, _ := hex.DecodeString(v["$bytes"].(string))
			return Bytes(b)
		}
		t.Fatalf("unexpected %T", x)
		return Value{}
	}
	return BlockExtra(conv(x).Tuple)
}

// cborTuple is the value fxamacker/cbor encodes as Python's 3-tuple.
type cborTuple struct {
	_      struct{} `cbor:",toarray"`
	Parent []byte
	Tokens []uint64
	Extra  []any
}

func toAny(vs []Value) []any {
	out := make([]any, len(vs))
	for i, v := range vs {
		switch v.Kind {
		case KindStr:
			out[i] = v.Str
		case KindInt:
			out[i] = v.Int
		case KindBytes:
			out[i] = v.Bytes
		case KindTuple:
			out[i] = toAny(v.Tuple)
		}
	}
	return out
}

func randomExtra(r *rand.Rand, depth int) BlockExtra {
	if r.IntN(3) == 0 {
		return nil
	}
	n := r.IntN(4)
	e := make(BlockExtra, n)
	for i := range e {
		switch k := r.IntN(4); {
		case k == 0:
			e[i] = Str(string(make([]byte, r.IntN(300))))
		case k == 1:
			e[i] = Int(r.Int64() >> r.IntN(64) * int64(1-2*r.IntN(2)))
		case k == 2:
			e[i] = Bytes(bytes.Repeat([]byte{byte(i)}, r.IntN(40)))
		case depth < 2:
			e[i] = Tuple(randomExtra(r, depth+1)...)
		default:
			e[i] = Str("x")
		}
	}
	return e
}

// TestCBORMatchesLibrary checks the hand-written encoder against
// fxamacker/cbor's core deterministic encoding on random inputs covering
// every head width.
func TestCBORMatchesLibrary(t *testing.T) {
	em, err := cbor.CoreDetEncOptions().EncMode()
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 2000; i++ {
		parent := make([]byte, []int{0, 16, 32, 300}[r.IntN(4)])
		toks := make([]uint64, r.IntN(40))
		for j := range toks {
			toks[j] = r.Uint64() >> r.IntN(64)
		}
		extra := randomExtra(r, 0)
		got, err := cborCodec{}.appendBlock(nil, parent, toks, extra)
		if err != nil {
			t.Fatal(err)
		}
		v := cborTuple{Parent: parent, Tokens: toks}
		if extra != nil {
			v.Extra = toAny(extra)
		}
		want, err := em.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("case %d: extra %v\n got %x\nwant %x", i, extra, got, want)
		}
	}
}

// BenchmarkCBOREncode compares the hand-written encoder with
// fxamacker/cbor on one 16-token block, the justification for writing it.
func BenchmarkCBOREncode(b *testing.B) {
	parent := make([]byte, 32)
	toks := make([]uint64, 16)
	for i := range toks {
		toks[i] = uint64(100000 + i*977)
	}
	b.Run("kvindex", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 256)
		for i := 0; i < b.N; i++ {
			buf, _ = cborCodec{}.appendBlock(buf[:0], parent, toks, nil)
		}
	})
	b.Run("fxamacker", func(b *testing.B) {
		em, _ := cbor.CoreDetEncOptions().EncMode()
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if _, err := em.Marshal(cborTuple{Parent: parent, Tokens: toks}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
