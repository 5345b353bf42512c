package blockhash

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Kind is the type of one extra-key value.
type Kind uint8

// Value kinds. They are the Python types that occur in vLLM's extra keys.
const (
	KindStr   Kind = iota + 1 // str: LoRA name, cache salt, multimodal identifier
	KindInt                   // int: multimodal offset, legacy LoRA int id
	KindBytes                 // bytes: prompt-embedding digest
	KindTuple                 // tuple: (identifier, offset) multimodal item
)

// Value is one element of a block's extra keys.
type Value struct {
	Kind  Kind
	Str   string
	Int   int64
	Bytes []byte
	Tuple []Value
}

// Str returns a str value.
func Str(s string) Value { return Value{Kind: KindStr, Str: s} }

// Int returns an int value.
func Int(i int64) Value { return Value{Kind: KindInt, Int: i} }

// Bytes returns a bytes value.
func Bytes(b []byte) Value { return Value{Kind: KindBytes, Bytes: b} }

// Tuple returns a tuple value.
func Tuple(vs ...Value) Value { return Value{Kind: KindTuple, Tuple: vs} }

// String renders v the way Python's repr would.
func (v Value) String() string {
	switch v.Kind {
	case KindStr:
		return fmt.Sprintf("%q", v.Str)
	case KindInt:
		return fmt.Sprint(v.Int)
	case KindBytes:
		return fmt.Sprintf("b'%x'", v.Bytes)
	case KindTuple:
		return BlockExtra(v.Tuple).String()
	}
	return "<invalid>"
}

// BlockExtra is one block's extra keys: nil is Python's None (no extra
// keys), a non-nil slice is a tuple (an empty non-nil slice is the empty
// tuple, which hashes differently from None).
type BlockExtra []Value

// String renders e as a Python tuple, or None.
func (e BlockExtra) String() string {
	if e == nil {
		return "None"
	}
	s := "("
	for i, v := range e {
		if i > 0 {
			s += ", "
		}
		s += v.String()
	}
	if len(e) == 1 {
		s += ","
	}
	return s + ")"
}

// MMItem is one multimodal input of a prompt: its identifier (the engine's
// mm hash or the caller's UUID) and the token span its placeholder covers.
type MMItem struct {
	Identifier string
	Offset     int // first token of the placeholder
	Length     int // tokens
}

// ParseMMItem parses ID:OFFSET:LENGTH (an identifier, which may hold
// colons, its placeholder's first token and its token count). The error
// says what is wrong with the value, without naming it.
func ParseMMItem(s string) (MMItem, error) {
	i := strings.LastIndex(s, ":")
	j := strings.LastIndex(s[:max(i, 0)], ":")
	if i < 0 || j < 0 {
		return MMItem{}, errors.New("want ID:OFFSET:LENGTH")
	}
	off, err1 := strconv.Atoi(s[j+1 : i])
	n, err2 := strconv.Atoi(s[i+1:])
	if err1 != nil || err2 != nil || off < 0 || n < 1 {
		return MMItem{}, errors.New("OFFSET and LENGTH must be integers, OFFSET >= 0, LENGTH >= 1")
	}
	return MMItem{Identifier: s[:j], Offset: off, Length: n}, nil
}

// Extras describes the hash-affecting inputs of a request beyond its
// tokens. vLLM derives each block's extra keys from it in a fixed order:
// LoRA name (every block), multimodal items overlapping the block, cache
// salt (block 0 only), prompt-embedding digest.
type Extras struct {
	LoRAName  string   // adapter name; "" for the base model
	CacheSalt string   // "" for none
	MM        []MMItem // sorted by Offset, not overlapping
	// LegacyMM selects the multimodal key of vLLM before v0.18 (PR
	// #36708): the bare identifier instead of (identifier, offset in block).
	LegacyMM bool
	// PromptEmbeds holds, per block index, the SHA-256 of the block's
	// prompt-embedding tensor bytes; nil or short means none.
	PromptEmbeds [][]byte
}

func (x *Extras) empty() bool {
	return x == nil || (x.LoRAName == "" && x.CacheSalt == "" && len(x.MM) == 0 && len(x.PromptEmbeds) == 0)
}

// Validate reports an error for an MM list that is not sorted or has
// negative spans (vLLM assumes sorted items).
func (x *Extras) Validate() error {
	if x == nil {
		return nil
	}
	for i, m := range x.MM {
		if m.Offset < 0 || m.Length < 0 {
			return fmt.Errorf("blockhash: multimodal item %d has negative offset or length", i)
		}
	}
	if !sort.SliceIsSorted(x.MM, func(i, j int) bool { return x.MM[i].Offset < x.MM[j].Offset }) {
		return fmt.Errorf("blockhash: multimodal items must be sorted by offset")
	}
	return nil
}

// scratch holds the per-call storage for one block's extra keys, so that
// building them does not allocate in steady state.
type scratch struct {
	vals  [8]Value
	items [4][2]Value
}

// BlockKeys returns the extra keys of block blk (blocks of blockSize
// tokens) as vLLM derives them and reports them in a BlockStored event's
// extra_keys: nil for None. The result is freshly allocated.
func (x *Extras) BlockKeys(blk, blockSize int) BlockExtra {
	if x.empty() {
		return nil
	}
	var sc scratch
	e := x.block(&sc, blk, blockSize)
	if e == nil {
		return nil
	}
	out := make(BlockExtra, len(e))
	for i, v := range e {
		if v.Kind == KindTuple {
			v.Tuple = append([]Value(nil), v.Tuple...) // items are flat (identifier, offset) pairs
		}
		out[i] = v
	}
	return out
}

// block returns block blk's extra keys (nil for None). The result aliases sc.
func (x *Extras) block(sc *scratch, blk, bs int) BlockExtra {
	if x.empty() {
		return nil
	}
	out := sc.vals[:0]
	if x.LoRAName != "" {
		out = append(out, Str(x.LoRAName))
	}
	start, end := blk*bs, (blk+1)*bs
	nItem := 0
	for _, m := range x.MM {
		if m.Offset >= end {
			break // sorted: no later item reaches this block
		}
		if m.Offset+m.Length <= start {
			continue
		}
		if x.LegacyMM {
			out = append(out, Str(m.Identifier))
			continue
		}
		var pair []Value
		if nItem < len(sc.items) {
			sc.items[nItem] = [2]Value{Str(m.Identifier), Int(int64(m.Offset - start))}
			pair = sc.items[nItem][:]
		} else {
			pair = []Value{Str(m.Identifier), Int(int64(m.Offset - start))}
		}
		nItem++
		out = append(out, Tuple(pair...))
	}
	if blk == 0 && x.CacheSalt != "" {
		out = append(out, Str(x.CacheSalt))
	}
	if blk < len(x.PromptEmbeds) && x.PromptEmbeds[blk] != nil {
		out = append(out, Bytes(x.PromptEmbeds[blk]))
	}
	if len(out) == 0 {
		return nil
	}
	return BlockExtra(out)
}
