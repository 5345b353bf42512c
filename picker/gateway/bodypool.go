package gateway

import (
	"math/bits"
	"strconv"
	"sync"
)

// Request bodies are buffered in recycled buffers of power-of-two
// capacities, from minBodyClass up to maxBodyClass bytes; larger bodies
// get buffers of their own. Without it a 110 KB body cost ~250 KB of
// garbage per request as append doubled its buffer frame by frame
// (BenchmarkPicker's B/op, README).
const (
	minBodyShift = 12 // 4 KiB
	maxBodyShift = 24 // 16 MiB, twice DefaultMaxBody
	// maxBodyPresize bounds how much a request's content-length may
	// reserve before its bytes arrive: a client that announces a large
	// body and trickles it holds no more than this until it sends more.
	// 256 KiB is a 40k-token chat.
	maxBodyPresize = 256 << 10
)

var bodyClasses [maxBodyShift - minBodyShift + 1]sync.Pool // of *[]byte

// bodyClass returns the class whose buffers hold n bytes, and false when
// n is beyond the largest class.
func bodyClass(n int) (int, bool) {
	if n <= 1<<minBodyShift {
		return 0, true
	}
	c := bits.Len(uint(n-1)) - minBodyShift
	return c, c < len(bodyClasses)
}

// getBody returns an empty buffer of capacity at least n, and at most
// limit when n <= limit (a class larger than limit is not used: the
// buffer's capacity is what the request is charged for).
func getBody(n, limit int) []byte {
	c, ok := bodyClass(n)
	if !ok || 1<<(c+minBodyShift) > max(n, limit) {
		return make([]byte, 0, n)
	}
	if p, _ := bodyClasses[c].Get().(*[]byte); p != nil {
		return (*p)[:0]
	}
	return make([]byte, 0, 1<<(c+minBodyShift))
}

// putBody recycles b, which nothing may use afterwards. Buffers not from
// getBody's classes are left to the collector.
func putBody(b []byte) {
	c, ok := bodyClass(cap(b))
	if !ok || cap(b) != 1<<(c+minBodyShift) {
		return
	}
	bodyClasses[c].Put(&b)
}

// appendBody appends frame to body, moving it to a larger recycled
// buffer (of at most limit bytes, unless the body needs more) when it is
// full.
func appendBody(body, frame []byte, limit int) []byte {
	if n := len(body) + len(frame); n > cap(body) {
		grown := append(getBody(max(n, min(2*cap(body), limit)), limit), body...)
		putBody(body)
		body = grown
	}
	return append(body, frame...)
}

// bodyPresize is the buffer a request's first body frame (not its last)
// is read into: the announced content-length (up to maxBodyPresize), else
// twice the frame (up to maxBody).
func bodyPresize(contentLength string, frame int, maxBody int) int {
	n, err := strconv.Atoi(contentLength)
	if err != nil || n <= frame || n > maxBody {
		return max(frame, min(2*frame, maxBody))
	}
	return min(n, max(maxBodyPresize, frame))
}
