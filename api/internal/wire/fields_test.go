package wire

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/kvindex/kvindex/api/kvindexv1"
)

// The field numbers the hand-written codecs use are the .proto's.
func TestFieldNumbers(t *testing.T) {
	tiers := (&kvindexv1.PodMatch{}).ProtoReflect().Descriptor().Fields().ByName("tiers").Message()
	tests := []struct {
		msg   proto.Message
		field protoreflect.Name
		want  int
	}{
		{&kvindexv1.LongestPrefixRequest{}, "model", RequestModel},
		{&kvindexv1.LongestPrefixRequest{}, "prompt", RequestPrompt},
		{&kvindexv1.LongestPrefixRequest{}, "candidate_pods", RequestCandidates},
		{&kvindexv1.LookupRequest{}, "model", RequestModel},
		{&kvindexv1.LookupRequest{}, "prompt", RequestPrompt},
		{&kvindexv1.Prompt{}, "tokens", PromptTokens},
		{&kvindexv1.Prompt{}, "text", PromptText},
		{&kvindexv1.Prompt{}, "messages", PromptMessages},
		{&kvindexv1.Prompt{}, "block_hashes", PromptBlockHashes},
		{&kvindexv1.Prompt{}, "lora_name", PromptLoraName},
		{&kvindexv1.Prompt{}, "cache_salt", PromptCacheSalt},
		{&kvindexv1.Prompt{}, "mm_items", PromptMMItems},
		{&kvindexv1.TokenIds{}, "ids", IDs},
		{&kvindexv1.BlockHashes{}, "hashes", IDs},
		{&kvindexv1.LongestPrefixResponse{}, "blocks_total", ResponseBlocksTotal},
		{&kvindexv1.LongestPrefixResponse{}, "block_size", ResponseBlockSize},
		{&kvindexv1.LongestPrefixResponse{}, "pods", ResponsePods},
		{&kvindexv1.LongestPrefixResponse{}, "prompt_tokens", ResponsePromptTokens},
		{&kvindexv1.LongestPrefixResponse{}, "token_source", ResponseTokenSource},
		{&kvindexv1.PodMatch{}, "pod", PodPod},
		{&kvindexv1.PodMatch{}, "dp_rank", PodDPRank},
		{&kvindexv1.PodMatch{}, "matched_blocks", PodMatchedBlocks},
		{&kvindexv1.PodMatch{}, "matched_tokens", PodMatchedTokens},
		{&kvindexv1.PodMatch{}, "tiers", PodTiers},
		{&kvindexv1.PodMatch{}, "hash_check", PodHashCheck},
		{&kvindexv1.PodMatch{}, "health", PodHealth},
	}
	for _, tc := range tests {
		md := tc.msg.ProtoReflect().Descriptor()
		fd := md.Fields().ByName(tc.field)
		if fd == nil {
			t.Errorf("%s has no field %s", md.FullName(), tc.field)
			continue
		}
		if got := int(fd.Number()); got != tc.want {
			t.Errorf("%s.%s is field %d, the codecs use %d", md.FullName(), tc.field, got, tc.want)
		}
	}
	for name, want := range map[protoreflect.Name]int{"key": EntryKey, "value": EntryValue} {
		if got := int(tiers.Fields().ByName(name).Number()); got != want {
			t.Errorf("tiers entry %s is field %d, the codecs use %d", name, got, want)
		}
	}
}
