package memlimit

import (
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"strings"
	"testing"
)

func TestFromBudget(t *testing.T) {
	bound := func(b int64) int64 { return b + b/10 + FixedOverhead - NonGoReserve }
	tests := []struct {
		name    string
		budget  int64
		streams int
		want    Limits
	}{
		{"unlimited", 0, 4, Limits{}},
		{"16MiB, 4 streams", 16 << 20, 4, Limits{GoLimit: bound(16<<20) - 4<<20, RcvHWM: 512}},
		{"16MiB, bind mode's 32", 16 << 20, 32, Limits{GoLimit: bound(16<<20) - 32*64*2<<10, RcvHWM: 64}},
		{"1GiB, 4 streams", 1 << 30, 4, Limits{GoLimit: bound(1<<30) - 4*MaxRcvHWM*2<<10, RcvHWM: MaxRcvHWM}},
		{"no streams", 16 << 20, 0, Limits{GoLimit: bound(16<<20) - MaxRcvHWM*2<<10, RcvHWM: MaxRcvHWM}},
		{"too many streams: the floors", 1 << 20, 100, Limits{GoLimit: bound(1<<20) - 100*minRcvHWM*2<<10, RcvHWM: minRcvHWM}},
		{"huge", math.MaxInt64, 1, Limits{GoLimit: math.MaxInt64, RcvHWM: MaxRcvHWM}},
	}
	for _, tt := range tests {
		if got := FromBudget(tt.budget, tt.streams); got != tt.want {
			t.Errorf("%s: %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

// Split's shares add up to the budget at most, whatever the budget and
// the number of streams it can hold; beyond that it says so, naming a
// budget that does hold them.
func TestSplit(t *testing.T) {
	for _, tokens := range []bool{false, true} {
		for _, budget := range []int64{1 << 20, 2 << 20, 16 << 20, 100 << 20, 1 << 30, 64 << 30} {
			for _, streams := range []int{0, 1, 3, 4, 64, 1000, 8000, MaxEngines(budget, 8000)} {
				s, err := Split(budget, streams, tokens)
				if err != nil {
					if streams <= MaxEngines(budget, 8000) {
						t.Errorf("Split(%d, %d, %v): %v, though bind mode admits that many", budget, streams, tokens, err)
					}
					continue
				}
				if sum := s.Index + s.Queues + s.Engines + s.Tokens; sum > budget || s.Index < budget/2 {
					t.Errorf("Split(%d, %d, %v) = %+v: adds up to %d", budget, streams, tokens, s, sum)
				}
				n := int64(max(streams, 1))
				if s.Queues != n*int64(s.RcvHWM)*queueMsgBytes || s.Engines != n*EngineBytes ||
					s.RcvHWM < minRcvHWM || s.RcvHWM > MaxRcvHWM {
					t.Errorf("Split(%d, %d, %v) = %+v", budget, streams, tokens, s)
				}
				// The tokenizers' caches get their share, less what the
				// queues' floors need of it.
				if !tokens && s.Tokens != 0 || s.Tokens > TokenCacheBytes(budget) || (tokens && budget >= 16<<20 && streams <= 64 && s.Tokens != TokenCacheBytes(budget)) {
					t.Errorf("Split(%d, %d, %v): tokenizer caches %d of %d", budget, streams, tokens, s.Tokens, TokenCacheBytes(budget))
				}
			}
		}
	}
	if s, _ := Split(0, 4, true); s != (Shares{}) {
		t.Errorf("no budget: %+v, want no shares", s)
	}
	// A budget too small for its streams names one that holds them.
	_, err := Split(1<<20, 100, false)
	if err == nil || !strings.Contains(err.Error(), "at most 5 engine ranks") || !strings.Contains(err.Error(), "100 need 18.75MiB or more") {
		t.Fatalf("1 MiB for 100 streams: %v", err)
	}
	if _, err := Split(19<<20, 100, false); err != nil {
		t.Errorf("the budget the error named: %v", err)
	}
	// The tokenizers' caches yield to the streams: the same budget holds
	// the same streams with them.
	if s, err := Split(19<<20, 100, true); err != nil || s.Tokens == 0 {
		t.Errorf("19 MiB for 100 streams and tokenizer caches: %+v, %v", s, err)
	}
	// The bind-mode default always fits, connect mode's few engines too.
	if _, err := Split(1<<20, 3+MaxEngines(1<<20, 8000), true); err != nil {
		t.Errorf("1 MiB, 3 engines and bind mode: %v", err)
	}
}

func TestTokenCacheBytes(t *testing.T) {
	for _, tt := range []struct{ budget, want int64 }{
		{0, DefaultTokenCacheBytes},
		{-1, DefaultTokenCacheBytes},
		{16 << 20, 1 << 20},
		{1 << 30, DefaultTokenCacheBytes},
	} {
		if got := TokenCacheBytes(tt.budget); got != tt.want {
			t.Errorf("TokenCacheBytes(%d) = %d, want %d", tt.budget, got, tt.want)
		}
	}
}

func TestProcessBound(t *testing.T) {
	tests := []struct {
		budget, want int64
	}{
		{0, 0},
		{-1, 0},
		{16 << 20, 16<<20 + 16<<20/10 + 64<<20},
		{3 << 30, 3<<30 + 3<<30/10 + 64<<20},
		{math.MaxInt64 - FixedOverhead, math.MaxInt64},
		{math.MaxInt64, math.MaxInt64},
	}
	for _, tt := range tests {
		if got := ProcessBound(tt.budget); got != tt.want {
			t.Errorf("ProcessBound(%d) = %d, want %d", tt.budget, got, tt.want)
		}
	}
}

func TestBodyBytes(t *testing.T) {
	tests := []struct {
		name                 string
		budget, largest, def int64
		want                 int64
	}{
		{"no budget: the default", 0, 8 << 20, 32 << 20, 32 << 20},
		{"negative budget: the default", -1, 8 << 20, 32 << 20, 32 << 20},
		{"64MiB: one largest body, above the share", 64 << 20, 8 << 20, 32 << 20, 8 << 20},
		{"64MiB, small bodies: the share", 64 << 20, 1 << 20, 4 << 20, 4 << 20},
		{"1GiB: the share", 1 << 30, 8 << 20, 128 << 20, 64 << 20},
		{"huge: the default", math.MaxInt64, 8 << 20, 32 << 20, 32 << 20},
	}
	for _, tt := range tests {
		if got := BodyBytes(tt.budget, tt.largest, tt.def); got != tt.want {
			t.Errorf("%s: BodyBytes(%d, %d, %d) = %d, want %d", tt.name, tt.budget, tt.largest, tt.def, got, tt.want)
		}
	}
}

// TestMemoryLimitApply sets the Go memory limit from the budget, unless
// GOMEMLIMIT says otherwise.
func TestMemoryLimitApply(t *testing.T) {
	orig := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(orig) })
	log := slog.New(slog.DiscardHandler)

	t.Setenv("GOMEMLIMIT", "")
	Limits{GoLimit: orig - 1}.Apply(log) // the variable is set, even if empty: the user decided
	if got := debug.SetMemoryLimit(-1); got != orig {
		t.Fatalf("with GOMEMLIMIT set the limit changed to %d", got)
	}
	Limits{}.Apply(log)
	if got := debug.SetMemoryLimit(-1); got != orig {
		t.Fatalf("without a budget the limit changed to %d", got)
	}
}

func TestMemoryLimitApplyWithoutGOMEMLIMIT(t *testing.T) {
	orig := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(orig) })
	if _, ok := os.LookupEnv("GOMEMLIMIT"); ok {
		t.Skip("GOMEMLIMIT is set for the test process")
	}
	Limits{GoLimit: 80 << 20}.Apply(slog.New(slog.DiscardHandler))
	if got := debug.SetMemoryLimit(-1); got != 80<<20 {
		t.Fatalf("Go memory limit %d, want %d", got, 80<<20)
	}
}

// The engines a budget follows in bind mode: as many as the engines'
// share holds (one per 512 KiB), within [1, the default]; the default
// without a budget.
func TestMaxEngines(t *testing.T) {
	for _, tc := range []struct {
		budget int64
		want   int
	}{
		{0, 8000}, {-1, 8000}, {256 << 10, 1}, {1 << 20, 2}, {64 << 20, 128}, {1 << 30, 2048}, {1 << 40, 8000},
	} {
		if got := MaxEngines(tc.budget, 8000); got != tc.want {
			t.Errorf("MaxEngines(%d) = %d, want %d", tc.budget, got, tc.want)
		}
	}
}
