package blockhash

import "fmt"

// sglangCodec writes SGLang's page-hash input: the parent digest (nothing
// for the first page) followed by every token as a little-endian uint32.
// SGLang packs tokens with struct "I", so ids of 2^32 and above cannot occur
// there; they are refused rather than silently truncated.
type sglangCodec struct{}

func (sglangCodec) appendBlock(b []byte, parent []byte, tokens []uint64, _ BlockExtra) ([]byte, error) {
	b = append(b, parent...)
	for _, t := range tokens {
		if t > 0xffffffff {
			return b, fmt.Errorf("%w: SGLang token id %d exceeds uint32", ErrUnsupported, t)
		}
		b = append(b, byte(t), byte(t>>8), byte(t>>16), byte(t>>24))
	}
	return b, nil
}
