package server

import (
	"errors"
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

// The hub applies a batch to its sink before any watcher sees it.
func TestHubAppliesBeforePublishing(t *testing.T) {
	sink := &recordingSink{}
	h := NewHub(sink)
	w, err := h.Subscribe(nil, 8)
	if err != nil {
		t.Fatal(err)
	}
	var queuedAtApply []int
	sink.onCall = func() { queuedAtApply = append(queuedAtApply, len(w.Events())) }
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
		m := <-w.Events()
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
	h := NewHub(&recordingSink{})
	w, _ := h.Subscribe(nil, 8)
	ev := storedHashes(1, 2, 3)
	h.Apply(engine("a", 0), 0, []kvevents.Event{ev})
	ev.Hashes[0] = 99
	if m := <-w.Events(); !slices.Equal(m.GetBlockHashes(), []uint64{1, 2, 3}) {
		t.Errorf("hashes %v, want [1 2 3]", m.GetBlockHashes())
	}
}

func TestHubFilter(t *testing.T) {
	h := NewHub(&recordingSink{})
	onlyB, _ := h.Subscribe([]string{"b"}, 8)
	all, _ := h.Subscribe(nil, 8)
	for i, pod := range []string{"a", "b", "c", "b"} {
		h.Apply(engine(pod, 0), uint64(i), []kvevents.Event{storedHashes(uint64(i))})
	}
	if n := len(onlyB.Events()); n != 2 {
		t.Errorf("filtered watcher got %d events, want 2", n)
	}
	if n := len(all.Events()); n != 4 {
		t.Errorf("unfiltered watcher got %d events, want 4", n)
	}
	for range 2 {
		if m := <-onlyB.Events(); m.GetPod() != "b" {
			t.Errorf("filtered watcher got pod %q", m.GetPod())
		}
	}
}

// A slow watcher loses events, counted, and never blocks ingest; the
// next event it gets reports how many it lost.
func TestHubSlowWatcher(t *testing.T) {
	sink := &recordingSink{}
	h := NewHub(sink)
	slow, _ := h.Subscribe(nil, 2)
	fast, _ := h.Subscribe(nil, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 5 {
			h.Apply(engine("a", 0), uint64(i), []kvevents.Event{storedHashes(uint64(i))})
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Apply blocked on a full watcher")
	}
	if sink.events != 5 {
		t.Errorf("index got %d events, want 5", sink.events)
	}
	if slow.Dropped() != 3 || h.Dropped() != 3 || fast.Dropped() != 0 {
		t.Errorf("dropped: slow %d, hub %d, fast %d; want 3, 3, 0", slow.Dropped(), h.Dropped(), fast.Dropped())
	}
	var seqs []uint64
	for range 2 {
		m := <-slow.Events()
		seqs = append(seqs, m.GetSeq())
		if m.GetDropped() != 0 {
			t.Errorf("event before the drops reports %d dropped", m.GetDropped())
		}
	}
	h.Apply(engine("a", 0), 5, []kvevents.Event{storedHashes(5)})
	m := <-slow.Events()
	if m.GetSeq() != 5 || m.GetDropped() != 3 {
		t.Errorf("after the drops: seq %d dropped %d, want seq 5 dropped 3", m.GetSeq(), m.GetDropped())
	}
	if !slices.Equal(seqs, []uint64{0, 1}) {
		t.Errorf("slow watcher kept seqs %v, want [0 1]", seqs)
	}
	// The message shared with the fast watcher is unchanged.
	for range 6 {
		if m := <-fast.Events(); m.GetDropped() != 0 {
			t.Errorf("fast watcher's seq %d reports %d dropped", m.GetSeq(), m.GetDropped())
		}
	}
}

func TestHubClose(t *testing.T) {
	h := NewHub(&recordingSink{})
	w1, _ := h.Subscribe(nil, 1)
	w2, _ := h.Subscribe(nil, 1)
	w2.Close()
	w2.Close() // idempotent
	if h.Watchers() != 1 {
		t.Errorf("%d watchers, want 1", h.Watchers())
	}
	h.Close()
	if _, ok := <-w1.Events(); ok {
		t.Error("watcher channel open after the hub closed")
	}
	w1.Close() // after the hub's Close: no double close
	if _, err := h.Subscribe(nil, 1); !errors.Is(err, ErrHubClosed) {
		t.Errorf("Subscribe after Close: %v", err)
	}
	// Ingest goes on.
	h.Apply(engine("a", 0), 0, []kvevents.Event{storedHashes(1)})
}

// Concurrent ingest of several engines while watchers come and go (run
// with -race).
func TestHubConcurrent(t *testing.T) {
	sink := &recordingSink{}
	h := NewHub(sink)
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
			for {
				select {
				case <-stop:
					return
				default:
				}
				w, err := h.Subscribe(nil, 16)
				if err != nil {
					return
				}
				for range 10 {
					if _, ok := <-w.Events(); !ok {
						return
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
