package zmqtransport

import (
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
)

func TestAddSaturating(t *testing.T) {
	tests := []struct {
		name          string
		start, n, out uint64
	}{
		{"small", 5, 7, 12},
		{"zero", 5, 0, 5},
		{"to the top", math.MaxUint64 - 3, 3, math.MaxUint64},
		{"past the top", math.MaxUint64 - 3, 4, math.MaxUint64},
		{"far past the top", math.MaxUint64 - 3, math.MaxUint64, math.MaxUint64},
		{"at the top", math.MaxUint64, 1, math.MaxUint64},
	}
	for _, tt := range tests {
		var c atomic.Uint64
		c.Store(tt.start)
		addSaturating(&c, tt.n)
		if got := c.Load(); got != tt.out {
			t.Errorf("%s: %d + %d = %d, want %d", tt.name, tt.start, tt.n, got, tt.out)
		}
	}
}

func TestSpan(t *testing.T) {
	tests := []struct{ from, to, want uint64 }{
		{3, 7, 4},
		{7, 7, 0},
		{7, 3, 0}, // reversed: nothing, not 2^64-4
		{0, math.MaxUint64, math.MaxUint64},
		{math.MaxUint64, 0, 0},
	}
	for _, tt := range tests {
		if got := span(tt.from, tt.to); got != tt.want {
			t.Errorf("span(%d, %d) = %d, want %d", tt.from, tt.to, got, tt.want)
		}
	}
}

// TestLostBatchesSaturate drives a stream with sequence numbers near 2^64
// over real sockets: each jump adds nearly 2^64 lost batches, and the
// counter must stop at the top instead of wrapping around to a small
// number (before, it read 2^64-7 here, then less with every jump).
func TestLostBatchesSaturate(t *testing.T) {
	pub, sink, s, e := connectedEngine(t, pubOptions{noReplay: true}, SubscriberConfig{}, "pod-w")
	const high = math.MaxUint64 - 1
	// 1: the seq went back on the same connection (a reset, but no
	// restart proven), then a jump again.
	for _, seq := range []uint64{0, high, 1, high} {
		pub.sendRaw(nil, seqBytes(seq), encodeTestBatch(t, seq, 0, kvevents.ShapeArray))
	}
	testutil.Await(t, waitTimeout, "4 batches applied", func() bool {
		st, _ := streamOf(s, e)
		return st.Batches == 4
	})
	sink.wantCalls(t, e, []string{"0", "18446744073709551614", "reset:restart", "1", "18446744073709551614"})
	st := mustStream(t, s, e)
	if st.LostBatches != math.MaxUint64 || st.Gaps != 2 || st.Resets != 1 || st.Restarts != 0 {
		t.Fatalf("stats %+v; want lost batches saturated at %d, 2 gaps, 1 reset, no restart", st, uint64(math.MaxUint64))
	}
}

// TestResourceDefaults checks the defaults that bound a subscriber's
// memory, and that each comes from its one home.
func TestResourceDefaults(t *testing.T) {
	tests := []struct {
		name       string
		cfg        SubscriberConfig
		maxMsg     int64
		maxEngines int
	}{
		{"zero", SubscriberConfig{}, int64(kvevents.DefaultLimits().MaxPayload), DefaultMaxEngines},
		{"decoder limit", SubscriberConfig{Limits: kvevents.Limits{MaxPayload: 4096}}, 4096, DefaultMaxEngines},
		{"explicit", SubscriberConfig{Limits: kvevents.Limits{MaxPayload: 4096}, MaxMsgSize: 100, MaxEngines: 7}, 100, 7},
	}
	for _, tt := range tests {
		tt.cfg.setDefaults()
		if tt.cfg.MaxMsgSize != tt.maxMsg || tt.cfg.MaxEngines != tt.maxEngines || tt.cfg.RcvHWM != DefaultRcvHWM {
			t.Errorf("%s: MaxMsgSize %d, MaxEngines %d, RcvHWM %d; want %d, %d, %d", tt.name,
				tt.cfg.MaxMsgSize, tt.cfg.MaxEngines, tt.cfg.RcvHWM, tt.maxMsg, tt.maxEngines, DefaultRcvHWM)
		}
	}
}

// TestOversizeFrameRefused sends a payload over the decoder's limit: libzmq
// refuses the frame (MaxMsgSize follows the limit) and drops the
// connection, so the batch never reaches the decoder or the Sink. libzmq
// does not reconnect after such a protocol error; the stream's watchdog
// reopens the socket (before, the engine stayed unheard for good), and
// later batches flow.
func TestOversizeFrameRefused(t *testing.T) {
	pub, sink, s, e := connectedEngine(t, pubOptions{noReplay: true}, SubscriberConfig{Limits: kvevents.Limits{MaxPayload: 4096}, ReconnectIvlMax: 200 * time.Millisecond}, "pod-big")
	pub.sendRaw(nil, seqBytes(0), encodeTestBatch(t, 0, 0, kvevents.ShapeArray))
	sink.waitApplied(t, e, 0)
	pub.sendRaw(nil, seqBytes(1), frameOf(8192, 0x90))
	testutil.Await(t, waitTimeout, "the oversize frame's connection dropped", func() bool {
		st, _ := streamOf(s, e)
		return !st.Connected
	})
	waitReady(t, s, e)
	pub.waitSubscribed(2)
	pub.sendRaw(nil, seqBytes(2), encodeTestBatch(t, 2, 0, kvevents.ShapeArray))
	sink.waitApplied(t, e, 2)
	sink.wantCalls(t, e, []string{"0", "2"})
	if st := mustStream(t, s, e); st.DecodeErrors != 0 {
		t.Fatalf("stats %+v: the oversize frame reached the decoder", st)
	}
}
