package client_test

import (
	"slices"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
)

func TestFormatTiers(t *testing.T) {
	for _, tc := range []struct {
		tiers map[string]uint32
		want  string
	}{
		{nil, "-"},
		{map[string]uint32{}, "-"},
		{map[string]uint32{"GPU": 2}, "GPU:2"},
		{map[string]uint32{"CPU": 1, "GPU": 2}, "GPU:2 CPU:1"},
		{map[string]uint32{"disk": 3, "CPU": 3, "GPU": 4294967295}, "GPU:4294967295 CPU:3 disk:3"},
		{map[string]uint32{"": 0}, ":0"},
	} {
		if got := client.FormatTiers(tc.tiers); got != tc.want {
			t.Errorf("FormatTiers(%v) = %q, want %q", tc.tiers, got, tc.want)
		}
	}
}

func TestCachedFractionLines(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	tests := []struct {
		name  string
		fleet []client.FleetCacheJSON
		pods  []client.PodCacheJSON
		want  string
	}{
		{"no picker", nil, nil, ""},
		{"no query yet", []client.FleetCacheJSON{{WindowSeconds: 60}}, nil, "fleet cached fraction (last 1m0s): no queries\n"},
		{"models", []client.FleetCacheJSON{
			{Fraction: f(0.9134), WindowSeconds: 60},
			{Model: "a", Fraction: f(1), WindowSeconds: 60},
			{Model: "b", WindowSeconds: 60},
		}, nil, "fleet cached fraction (last 1m0s): 91.3% (a: 100.0%, b: no queries)\n"},
		{"one model asked for", []client.FleetCacheJSON{{Model: "a", Fraction: f(0), WindowSeconds: 30}}, nil,
			"fleet cached fraction (last 30s): a: 0.0%\n"},
		{"pods", []client.FleetCacheJSON{{Fraction: f(0.5), WindowSeconds: 60}},
			[]client.PodCacheJSON{{Pod: "pod-a", Fraction: f(0.25)}, {Pod: "pod-b"}},
			"fleet cached fraction (last 1m0s): 50.0%\nengine cached fraction (same window): pod-a: 25.0%, pod-b: no queries\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := (client.PodsJSON{Fleet: tt.fleet, PodCache: tt.pods}).CachedFractionLines(); got != tt.want {
				t.Errorf("CachedFractionLines:\n got %q\nwant %q", got, tt.want)
			}
		})
	}
}

func TestTokenizerCheckLine(t *testing.T) {
	resp := &kvindexv1.ListPodsResponse{TokenizerChecks: []*kvindexv1.TokenizerCheck{
		{Form: "completion", Verdict: "match", Detail: "3 samples"},
		{Form: "chat", Verdict: "mismatch", Disagrees: true, Detail: "ids differ at 12"},
	}}
	pj := client.PodsJSONOf(resp, time.Now())
	want := []client.TokenizerCheckJSON{{"completion", "match", false, "3 samples"}, {"chat", "mismatch", true, "ids differ at 12"}}
	if !slices.Equal(pj.TokenizerChecks, want) {
		t.Errorf("PodsJSONOf: tokenizer checks %+v, want %+v", pj.TokenizerChecks, want)
	}
	if got, want := pj.TokenizerCheckLine(), "local tokenizer vs the engines' /tokenize: completion match; chat mismatch (ids differ at 12)\n"; got != want {
		t.Errorf("TokenizerCheckLine:\n got %q\nwant %q", got, want)
	}
	if got := (client.PodsJSON{}).TokenizerCheckLine(); got != "" {
		t.Errorf("without a local tokenizer: %q, want none", got)
	}
}

func TestFormatLag(t *testing.T) {
	for _, tc := range []struct {
		seconds float64
		want    string
	}{
		{0.000_412_3, "412µs"}, {0.0123, "12ms"}, {1.234, "1.2s"}, {-0.002, "-2ms"}, {95.4, "1m35s"},
	} {
		if got := client.FormatLag(tc.seconds); got != tc.want {
			t.Errorf("FormatLag(%v) = %q, want %q", tc.seconds, got, tc.want)
		}
	}
}

func TestEventLine(t *testing.T) {
	const ms = 1700000000123
	at := time.UnixMilli(ms).Format("15:04:05.000")
	for _, tc := range []struct {
		ev   *kvindexv1.WatchResponse
		want string
	}{
		{&kvindexv1.WatchResponse{Pod: "pod-b", Seq: 1, Kind: kvindexv1.EventKind_EVENT_KIND_BLOCK_STORED, BlockHashes: []uint64{7, 8, 9},
			NumTokens: 48, Medium: "GPU", AppliedUnixMs: ms},
			at + " pod-b seq=1 BlockStored n=3 first=7 tokens=48 GPU\n"},
		{&kvindexv1.WatchResponse{Pod: "pod-a", DpRank: 2, Seq: 5, Kind: kvindexv1.EventKind_EVENT_KIND_BLOCK_STORED, BlockHashes: []uint64{1 << 63},
			HasParent: true, ParentHash: 0, GroupIdx: 1, LoraName: "sql", AppliedUnixMs: ms},
			at + " pod-a/2 seq=5 BlockStored n=1 first=9223372036854775808 parent=0 group=1 lora=sql\n"},
		{&kvindexv1.WatchResponse{Pod: "p", Seq: 2, Kind: kvindexv1.EventKind_EVENT_KIND_BLOCK_REMOVED, BlockHashes: []uint64{3}, Medium: "CPU", AppliedUnixMs: ms},
			at + " p seq=2 BlockRemoved n=1 first=3 CPU\n"},
		{&kvindexv1.WatchResponse{Pod: "p", Seq: 3, Kind: kvindexv1.EventKind_EVENT_KIND_ALL_BLOCKS_CLEARED, AppliedUnixMs: ms},
			at + " p seq=3 AllBlocksCleared\n"},
		{&kvindexv1.WatchResponse{Pod: "p", Kind: kvindexv1.EventKind_EVENT_KIND_RESET, ResetReason: "restart", Model: "qwen", Medium: "GPU", AppliedUnixMs: ms},
			at + " p seq=0 Reset reason=restart model=qwen\n"},
		{&kvindexv1.WatchResponse{Pod: "p", Kind: kvindexv1.EventKind(42), AppliedUnixMs: ms}, at + " p seq=0 42\n"},
		{&kvindexv1.WatchResponse{AppliedUnixMs: ms}, at + "  seq=0 EVENT_KIND_UNSPECIFIED\n"},
		{nil, time.UnixMilli(0).Format("15:04:05.000") + "  seq=0 EVENT_KIND_UNSPECIFIED\n"},
	} {
		if got := client.EventLine(tc.ev); got != tc.want {
			t.Errorf("EventLine(%v) = %q, want %q", tc.ev, got, tc.want)
		}
	}
}
