package wire

import (
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Field numbers of the messages the two sides encode and decode by hand:
// the client encodes the requests and the server decodes them; the server
// encodes LongestPrefixResponse and the client decodes it.
// TestFieldNumbers holds them to the generated descriptors, and the Codec
// tables below say which of them each codec handles.

// LongestPrefixRequest and LookupRequest.
const (
	RequestModel      = 1
	RequestPrompt     = 2
	RequestCandidates = 3 // LongestPrefixRequest only
)

// Prompt.
const (
	PromptTokens      = 1
	PromptText        = 2
	PromptMessages    = 3
	PromptBlockHashes = 4
	PromptLoraName    = 5
	PromptCacheSalt   = 6
	PromptMMItems     = 7
)

// IDs is the one field of TokenIds (ids) and the first of BlockHashes
// (hashes).
const IDs = 1

// BlockHashesConfigDigest is BlockHashes' config_digest.
const BlockHashesConfigDigest = 2

// LongestPrefixResponse.
const (
	ResponseBlocksTotal  = 1
	ResponseBlockSize    = 2
	ResponsePods         = 3
	ResponsePromptTokens = 4
	ResponseTokenSource  = 5
	ResponseIndexSeq     = 6
)

// PodMatch.
const (
	PodPod           = 1
	PodDPRank        = 2
	PodMatchedBlocks = 3
	PodMatchedTokens = 4
	PodTiers         = 5
	PodHashCheck     = 6
	PodHealth        = 7
)

// The entries of PodMatch.tiers (map<string, uint32>).
const (
	EntryKey   = 1
	EntryValue = 2
)

// Handling is how a hand-written codec treats one field of a message.
type Handling uint8

const (
	// ByHand: the codec reads or writes the field itself. A message-typed
	// field's message then has an entry of its own in the codec's table.
	ByHand Handling = iota + 1
	// ByLibrary: protobuf-go handles the field. A decoder hands the
	// field's bytes to proto.Unmarshal; an encoder hands a message with
	// the field set to protobuf-go whole.
	ByLibrary
)

// Codec declares what one hand-written encoder or decoder handles: for
// each message it encodes or decodes by hand, every field number it
// knows. A field missing here is dropped by that codec without a word;
// TestCodecsKnowEveryField walks the generated descriptors and fails on
// any field of these messages that a table does not list.
type Codec struct {
	Name   string // the code, for the test's messages
	Table  string // the variable holding this declaration
	Fields map[protoreflect.FullName]map[protowire.Number]Handling
}

// The messages the codecs handle by hand.
const (
	LongestPrefixRequestName  protoreflect.FullName = "kvindex.v1.LongestPrefixRequest"
	LookupRequestName         protoreflect.FullName = "kvindex.v1.LookupRequest"
	PromptName                protoreflect.FullName = "kvindex.v1.Prompt"
	TokenIdsName              protoreflect.FullName = "kvindex.v1.TokenIds"
	BlockHashesName           protoreflect.FullName = "kvindex.v1.BlockHashes"
	LongestPrefixResponseName protoreflect.FullName = "kvindex.v1.LongestPrefixResponse"
	PodMatchName              protoreflect.FullName = "kvindex.v1.PodMatch"
	TiersEntryName            protoreflect.FullName = "kvindex.v1.PodMatch.TiersEntry"
)

// prefixResponseFields are the fields of a LongestPrefix answer, which
// the server encodes and the client decodes, all by hand.
func prefixResponseFields() map[protoreflect.FullName]map[protowire.Number]Handling {
	return map[protoreflect.FullName]map[protowire.Number]Handling{
		LongestPrefixResponseName: {
			ResponseBlocksTotal: ByHand, ResponseBlockSize: ByHand, ResponsePods: ByHand,
			ResponsePromptTokens: ByHand, ResponseTokenSource: ByHand, ResponseIndexSeq: ByHand,
		},
		PodMatchName: {
			PodPod: ByHand, PodDPRank: ByHand, PodMatchedBlocks: ByHand, PodMatchedTokens: ByHand,
			PodTiers: ByHand, PodHashCheck: ByHand, PodHealth: ByHand,
		},
		TiersEntryName: {EntryKey: ByHand, EntryValue: ByHand},
	}
}

// ServerDecodes is the server's request decoder (api/server/codec.go):
// chat messages and multimodal items go to proto.Unmarshal.
var ServerDecodes = Codec{
	Name:  "the server's request decoder (api/server/codec.go)",
	Table: "wire.ServerDecodes",
	Fields: map[protoreflect.FullName]map[protowire.Number]Handling{
		LongestPrefixRequestName: {RequestModel: ByHand, RequestPrompt: ByHand, RequestCandidates: ByHand},
		LookupRequestName:        {RequestModel: ByHand, RequestPrompt: ByHand},
		PromptName: {
			PromptTokens: ByHand, PromptText: ByHand, PromptMessages: ByLibrary, PromptBlockHashes: ByHand,
			PromptLoraName: ByHand, PromptCacheSalt: ByHand, PromptMMItems: ByLibrary,
		},
		TokenIdsName:    {IDs: ByHand},
		BlockHashesName: {IDs: ByHand, BlockHashesConfigDigest: ByHand},
	},
}

// ServerEncodes is the server's LongestPrefixResponse encoder
// (api/server/encode.go).
var ServerEncodes = Codec{
	Name:   "the server's response encoder (api/server/encode.go)",
	Table:  "wire.ServerEncodes",
	Fields: prefixResponseFields(),
}

// ClientEncodes is the client's encoder of token-id requests
// (api/client/codec.go): any other prompt, and a prompt with multimodal
// items, goes through protobuf-go.
var ClientEncodes = Codec{
	Name:  "the client's request encoder (api/client/codec.go)",
	Table: "wire.ClientEncodes",
	Fields: map[protoreflect.FullName]map[protowire.Number]Handling{
		LongestPrefixRequestName: {RequestModel: ByHand, RequestPrompt: ByHand, RequestCandidates: ByHand},
		LookupRequestName:        {RequestModel: ByHand, RequestPrompt: ByHand},
		PromptName: {
			PromptTokens: ByHand, PromptText: ByLibrary, PromptMessages: ByLibrary, PromptBlockHashes: ByLibrary,
			PromptLoraName: ByHand, PromptCacheSalt: ByHand, PromptMMItems: ByLibrary,
		},
		TokenIdsName: {IDs: ByHand},
	},
}

// ClientDecodes is the client's LongestPrefixResponse decoder
// (api/client/codec.go).
var ClientDecodes = Codec{
	Name:   "the client's response decoder (api/client/codec.go)",
	Table:  "wire.ClientDecodes",
	Fields: prefixResponseFields(),
}

// Codecs lists every hand-written codec of both sides.
var Codecs = []Codec{ServerDecodes, ServerEncodes, ClientEncodes, ClientDecodes}
