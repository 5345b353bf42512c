package kvevents

import "errors"

// Flavor selects the engine family whose payload layout a Decoder expects.
type Flavor uint8

// Engine families.
const (
	FlavorVLLM   Flavor = iota // vLLM, every wire version
	FlavorSGLang               // SGLang's copy of the vLLM publisher
)

// Shape selects the wire layout an Encoder writes, one per vLLM era.
type Shape uint8

// Wire shapes, oldest first.
const (
	ShapeV090  Shape = iota + 1 // v0.9.0: batch [ts, events]; BlockStored [tag, hashes, parent, tokens, block_size, lora_id]
	ShapeArray                  // v0.10 - v0.23: tagged arrays with every field, batch [ts, events, dp_rank]
	ShapeMap                    // v0.24+: events as tagged maps (omit_defaults), batch an array
)

// ErrNotImplemented is a placeholder until the codec lands.
var ErrNotImplemented = errors.New("kvevents: codec not implemented")

// Decoder decodes EventBatch payloads. The zero value decodes vLLM
// payloads with default limits.
type Decoder struct {
	Flavor Flavor
}

// Decode decodes one msgpack EventBatch payload into out, reusing out's
// slices where it can.
func (d *Decoder) Decode(payload []byte, out *Batch) error { return ErrNotImplemented }

// EncodeOptions selects how an Encoder writes a batch.
type EncodeOptions struct {
	Shape       Shape
	BytesHashes bool // write 32-byte digests (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0); events must carry Digests
}

// AppendBatch appends the msgpack encoding of b in the given shape.
func AppendBatch(dst []byte, b *Batch, opts EncodeOptions) ([]byte, error) {
	return dst, ErrNotImplemented
}
