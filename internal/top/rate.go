package top

import "time"

// Rate is a counter's increase per second between two readings taken dt
// apart. A counter that went down was reset (its process restarted) in
// between: its increase is then at least its current value, which is
// what is counted, as Prometheus's rate() does. ok is false when there is
// no earlier reading or no time passed, so the frame shows "-".
func Rate(prev, cur float64, hadPrev bool, dt time.Duration) (perSec float64, ok bool) {
	if !hadPrev || dt <= 0 {
		return 0, false
	}
	inc := cur - prev
	if cur < prev {
		inc = cur
	}
	return inc / dt.Seconds(), true
}

// Increase is a counter's increase between two readings, resets counted
// as in Rate; ok is false without an earlier reading.
func Increase(prev, cur float64, hadPrev bool) (float64, bool) {
	if !hadPrev {
		return 0, false
	}
	if cur < prev {
		return cur, true
	}
	return cur - prev, true
}
