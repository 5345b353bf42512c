package gateway

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// waits reads what a queue histogram observed: how many turns, how long
// they waited in all.
func waits(t *testing.T, h prometheus.Histogram) (uint64, float64) {
	t.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

// TestBodySlotTurns runs the body turns on a fake clock (testing/synctest),
// where a wait lasts exactly as long as the test makes it: a turn taken
// from a free slot observes 0, one queued behind a held slot observes its
// wait, a holder whose next read stalls past bodySlotPatience gives its
// slot back, and a queued request whose context ends gives up.
func TestBodySlotTurns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "wait_seconds", Help: "test"})
		slots := make(chan struct{}, 1)
		first := &bodySlot{slots: slots, wait: h}
		if !first.take(ctx) {
			t.Fatal("the free slot was not taken")
		}
		if !first.take(ctx) {
			t.Fatal("taking a held slot again failed")
		}
		if n, sum := waits(t, h); n != 1 || sum != 0 {
			t.Fatalf("after a free slot: %d turns, %v s; want 1 turn, 0 s", n, sum)
		}

		// A second request queues until the first gives its slot back.
		second := &bodySlot{slots: slots, wait: h}
		got := make(chan bool)
		go func() { got <- second.take(ctx) }()
		synctest.Wait()
		time.Sleep(3 * time.Millisecond)
		first.give()
		if !<-got {
			t.Fatal("the queued request did not get the slot given back")
		}
		if n, sum := waits(t, h); n != 2 || sum != 0.003 {
			t.Fatalf("after a 3 ms wait: %d turns, %v s; want 2 turns, 0.003 s", n, sum)
		}
		first.give() // not held: a no-op, the second keeps its slot

		// The holder's next read stalls: its slot goes back after
		// bodySlotPatience, not before, and the first takes it.
		stop := second.waiting()
		go func() { got <- first.take(ctx) }()
		synctest.Wait()
		time.Sleep(bodySlotPatience - time.Nanosecond)
		synctest.Wait()
		select {
		case <-got:
			t.Fatal("the slot was given back before bodySlotPatience")
		default:
		}
		time.Sleep(time.Nanosecond)
		if !<-got {
			t.Fatal("the stalled holder's slot was not given back")
		}
		stop()
		if n, sum := waits(t, h); n != 3 || sum != 0.003+bodySlotPatience.Seconds() {
			t.Fatalf("after the give-back: %d turns, %v s; want 3 turns, %v s", n, sum, 0.003+bodySlotPatience.Seconds())
		}

		// A read that comes in time keeps the slot.
		stop = first.waiting()
		time.Sleep(bodySlotPatience / 2)
		stop()
		time.Sleep(bodySlotPatience)
		if !first.held || len(slots) != 1 {
			t.Fatalf("a read within patience lost the slot: held %v, %d of 1 slots busy", first.held, len(slots))
		}

		// A queued request whose context ends gives up, unobserved.
		cctx, cancel := context.WithCancel(ctx)
		go func() { got <- second.take(cctx) }()
		synctest.Wait()
		cancel()
		if <-got {
			t.Fatal("a cancelled request took a busy slot")
		}
		if second.held {
			t.Fatal("a cancelled request counts a slot as held")
		}
		if n, _ := waits(t, h); n != 3 {
			t.Fatalf("a cancelled wait was observed: %d turns, want 3", n)
		}
	})
}
