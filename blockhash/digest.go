package blockhash

import (
	"encoding/binary"

	"github.com/zeebo/xxh3"
)

// Digest fingerprints the hashing a Hasher does, for two processes that
// must hash alike (a router hashing prompts itself and the index it asks
// by block keys) to check that they do: the configuration (algorithm,
// seed, block size) and the digests of a fixed probe chain of two blocks
// hashed with it, without and with extra keys (LoRA name and cache salt;
// SGLang, which has none, only without). Equal digests mean equal
// configurations and, as far as the probe reaches, equal code; a
// difference in either shows. Never 0, which callers use for "unknown".
func (h *Hasher) Digest() uint64 {
	b := make([]byte, 0, 256)
	str := func(s string) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	str(string(h.cfg.Algo))
	str(h.cfg.Seed)
	b = binary.AppendUvarint(b, uint64(h.cfg.BlockSize))
	probe := make([]uint64, 2*h.cfg.BlockSize)
	for i := range probe {
		probe[i] = uint64(i)*2654435761 + 1
	}
	extras := []*Extras{nil, {LoRAName: "kvindex-probe", CacheSalt: "kvindex-probe"}}
	if h.codec == codecSGLang {
		extras = extras[:1]
	}
	for _, x := range extras {
		hs, err := h.Chain(nil, nil, 0, probe, x)
		if err != nil {
			str(err.Error())
			continue
		}
		for i := range hs {
			b = append(b, hs[i].Digest()...)
			b = binary.LittleEndian.AppendUint64(b, hs[i].Key)
		}
	}
	if d := xxh3.Hash(b); d != 0 {
		return d
	}
	return 1
}
