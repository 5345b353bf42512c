package client

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/api/kvindexv1"
)

// withOptions copies every field the prompt has, including those it does
// not name and fields unknown to this build, sharing the input rather
// than copying it, and leaves the prompt as it was.
func TestWithOptionsKeepsEveryField(t *testing.T) {
	p := TokensPrompt(seqTokens(1, 40))
	p.CacheSalt = "s"
	unknown := protowire.AppendTag(nil, 99, protowire.BytesType)
	unknown = protowire.AppendString(unknown, "a field of a newer schema")
	p.ProtoReflect().SetUnknown(unknown)
	before := proto.Clone(p)

	got, err := withOptions(p, &QueryOptions{LoRAName: "x", Candidates: []string{"a"}})
	if err != nil {
		t.Fatal(err)
	}
	want := proto.Clone(p).(*kvindexv1.Prompt)
	want.LoraName = "x"
	if !proto.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if !proto.Equal(p, before) {
		t.Errorf("the prompt changed: %v", p)
	}
	if got.GetTokens() != p.GetTokens() {
		t.Error("the token ids were copied, not shared")
	}
	// Nothing to fill: the prompt itself.
	if same, err := withOptions(p, &QueryOptions{CacheSalt: "s"}); err != nil || same != p {
		t.Errorf("options adding nothing: %p, %v; want the prompt %p", same, err, p)
	}
}
