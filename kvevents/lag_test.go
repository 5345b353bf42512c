package kvevents

import (
	"math"
	"testing"
	"time"
)

func TestBatchClock(t *testing.T) {
	const applied = int64(1_700_000_030_000_000_000) // 1,700,000,030 s
	tests := []struct {
		name      string
		ts        []float64 // stamps of the batches applied, in order
		wantStamp int64
		wantLag   time.Duration
	}{
		{"none", nil, 0, 0},
		{"unstamped", []float64{0}, 0, 0},
		{"behind", []float64{1_700_000_000}, 1_700_000_000_000_000_000, 30 * time.Second},
		{"engine clock ahead", []float64{1_700_000_040.5}, 1_700_000_040_500_000_000, -10500 * time.Millisecond},
		{"last stamp wins", []float64{1_700_000_000, 1_700_000_029}, 1_700_000_029_000_000_000, time.Second},
		{"unstamped keeps the last", []float64{1_700_000_020, 0}, 1_700_000_020_000_000_000, 10 * time.Second},
		{"not a clock", []float64{math.NaN(), math.Inf(1), -5, 1e300}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c BatchClock
			for _, ts := range tt.ts {
				c.Note(ts, applied)
			}
			stamp, lag := c.Load()
			// The stamp goes through float64 seconds: allow its rounding.
			if d := stamp - tt.wantStamp; d < -1000 || d > 1000 {
				t.Errorf("stamp = %d, want %d", stamp, tt.wantStamp)
			}
			if d := lag - tt.wantLag; d < -time.Microsecond || d > time.Microsecond {
				t.Errorf("lag = %v, want %v", lag, tt.wantLag)
			}
		})
	}
}
