package doctor

import (
	"fmt"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/blockhash"
)

// maxExtraDepth bounds the nesting of a block's extra keys: vLLM's are
// at most a tuple of (identifier, offset) tuples.
const maxExtraDepth = 8

// maxDigestLen is the longest digest a block hash has (SHA-256);
// maxGroupDigestLen the longest a hybrid model's stored block reports,
// the digests of the hash blocks it spans concatenated.
const (
	maxDigestLen      = 32
	maxGroupDigestLen = 256 * maxDigestLen
)

// Decode checks one sample as the server sent it (HashSamples) and
// returns it as Search takes it; a sample whose fields disagree is an
// error naming the field, never a panic.
func Decode(p *kvindexv1.StoredSample) (Sample, error) {
	n := len(p.GetBlockHashes())
	bs := int(p.GetBlockSize())
	s := Sample{
		Hashes: p.GetBlockHashes(), HasParent: p.GetHasParent(), Parent: p.GetParentHash(),
		ParentDigest: p.GetParentDigest(), Tokens: p.GetTokenIds(), BlockSize: bs, LoRAName: p.GetLoraName(),
	}
	switch {
	case n == 0:
		return s, fmt.Errorf("no block_hashes")
	case bs < 1 || bs > blockhash.MaxBlockSize:
		return s, fmt.Errorf("block_size %d out of range [1, %d]", bs, blockhash.MaxBlockSize)
	case len(s.Tokens) != n*bs:
		return s, fmt.Errorf("%d token_ids for %d blocks of %d", len(s.Tokens), n, bs)
	case len(p.GetBlockDigests()) != 0 && len(p.GetBlockDigests()) != n:
		return s, fmt.Errorf("%d block_digests for %d block_hashes", len(p.GetBlockDigests()), n)
	case len(s.ParentDigest) > maxDigestLen:
		return s, fmt.Errorf("parent_digest of %d bytes (at most %d)", len(s.ParentDigest), maxDigestLen)
	case p.GetHasExtraKeys() && len(p.GetExtraKeys()) != n:
		return s, fmt.Errorf("%d extra_keys for %d block_hashes", len(p.GetExtraKeys()), n)
	case !p.GetHasExtraKeys() && len(p.GetExtraKeys()) != 0:
		return s, fmt.Errorf("extra_keys without has_extra_keys")
	}
	if d := p.GetBlockDigests(); len(d) > 0 {
		for i, x := range d {
			if len(x) == 0 || len(x) > maxGroupDigestLen {
				return s, fmt.Errorf("block_digests[%d]: %d bytes", i, len(x))
			}
		}
		s.Digests = d
	}
	if p.GetHasExtraKeys() {
		s.ExtraKeys = make([]blockhash.BlockExtra, n)
		for i, k := range p.GetExtraKeys() {
			if k.GetNone() {
				if len(k.GetValues()) != 0 {
					return s, fmt.Errorf("extra_keys[%d]: none with values", i)
				}
				continue
			}
			x, err := decodeValues(k.GetValues(), 1)
			if err != nil {
				return s, fmt.Errorf("extra_keys[%d]: %w", i, err)
			}
			s.ExtraKeys[i] = x
		}
	}
	return s, nil
}

// decodeValues decodes a tuple's elements (never nil: an empty tuple is
// not None).
func decodeValues(vs []*kvindexv1.ExtraKeyValue, depth int) (blockhash.BlockExtra, error) {
	if depth > maxExtraDepth {
		return nil, fmt.Errorf("nested deeper than %d", maxExtraDepth)
	}
	out := make(blockhash.BlockExtra, len(vs))
	for i, v := range vs {
		switch x := v.GetValue().(type) {
		case *kvindexv1.ExtraKeyValue_Str:
			out[i] = blockhash.Str(x.Str)
		case *kvindexv1.ExtraKeyValue_Int:
			out[i] = blockhash.Int(x.Int)
		case *kvindexv1.ExtraKeyValue_Bytes:
			out[i] = blockhash.Bytes(x.Bytes)
		case *kvindexv1.ExtraKeyValue_Tuple:
			t, err := decodeValues(x.Tuple.GetValues(), depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = blockhash.Tuple(t...)
		default:
			return nil, fmt.Errorf("value %d has no type", i)
		}
	}
	return out, nil
}
