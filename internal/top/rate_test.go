package top

import (
	"testing"
	"time"
)

func TestRate(t *testing.T) {
	for _, tc := range []struct {
		name      string
		prev, cur float64
		hadPrev   bool
		dt        time.Duration
		want      float64
		ok        bool
	}{
		{"steady", 100, 150, true, 2 * time.Second, 25, true},
		{"idle", 100, 100, true, time.Second, 0, true},
		{"first scrape", 0, 150, false, time.Second, 0, false},
		{"no time passed", 100, 150, true, 0, 0, false},
		{"clock went back", 100, 150, true, -time.Second, 0, false},
		{"reset: counts from zero", 1000, 30, true, time.Second, 30, true},
		{"reset to zero", 1000, 0, true, 500 * time.Millisecond, 0, true},
		{"fractional interval", 0, 3, true, 1500 * time.Millisecond, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Rate(tc.prev, tc.cur, tc.hadPrev, tc.dt)
			if got != tc.want || ok != tc.ok {
				t.Errorf("Rate(%v, %v, %v, %v) = %v, %v; want %v, %v", tc.prev, tc.cur, tc.hadPrev, tc.dt, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestIncrease(t *testing.T) {
	for _, tc := range []struct {
		name      string
		prev, cur float64
		hadPrev   bool
		want      float64
		ok        bool
	}{
		{"grew", 10, 15, true, 5, true},
		{"reset", 10, 4, true, 4, true},
		{"no earlier reading", 0, 4, false, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Increase(tc.prev, tc.cur, tc.hadPrev)
			if got != tc.want || ok != tc.ok {
				t.Errorf("Increase(%v, %v, %v) = %v, %v; want %v, %v", tc.prev, tc.cur, tc.hadPrev, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestLagText(t *testing.T) {
	for _, tc := range []struct {
		lag  Num
		want string
	}{
		{Num{}, "-"},
		{known(0.000412, true), "412µs"},
		{known(0.0354, true), "35ms"},
		{known(-0.2, true), "-200ms"},
		{known(7.34, true), "7.3s"},
		{known(-12.5, true), "-12.5s"},
		{known(3725.4, true), "1h2m5s"},
	} {
		if got := lag(tc.lag); got != tc.want {
			t.Errorf("lag(%+v) = %q, want %q", tc.lag, got, tc.want)
		}
	}
}
