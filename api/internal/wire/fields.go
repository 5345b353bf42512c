package wire

// Field numbers of the messages the two sides encode and decode by hand:
// the client encodes the requests and the server decodes them; the server
// encodes LongestPrefixResponse and the client decodes it.
// TestFieldNumbers holds them to the generated descriptors.

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

// IDs is the one field of TokenIds (ids) and BlockHashes (hashes).
const IDs = 1

// LongestPrefixResponse.
const (
	ResponseBlocksTotal  = 1
	ResponseBlockSize    = 2
	ResponsePods         = 3
	ResponsePromptTokens = 4
	ResponseTokenSource  = 5
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
