package wire

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

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
		{&kvindexv1.BlockHashes{}, "config_digest", BlockHashesConfigDigest},
		{&kvindexv1.LongestPrefixResponse{}, "blocks_total", ResponseBlocksTotal},
		{&kvindexv1.LongestPrefixResponse{}, "block_size", ResponseBlockSize},
		{&kvindexv1.LongestPrefixResponse{}, "pods", ResponsePods},
		{&kvindexv1.LongestPrefixResponse{}, "prompt_tokens", ResponsePromptTokens},
		{&kvindexv1.LongestPrefixResponse{}, "token_source", ResponseTokenSource},
		{&kvindexv1.LongestPrefixResponse{}, "index_seq", ResponseIndexSeq},
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

// codecProblems walks the descriptors of the messages c handles by hand,
// following every message-typed field it handles by hand, and returns one
// line per field c does not know, per message it reaches without an
// entry, and per field number it lists that the message lacks.
func codecProblems(c Codec) []string {
	var problems []string
	seen := map[protoreflect.FullName]bool{}
	var walk func(md protoreflect.MessageDescriptor, from string)
	walk = func(md protoreflect.MessageDescriptor, from string) {
		if seen[md.FullName()] {
			return
		}
		seen[md.FullName()] = true
		known, ok := c.Fields[md.FullName()]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s (%s) is handled by hand by %s but has no entry in %s",
				md.FullName(), from, c.Name, c.Table))
			return
		}
		fields := md.Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			h, ok := known[fd.Number()]
			switch {
			case !ok:
				problems = append(problems, fmt.Sprintf("%s field %d (%s) is not handled by %s: handle it and add it to %s, or the codec will drop it",
					md.FullName(), fd.Number(), fd.Name(), c.Name, c.Table))
			case h != ByHand && h != ByLibrary:
				problems = append(problems, fmt.Sprintf("%s field %d (%s): %s gives no valid handling", md.FullName(), fd.Number(), fd.Name(), c.Table))
			case h == ByHand && fd.Message() != nil:
				walk(fd.Message(), fmt.Sprintf("field %s.%s", md.FullName(), fd.Name()))
			}
		}
		for _, num := range slices.Sorted(maps.Keys(known)) {
			if fields.ByNumber(num) == nil {
				problems = append(problems, fmt.Sprintf("%s has no field %d, yet %s lists it", md.FullName(), num, c.Table))
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.Fields)) {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(name)
		md, ok := d.(protoreflect.MessageDescriptor)
		if err != nil || !ok {
			problems = append(problems, fmt.Sprintf("%s lists %s, which is not a message (%v)", c.Table, name, err))
			continue
		}
		walk(md, "listed")
	}
	return problems
}

// Every field of every message a hand-written codec handles is one the
// codec knows, so that a field added to the .proto cannot be dropped
// silently by either side.
func TestCodecsKnowEveryField(t *testing.T) {
	for _, c := range Codecs {
		t.Run(c.Table, func(t *testing.T) {
			for _, p := range codecProblems(c) {
				t.Error(p)
			}
		})
	}
}

// copyCodec returns c with its own copy of every table.
func copyCodec(c Codec) Codec {
	out := c
	out.Fields = make(map[protoreflect.FullName]map[protowire.Number]Handling, len(c.Fields))
	for name, fields := range c.Fields {
		out.Fields[name] = maps.Clone(fields)
	}
	return out
}

// The guard fails, naming the field and the table, when a codec's
// declaration misses what the descriptors have.
func TestCodecGuardFails(t *testing.T) {
	tests := []struct {
		name  string
		codec Codec
		edit  func(c Codec)
		want  string
	}{
		{"a field the decoder does not know", ServerDecodes,
			func(c Codec) { delete(c.Fields[PromptName], PromptCacheSalt) },
			"kvindex.v1.Prompt field 6 (cache_salt) is not handled by the server's request decoder (api/server/codec.go): " +
				"handle it and add it to wire.ServerDecodes, or the codec will drop it"},
		{"a field the encoder does not know", ClientEncodes,
			func(c Codec) { delete(c.Fields[PromptName], PromptMMItems) },
			"kvindex.v1.Prompt field 7 (mm_items) is not handled by the client's request encoder (api/client/codec.go): " +
				"handle it and add it to wire.ClientEncodes, or the codec will drop it"},
		{"a nested message without an entry", ClientDecodes,
			func(c Codec) { delete(c.Fields, TiersEntryName) },
			"kvindex.v1.PodMatch.TiersEntry (field kvindex.v1.PodMatch.tiers) is handled by hand by the client's response decoder (api/client/codec.go) but has no entry in wire.ClientDecodes"},
		{"a field the message lacks", ServerEncodes,
			func(c Codec) { c.Fields[PodMatchName][99] = ByHand },
			"kvindex.v1.PodMatch has no field 99, yet wire.ServerEncodes lists it"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := copyCodec(tc.codec)
			tc.edit(c)
			got := codecProblems(c)
			if len(got) != 1 || got[0] != tc.want {
				t.Errorf("problems = %q\nwant [%q]", got, tc.want)
			}
			if p := codecProblems(tc.codec); len(p) != 0 {
				t.Errorf("editing the copy changed %s: %q", tc.codec.Table, p)
			}
		})
	}
}
