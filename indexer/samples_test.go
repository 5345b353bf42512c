package indexer

import (
	"slices"
	"testing"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
)

// An engine flagged mismatch keeps its newest BlockStored events, from
// the one that revealed the mismatch on, bounded in number and tokens and
// counted in Stats.Bytes; a verified engine keeps none; a restart forgets
// them and their bytes.
func TestHashSamples(t *testing.T) {
	kv := mustHasher(t, blockhash.SHA256CBOR, "0", 16)
	engineH := mustHasher(t, blockhash.SHA256CBOR, "42", 16)
	ix := mustNew(t, Options{Hasher: kv})
	good, bad := eng("good", 0), eng("bad", 0)

	ev, _ := storedChain(t, kv, nil, testutil.Seq(1, 32), nil)
	ix.Apply(good, 1, []kvevents.Event{ev})
	base := ix.Stats().Bytes

	var sent []kvevents.Event
	for i := range MaxHashSamples + 3 {
		n := 32
		if i == 1 {
			n = MaxHashSampleTokens + 64 // cut to its leading blocks
		}
		ev, _ := storedChain(t, engineH, nil, testutil.Seq(1000*(i+1), n), &blockhash.Extras{LoRAName: "sql"})
		ev.ExtraKeys = make([]blockhash.BlockExtra, len(ev.Hashes))
		for j := range ev.ExtraKeys {
			ev.ExtraKeys[j] = blockhash.BlockExtra{blockhash.Str("sql")}
		}
		ev.Digests = nil
		sent = append(sent, ev)
		ix.Apply(bad, uint64(i+1), []kvevents.Event{ev})
	}
	if c := engineInfo(t, ix, bad).HashCheck; c != HashMismatch {
		t.Fatalf("hash check %v, want mismatch", c)
	}
	got := ix.HashSamples("")
	if len(got) != 1 || got[0].Engine != bad {
		t.Fatalf("samples of %d engines, want bad's only: %+v", len(got), got)
	}
	evs := got[0].Events
	if len(evs) != MaxHashSamples {
		t.Fatalf("%d samples kept, want %d", len(evs), MaxHashSamples)
	}
	for i, ev := range evs {
		want := sent[len(sent)-MaxHashSamples+i]
		if !slices.Equal(ev.Hashes, want.Hashes) || !slices.Equal(ev.TokenIDs, want.TokenIDs) || ev.LoRAName != "sql" || len(ev.ExtraKeys) != len(ev.Hashes) {
			t.Errorf("sample %d differs from the event sent", i)
		}
	}
	// What HashSamples returned is the caller's: later events, whose
	// copies reuse the ring's storage, leave it alone.
	first := slices.Clone(evs[0].TokenIDs)
	for i := range MaxHashSamples {
		ev, _ := storedChain(t, engineH, nil, testutil.Seq(50_000+100*i, 32), nil)
		ix.Apply(bad, uint64(100+i), []kvevents.Event{ev})
	}
	if !slices.Equal(evs[0].TokenIDs, first) {
		t.Error("a returned sample changed with later events")
	}
	if grew := ix.Stats().Bytes - base; grew < int64(MaxHashSamples*32*8) {
		t.Errorf("bytes grew by %d with %d samples kept", grew, MaxHashSamples)
	}

	// The oversized event, when it was among the kept ones, kept whole
	// blocks within the bound.
	ix2 := mustNew(t, Options{Hasher: kv})
	ix2.Apply(bad, 1, []kvevents.Event{sent[1]})
	cut := ix2.HashSamples("other-model")
	if len(cut) != 0 {
		t.Errorf("another model's samples: %+v", cut)
	}
	cut = ix2.HashSamples(bad.Model)
	if len(cut) != 1 || len(cut[0].Events[0].TokenIDs) != MaxHashSampleTokens || len(cut[0].Events[0].Hashes) != MaxHashSampleTokens/16 {
		t.Fatalf("oversized event kept as %+v", cut)
	}

	before := ix.Stats().Bytes
	ix.Reset(bad, kvevents.ResetRestart)
	if s := ix.HashSamples(""); len(s) != 0 {
		t.Errorf("samples after restart: %d engines", len(s))
	}
	if after := ix.Stats().Bytes; after >= before {
		t.Errorf("bytes %d after restart, %d before", after, before)
	}
}
