package watchhub

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/kvevents"
)

func storedHashes(hashes ...uint64) kvevents.Event {
	return kvevents.Event{Kind: kvevents.BlockStored, Hashes: hashes, TokenIDs: make([]uint64, 16*len(hashes)), BlockSize: 16}
}

// next reads w's next event, failing the test if none comes in time.
func next(t testing.TB, w *Watcher) *kvindexv1.WatchResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := w.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return m
}

// flush waits until the fan-out has delivered everything applied before
// it: the fan-out handles batches in order, so once a watcher of its own
// pod sees a marker batch, every earlier batch has been offered to every
// watcher.
func flush(t testing.TB, h *Hub) {
	t.Helper()
	w, err := h.Subscribe([]string{"flush-marker"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	h.Apply(engine("flush-marker", 0), 0, []kvevents.Event{storedHashes(1)})
	if m := next(t, w); m.GetPod() != "flush-marker" {
		t.Fatalf("flush marker: got %v", m)
	}
}

// The hub applies a batch to its sink before any watcher sees it.
func TestHubAppliesBeforePublishing(t *testing.T) {
	sink := &recordingSink{}
	h := New(sink, Limits{})
	defer h.Close()
	w, err := h.Subscribe(nil)
	if err != nil {
		t.Fatal(err)
	}
	var queuedAtApply []int
	sink.onCall = func() { queuedAtApply = append(queuedAtApply, w.Queued()) }
	h.Apply(engine("a", 0), 7, []kvevents.Event{storedHashes(1, 2), {Kind: kvevents.AllBlocksCleared}})
	h.Reset(engine("a", 0), kvevents.ResetRemoved)
	if want := []string{"apply a", "reset a removed"}; !slices.Equal(sink.calls, want) {
		t.Errorf("sink calls %q, want %q", sink.calls, want)
	}
	if !slices.Equal(queuedAtApply, []int{0}) {
		t.Errorf("events queued while the sink applied: %v, want none", queuedAtApply)
	}
	var kinds []kvindexv1.EventKind
	for range 3 {
		m := next(t, w)
		kinds = append(kinds, m.GetKind())
		if m.GetPod() != "a" || m.GetModel() != testModel {
			t.Errorf("event %v: wrong engine", m)
		}
	}
	want := []kvindexv1.EventKind{kvindexv1.EventKind_EVENT_KIND_BLOCK_STORED, kvindexv1.EventKind_EVENT_KIND_ALL_BLOCKS_CLEARED, kvindexv1.EventKind_EVENT_KIND_RESET}
	if !slices.Equal(kinds, want) {
		t.Errorf("kinds %v, want %v", kinds, want)
	}
	if !h.SawEvent() {
		t.Error("SawEvent false after Apply")
	}
}

// The hub copies the hashes: the subscriber reuses its event storage.
func TestHubCopiesHashes(t *testing.T) {
	h := New(&recordingSink{}, Limits{})
	defer h.Close()
	w, _ := h.Subscribe(nil)
	ev := storedHashes(1, 2, 3)
	h.Apply(engine("a", 0), 0, []kvevents.Event{ev})
	ev.Hashes[0] = 99
	if m := next(t, w); !slices.Equal(m.GetBlockHashes(), []uint64{1, 2, 3}) || m.GetNumTokens() != 48 {
		t.Errorf("hashes %v, tokens %d; want [1 2 3], 48", m.GetBlockHashes(), m.GetNumTokens())
	}
}

func TestHubFilter(t *testing.T) {
	h := New(&recordingSink{}, Limits{})
	defer h.Close()
	onlyB, _ := h.Subscribe([]string{"b"})
	all, _ := h.Subscribe(nil)
	for i, pod := range []string{"a", "b", "c", "b"} {
		h.Apply(engine(pod, 0), uint64(i), []kvevents.Event{storedHashes(uint64(i))})
	}
	flush(t, h)
	if n := onlyB.Queued(); n != 2 {
		t.Errorf("filtered watcher got %d events, want 2", n)
	}
	if n := all.Queued(); n != 5 { // and the flush marker
		t.Errorf("unfiltered watcher got %d events, want 5", n)
	}
	for range 2 {
		if m := next(t, onlyB); m.GetPod() != "b" {
			t.Errorf("filtered watcher got pod %q", m.GetPod())
		}
	}
}

// A watcher that falls behind is closed with a BehindError counting the
// events it lost (its queued ones included: they are dropped at once), and
// never blocks ingest or the other watchers; it gets no stream with holes.
func TestHubSlowWatcher(t *testing.T) {
	sink := &recordingSink{}
	h := New(sink, Limits{WatchQueueEvents: 4})
	defer h.Close()
	slow, _ := h.Subscribe(nil)
	fast, _ := h.Subscribe(nil)
	var seqs []uint64
	for i := range 6 {
		h.Apply(engine("a", 0), uint64(i), []kvevents.Event{storedHashes(uint64(i))})
		m := next(t, fast)
		seqs = append(seqs, m.GetSeq())
		if m.GetDropped() != 0 {
			t.Errorf("fast watcher's seq %d reports %d dropped", m.GetSeq(), m.GetDropped())
		}
	}
	flush(t, h)
	if sink.events != 7 {
		t.Errorf("index got %d events, want 7", sink.events)
	}
	if !slices.Equal(seqs, []uint64{0, 1, 2, 3, 4, 5}) {
		t.Errorf("fast watcher got seqs %v", seqs)
	}
	_, err := slow.Next(context.Background())
	var be *BehindError
	if !errors.As(err, &be) || be.Events != 5 || be.Hub {
		t.Fatalf("slow watcher: %v, want behind by 5 events", err)
	}
	if want := "watch fell behind by 5 events; reconnect"; err.Error() != want {
		t.Errorf("notice %q, want %q", err, want)
	}
	if h.Dropped() != 5 || h.ClosedBehind() != 1 || h.Watchers() != 1 {
		t.Errorf("dropped %d, closed %d, watchers %d; want 5, 1, 1", h.Dropped(), h.ClosedBehind(), h.Watchers())
	}
}

// The queue is bounded in bytes too.
func TestHubWatcherBytes(t *testing.T) {
	h := New(&recordingSink{}, Limits{WatchQueueBytes: 1000})
	defer h.Close()
	w, _ := h.Subscribe(nil)
	big := make([]uint64, 200) // 1,600 bytes of hashes
	h.Apply(engine("a", 0), 0, []kvevents.Event{storedHashes(big...)})
	flush(t, h)
	var be *BehindError
	if _, err := w.Next(context.Background()); !errors.As(err, &be) || be.Events != 1 {
		t.Errorf("watcher: %v, want behind by 1 event", err)
	}
}

// 200 watchers that never read: ingest finishes every batch, and every
// slow watcher is closed with the notice (BenchmarkHubApplyWatchers
// measures the cost).
func TestHubNonReadingWatchers(t *testing.T) {
	sink := &recordingSink{}
	h := New(sink, Limits{WatchQueueEvents: 8, MaxWatchers: 300})
	defer h.Close()
	var ws []*Watcher
	for range 200 {
		w, err := h.Subscribe(nil)
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 1000 {
			h.Apply(engine("a", 0), uint64(i), []kvevents.Event{storedHashes(uint64(i), uint64(i)+1)})
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Apply blocked on watchers that do not read")
	}
	flush(t, h)
	if sink.events != 1001 {
		t.Errorf("index got %d events, want 1001", sink.events)
	}
	for i, w := range ws {
		var be *BehindError
		if _, err := w.Next(context.Background()); !errors.As(err, &be) {
			t.Fatalf("watcher %d: %v, want a BehindError", i, err)
		}
	}
	if h.ClosedBehind() != 200 || h.Watchers() != 0 {
		t.Errorf("closed %d, open %d; want 200, 0", h.ClosedBehind(), h.Watchers())
	}
}

// A batch the fan-out queue cannot take closes every watcher that misses
// it; a watcher subscribed after the drop is not closed for it.
func TestHubQueueOverflow(t *testing.T) {
	sink := &recordingSink{}
	h := New(sink, Limits{HubQueueBatches: 2})
	defer h.Close()
	w, _ := h.Subscribe(nil)
	h.mu.Lock() // the fan-out cannot deliver meanwhile
	for i := range 10 {
		h.Apply(engine("a", 0), uint64(i), []kvevents.Event{storedHashes(uint64(i))})
	}
	h.mu.Unlock()
	if sink.events != 10 {
		t.Errorf("index got %d events, want 10", sink.events)
	}
	// The fan-out may have taken the first batches (and a drop marker)
	// before the lock stopped it, so only bounds are certain: each of its
	// takes holds at most the queue's 2 batches and one marker.
	dropped := h.DroppedBatches()
	if dropped < 1 || dropped > 8 {
		t.Errorf("fan-out queue dropped %d batches, want 1..8", dropped)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := 0
	var err error
	for err == nil {
		if _, err = w.Next(ctx); err == nil {
			got++
		}
	}
	var be *BehindError
	if !errors.As(err, &be) || !be.Hub {
		t.Fatalf("watcher: %v, want a fan-out BehindError", err)
	}
	// The watcher ends at the first marker: it reports the events lost up
	// to there (those dropped and those still queued for it); batches
	// dropped after that are not its loss, it has ended.
	if be.Events < 1 || uint64(got)+be.Events > 10 || uint64(got) > 10-dropped {
		t.Errorf("watcher got %d events and lost %d with %d dropped; want at least 1 lost, at most 10 in all", got, be.Events, dropped)
	}
}

func TestHubMaxWatchers(t *testing.T) {
	h := New(&recordingSink{}, Limits{MaxWatchers: 2})
	defer h.Close()
	a, _ := h.Subscribe(nil)
	h.Subscribe(nil)
	if _, err := h.Subscribe(nil); !errors.Is(err, ErrTooManyWatchers) || h.Refused() != 1 {
		t.Errorf("third watcher: %v (refused %d), want ErrTooManyWatchers", err, h.Refused())
	}
	a.Close()
	a.Close() // counted once
	c, err := h.Subscribe(nil)
	if err != nil {
		t.Errorf("after a Close: %v", err)
	}
	// A watcher ended for falling behind holds its slot until its owner
	// closes it (a Watch handler may still be sending).
	c.fail(&BehindError{Events: 1})
	if _, err := h.Subscribe(nil); !errors.Is(err, ErrTooManyWatchers) || h.Open() != 2 {
		t.Errorf("with a failed watcher not closed: %v (open %d), want ErrTooManyWatchers", err, h.Open())
	}
	c.Close()
	if _, err := h.Subscribe(nil); err != nil {
		t.Errorf("after the failed watcher's Close: %v", err)
	}
}

func TestHubClose(t *testing.T) {
	h := New(&recordingSink{}, Limits{})
	w1, _ := h.Subscribe(nil)
	w2, _ := h.Subscribe(nil)
	w2.Close()
	w2.Close() // idempotent
	if h.Watchers() != 1 {
		t.Errorf("%d watchers, want 1", h.Watchers())
	}
	h.Close()
	if _, err := w1.Next(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Next after the hub closed: %v", err)
	}
	w1.Close() // after the hub's Close: no double close
	if _, err := h.Subscribe(nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Subscribe after Close: %v", err)
	}
	h.Close()
	// Ingest goes on.
	h.Apply(engine("a", 0), 0, []kvevents.Event{storedHashes(1)})
}

// Concurrent ingest of several engines while watchers come and go (run
// with -race).
func TestHubConcurrent(t *testing.T) {
	sink := &recordingSink{}
	h := New(sink, Limits{})
	var wg sync.WaitGroup
	for e := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				h.Apply(engine("p", e), uint64(i), []kvevents.Event{storedHashes(uint64(i))})
			}
		}()
	}
	stop := make(chan struct{})
	var got sync.WaitGroup
	for range 3 {
		got.Add(1)
		go func() {
			defer got.Done()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() { <-stop; cancel() }()
			for ctx.Err() == nil {
				w, err := h.Subscribe(nil)
				if err != nil {
					return
				}
				for range 10 {
					if _, err := w.Next(ctx); err != nil {
						break
					}
				}
				w.Close()
			}
		}()
	}
	wg.Wait()
	close(stop)
	h.Close()
	got.Wait()
	if sink.events != 2000 {
		t.Errorf("index got %d events, want 2000", sink.events)
	}
}

// The hub passes an engine's health to a sink that wants it
// (kvevents.HealthSink), and to no other.
func TestHubForwardsHealth(t *testing.T) {
	sink := &recordingSink{}
	h := New(sink, Limits{})
	defer h.Close()
	h.Health(engine("a", 0), kvevents.HealthUnconfirmed)
	if want := []string{"health a unconfirmed"}; !slices.Equal(sink.calls, want) {
		t.Errorf("calls %v, want %v", sink.calls, want)
	}
	plain := New(nopSink{}, Limits{}) // a plain Sink: nothing to tell, nothing fails
	plain.Health(engine("a", 0), kvevents.HealthDegraded)
	plain.Close()
}

type nopSink struct{}

func (nopSink) Apply(kvevents.EngineID, uint64, []kvevents.Event) {}
func (nopSink) Reset(kvevents.EngineID, kvevents.ResetReason)     {}

// BenchmarkHubApplyWatchers measures Apply (ingest's cost, on the
// ingest goroutine, with the fan-out competing for the cores) with no
// watchers and with 200 that never read. The watchers are renewed every
// renewEvery batches, before their queues overflow, so that all 200 stay
// open for the whole run.
func BenchmarkHubApplyWatchers(b *testing.B) {
	const renewEvery = 2048
	evs := []kvevents.Event{storedHashes(1, 2, 3, 4), storedHashes(5, 6, 7, 8)}
	for _, n := range []int{0, 200} {
		b.Run(fmt.Sprintf("watchers=%d", n), func(b *testing.B) {
			h := New(nopSink{}, Limits{MaxWatchers: n + 1, WatchQueueEvents: 2*renewEvery + 1, WatchQueueBytes: 1 << 30})
			defer h.Close()
			var ws []*Watcher
			renew := func() {
				for _, w := range ws {
					w.Close()
				}
				ws = ws[:0]
				for range n {
					w, err := h.Subscribe(nil)
					if err != nil {
						b.Fatal(err)
					}
					ws = append(ws, w)
				}
			}
			renew()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if i > 0 && i%renewEvery == 0 {
					b.StopTimer()
					flush(b, h)
					renew()
					b.StartTimer()
				}
				h.Apply(engine("a", 0), uint64(i), evs)
			}
			b.StopTimer()
			if h.ClosedBehind() != 0 {
				b.Fatalf("%d watchers closed: the benchmark measured fewer than %d", h.ClosedBehind(), n)
			}
		})
	}
}

// A zero bound takes its default; a bound given stays.
func TestLimitsDefaults(t *testing.T) {
	if got := (Limits{}).WithDefaults(); got != DefaultLimits {
		t.Errorf("zero Limits: %+v, want %+v", got, DefaultLimits)
	}
	got := Limits{MaxWatchers: 3, HubQueueBytes: -1}.WithDefaults()
	want := DefaultLimits
	want.MaxWatchers = 3
	if got != want {
		t.Errorf("%+v, want %+v", got, want)
	}
	h := New(&recordingSink{}, Limits{})
	defer h.Close()
	if h.MaxWatchers() != DefaultLimits.MaxWatchers {
		t.Errorf("MaxWatchers %d, want %d", h.MaxWatchers(), DefaultLimits.MaxWatchers)
	}
}
