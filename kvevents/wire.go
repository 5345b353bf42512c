package kvevents

import "strconv"

// Flavor selects the engine family whose payload layout a Decoder expects.
type Flavor uint8

// Engine families.
const (
	FlavorVLLM   Flavor = iota // vLLM, every wire version
	FlavorSGLang               // SGLang's copy of the vLLM publisher
)

func (f Flavor) String() string {
	switch f {
	case FlavorVLLM:
		return "vllm"
	case FlavorSGLang:
		return "sglang"
	}
	return "Flavor(" + strconv.Itoa(int(f)) + ")"
}

// Shape selects the wire layout an Encoder writes, one per vLLM era.
type Shape uint8

// Wire shapes, oldest first.
const (
	ShapeV090  Shape = iota + 1 // v0.9.0: batch [ts, events]; BlockStored [tag, hashes, parent, tokens, block_size, lora_id]
	ShapeArray                  // v0.10 - v0.23: tagged arrays with every field, batch [ts, events, dp_rank]
	ShapeMap                    // v0.24+: events as tagged maps (omit_defaults), batch an array
)

func (s Shape) String() string {
	switch s {
	case ShapeV090:
		return "v0.9.0"
	case ShapeArray:
		return "array"
	case ShapeMap:
		return "map"
	}
	return "Shape(" + strconv.Itoa(int(s)) + ")"
}
