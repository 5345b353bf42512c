package zmqtransport

/*
#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
static int kv_arena_max(int n) { return mallopt(M_ARENA_MAX, n); }
static int kv_trim(void) { return malloc_trim(0); }
#define KV_GLIBC 1
#else
static int kv_arena_max(int n) { return 0; }
static int kv_trim(void) { return 0; }
#define KV_GLIBC 0
#endif
*/
import "C"

import (
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// libzmq allocates every received message with malloc, on its I/O
// threads, and a flood queues up to RcvHWM of them per socket. glibc gives
// each thread that allocates its own arena (up to eight per core) and
// returns an arena's free memory to the system only from the top of its
// heap, so after a flood the process keeps its peak size although the
// queues are empty. The subscriber therefore caps glibc's arenas (before
// libzmq's threads start) and hands free memory back periodically and
// after a large message. Elsewhere than glibc both are no-ops.
// TestFloodRSS measures the effect (numbers in README.md).

// arenaMax is the number of malloc arenas the process keeps: libzmq's I/O
// thread and the Go threads share two instead of up to eight per core.
const arenaMax = 2

// trimEvery is how often free malloc memory is handed back while a
// subscriber runs; trimAfter bounds how often a large message triggers it.
const (
	trimEvery = 10 * time.Second
	trimAfter = time.Second
)

var arenaOnce sync.Once

// capArenas caps glibc's malloc arenas, once per process, unless the user
// chose a number (MALLOC_ARENA_MAX, which glibc reads itself).
func capArenas() {
	arenaOnce.Do(func() {
		if _, set := os.LookupEnv("MALLOC_ARENA_MAX"); set || C.KV_GLIBC == 0 {
			return
		}
		C.kv_arena_max(arenaMax)
	})
}

// lastTrim is when trimMalloc last ran (monotonic nanoseconds since
// trimEpoch), for its rate limit.
var (
	lastTrim  atomic.Int64
	trimEpoch = time.Now()
)

// trimMalloc hands free malloc memory back to the system, at most once
// per minGap. It takes a few milliseconds on a large fragmented heap.
func trimMalloc(minGap time.Duration) {
	now := int64(time.Since(trimEpoch))
	last := lastTrim.Load()
	if last != 0 && now-last < int64(minGap) || !lastTrim.CompareAndSwap(last, now) {
		return
	}
	C.kv_trim()
}

// trimmer calls trimMalloc (at most every trimEvery/2), and then also,
// every period until stop is closed.
func trimmer(stop <-chan struct{}, done chan<- struct{}, period time.Duration, also func()) {
	defer close(done)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			trimMalloc(trimEvery / 2)
			also()
		}
	}
}
