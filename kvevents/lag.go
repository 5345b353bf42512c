package kvevents

import (
	"sync/atomic"
	"time"
)

// maxStampSeconds bounds the batch timestamps taken as a wall clock: 2^33
// seconds (the year 2242) is short of where nanoseconds since 1970
// overflow an int64 (2262), so a larger stamp, like NaN, infinity or a
// negative one, is not a clock.
const maxStampSeconds = 1 << 33

// stampUnixNano converts a batch's TS (the engine's wall clock in seconds)
// to Unix nanoseconds; false if the batch carries no usable stamp (0, as
// engines that do not stamp send, or a value no clock shows).
func stampUnixNano(ts float64) (int64, bool) {
	if !(ts > 0 && ts < maxStampSeconds) {
		return 0, false
	}
	return int64(ts * 1e9), true
}

// BatchClock records, for one stream, the engine's stamp of the last
// applied batch and how long after that stamp kvindex applied it: the
// ingest lag (see StreamStats.LastBatchLag). A stream's goroutine calls
// Note once per applied batch, two atomic stores; Load is lock-free.
type BatchClock struct {
	stamp, lag atomic.Int64
}

// Note records a batch stamped ts applied at appliedUnixNano (kvindex's
// wall clock). A batch without a usable stamp leaves the record as it was.
func (c *BatchClock) Note(ts float64, appliedUnixNano int64) {
	stamp, ok := stampUnixNano(ts)
	if !ok {
		return
	}
	c.lag.Store(appliedUnixNano - stamp)
	c.stamp.Store(stamp)
}

// Load returns the last recorded stamp (Unix nanoseconds, 0 if none) and
// lag.
func (c *BatchClock) Load() (stampUnixNano int64, lag time.Duration) {
	return c.stamp.Load(), time.Duration(c.lag.Load())
}
