package main

import (
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"testing"

	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

func TestMemoryLimits(t *testing.T) {
	tests := []struct {
		name    string
		budget  int64
		streams int
		want    memLimits
	}{
		{"unlimited", 0, 4, memLimits{}},
		{"16MiB, 4 streams", 16 << 20, 4, memLimits{goLimit: 16<<20 + goOverhead, rcvHWM: 512}},
		{"16MiB, bind mode's 8000", 16 << 20, 8000, memLimits{goLimit: 16<<20 + goOverhead, rcvHWM: minRcvHWM}},
		{"1GiB, 4 streams", 1 << 30, 4, memLimits{goLimit: 1<<30 + goOverhead, rcvHWM: zmqtransport.DefaultRcvHWM}},
		{"no streams", 16 << 20, 0, memLimits{goLimit: 16<<20 + goOverhead, rcvHWM: zmqtransport.DefaultRcvHWM}},
		{"huge", math.MaxInt64, 1, memLimits{goLimit: math.MaxInt64, rcvHWM: zmqtransport.DefaultRcvHWM}},
	}
	for _, tt := range tests {
		if got := memoryLimits(tt.budget, tt.streams); got != tt.want {
			t.Errorf("%s: %+v, want %+v", tt.name, got, tt.want)
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
	memLimits{goLimit: orig - 1}.apply(log) // the variable is set, even if empty: the user decided
	if got := debug.SetMemoryLimit(-1); got != orig {
		t.Fatalf("with GOMEMLIMIT set the limit changed to %d", got)
	}
	memLimits{}.apply(log)
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
	memLimits{goLimit: 80 << 20}.apply(slog.New(slog.DiscardHandler))
	if got := debug.SetMemoryLimit(-1); got != 80<<20 {
		t.Fatalf("Go memory limit %d, want %d", got, 80<<20)
	}
}
