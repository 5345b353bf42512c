// Package blockhash computes the chained prefix-block hashes that inference
// engines report in their KV-cache events, byte for byte.
//
// vLLM hashes every full block of a request's tokens as
//
//	h_0 = H((NONE_HASH, tuple(tokens[0:B]),  extra_0))
//	h_i = H((h_{i-1},   tuple(tokens[iB:(i+1)B]), extra_i))
//
// where H serialises the Python 3-tuple (canonical CBOR or pickle protocol 5)
// and digests it (SHA-256 or XXH3-128), NONE_HASH = H(seed) for the engine's
// PYTHONHASHSEED string, and extra_i is None or a tuple of extra keys (LoRA
// adapter name, multimodal items, cache salt, prompt-embedding digests). A
// partial trailing block is never hashed. KV events carry the 64-bit form of a
// digest: its last 8 bytes, big-endian, unsigned.
//
// The package mirrors that scheme exactly, so a router can compute, for a
// prompt, the very keys the engine put in its events. It also implements
// SGLang's scheme (SHA-256 over the parent digest and little-endian uint32
// tokens; the first 8 bytes as a signed int64), which has no seed and no
// extra keys.
//
// Supported algorithms, by the name vLLM's --prefix-caching-hash-algo uses:
//
//	sha256_cbor   canonical CBOR, SHA-256          (recommended)
//	xxhash_cbor   canonical CBOR, XXH3-128
//	sha256        pickle protocol 5, SHA-256        (vLLM's default)
//	xxhash        pickle protocol 5, XXH3-128
//	sglang        SGLang's scheme
//
// The pickle forms reproduce CPython's C pickler for the value shapes that
// occur in block hashing (bytes, ints of any size, str, tuples, None),
// including its 64 KiB framing. Two shapes cannot be mirrored and are
// refused or documented: a str or bytes value of 64 KiB or more (CPython
// writes those outside frames; Hasher returns ErrUnsupported), and the same
// Python object appearing twice inside one block's extra keys (CPython then
// writes a memo reference, which depends on object identity that the wire
// does not carry; kvindex always writes the value again, which matches the
// engine whenever the two occurrences are distinct objects, the normal case).
//
// NONE_HASH: vLLM hashes the PYTHONHASHSEED string with the configured
// algorithm. When PYTHONHASHSEED is unset, vLLM releases after August 2026
// use the seed "vllm-none-hash" for sha256 and sha256_cbor (DefaultSeed);
// older releases, and the xxhash algorithms in every release, use 32 random
// bytes per process, which nobody can mirror: set PYTHONHASHSEED on the
// engines.
//
// The package is pure: no I/O, no clocks, no globals beyond constant tables.
// A Hasher is immutable and safe for concurrent use; its hot path does not
// allocate once its internal buffer pool is warm.
package blockhash
