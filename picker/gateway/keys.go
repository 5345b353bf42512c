package gateway

import (
	"encoding/binary"

	"github.com/zeebo/xxh3"
)

// blockKeys returns chained keys of ids' full blocks of blockSize tokens:
// block i's key covers blocks 0..i, as the engine's hashes do. They are
// the picker's own keys, not the index's: they only match one request's
// blocks against earlier requests' speculative entries, so any
// prefix-chained hash will do, and this one needs no model
// configuration. Prompts given as text or messages have no ids here
// unless Config.Tokenizer gave them some; without, they get no
// speculative entries (the index tokenizes them).
func blockKeys(ids []uint64, blockSize int) []uint64 {
	n := len(ids) / blockSize
	if n == 0 {
		return nil
	}
	keys := make([]uint64, n)
	buf := make([]byte, 8+8*blockSize)
	var parent uint64
	for i := range n {
		binary.LittleEndian.PutUint64(buf, parent)
		for j, id := range ids[i*blockSize : (i+1)*blockSize] {
			binary.LittleEndian.PutUint64(buf[8+8*j:], id)
		}
		parent = xxh3.Hash(buf)
		keys[i] = parent
	}
	return keys
}
