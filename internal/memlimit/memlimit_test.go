package memlimit

import (
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"testing"
)

func TestFromBudget(t *testing.T) {
	tests := []struct {
		name    string
		budget  int64
		streams int
		want    Limits
	}{
		{"unlimited", 0, 4, Limits{}},
		{"16MiB, 4 streams", 16 << 20, 4, Limits{GoLimit: 16<<20 + (16<<20)/10 + 24<<20, RcvHWM: 512}},
		{"16MiB, bind mode's 8000", 16 << 20, 8000, Limits{GoLimit: 16<<20 + (16<<20)/10 + 24<<20, RcvHWM: minRcvHWM}},
		{"1GiB, 4 streams", 1 << 30, 4, Limits{GoLimit: 1<<30 + (1<<30)/10 + 24<<20, RcvHWM: MaxRcvHWM}},
		{"no streams", 16 << 20, 0, Limits{GoLimit: 16<<20 + (16<<20)/10 + 24<<20, RcvHWM: MaxRcvHWM}},
		{"huge", math.MaxInt64, 1, Limits{GoLimit: math.MaxInt64, RcvHWM: MaxRcvHWM}},
	}
	for _, tt := range tests {
		if got := FromBudget(tt.budget, tt.streams); got != tt.want {
			t.Errorf("%s: %+v, want %+v", tt.name, got, tt.want)
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

// The engines a budget follows in bind mode: one per EngineBytes, within
// [minEngines, the default]; the default without a budget.
func TestMaxEngines(t *testing.T) {
	for _, tc := range []struct {
		budget int64
		want   int
	}{
		{0, 8000}, {-1, 8000}, {1 << 20, minEngines}, {64 << 20, 1024}, {1 << 40, 8000},
	} {
		if got := MaxEngines(tc.budget, 8000); got != tc.want {
			t.Errorf("MaxEngines(%d) = %d, want %d", tc.budget, got, tc.want)
		}
	}
}
