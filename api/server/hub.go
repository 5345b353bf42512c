package server

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/kvevents"
)

// DefaultWatchBuffer is the number of events a watcher may fall behind
// before events are dropped for it.
const DefaultWatchBuffer = 4096

// ErrHubClosed is returned by Subscribe after Close.
var ErrHubClosed = errors.New("server: watch hub closed")

// Hub sits between the event subscriber and the index: it is the
// subscriber's kvevents.Sink, applies every batch to the index first and
// then offers it to the watchers (the Watch RPC).
//
// Ingest never waits for a watcher: each watcher has a bounded buffer, and
// an event that does not fit is dropped for that watcher and counted. With
// no watchers, Apply costs one atomic load beyond the index's own work.
type Hub struct {
	sink kvevents.Sink
	now  func() time.Time

	mu       sync.RWMutex
	watchers map[*Watcher]struct{}
	closed   bool
	active   atomic.Int32 // len(watchers), read without the lock

	seen     atomic.Bool
	seenOnce sync.Once
	seenCh   chan struct{}

	dropped atomic.Uint64
	sent    atomic.Uint64
}

// NewHub returns a Hub applying every batch to sink.
func NewHub(sink kvevents.Sink) *Hub {
	return &Hub{sink: sink, now: time.Now, watchers: make(map[*Watcher]struct{}), seenCh: make(chan struct{})}
}

// Apply implements kvevents.Sink: it applies the batch to the index, then
// publishes it to the watchers. The events are copied for the watchers, so
// the caller may reuse them once Apply returns.
func (h *Hub) Apply(engine kvevents.EngineID, seq uint64, events []kvevents.Event) {
	h.sink.Apply(engine, seq, events)
	h.markSeen()
	if h.active.Load() == 0 {
		return
	}
	ms := h.now().UnixMilli()
	h.mu.RLock()
	defer h.mu.RUnlock()
	for i := range events {
		var msg *kvindexv1.WatchResponse
		for w := range h.watchers {
			if !w.wants(engine.Pod) {
				continue
			}
			if msg == nil {
				msg = eventMessage(engine, seq, &events[i], ms)
			}
			h.offer(w, msg)
		}
	}
}

// Reset implements kvevents.Sink: it resets the engine in the index, then
// publishes an EVENT_KIND_RESET.
func (h *Hub) Reset(engine kvevents.EngineID, reason kvevents.ResetReason) {
	h.sink.Reset(engine, reason)
	if h.active.Load() == 0 {
		return
	}
	h.mu.RLock()
	defer h.mu.RUnlock()
	var msg *kvindexv1.WatchResponse
	for w := range h.watchers {
		if !w.wants(engine.Pod) {
			continue
		}
		if msg == nil {
			msg = &kvindexv1.WatchResponse{
				Pod: engine.Pod, DpRank: uint32(engine.DPRank), Model: engine.Model,
				Kind: kvindexv1.EventKind_EVENT_KIND_RESET, ResetReason: string(reason),
				AppliedUnixMs: h.now().UnixMilli(),
			}
		}
		h.offer(w, msg)
	}
}

// offer queues msg for w without blocking; h.mu is read-locked. A message
// following drops is copied so that it can carry the watcher's own drop
// count.
func (h *Hub) offer(w *Watcher, msg *kvindexv1.WatchResponse) {
	// Swap takes ownership of the pending count, so that concurrent
	// offers (batches of different engines) never report a drop twice.
	if n := w.pending.Swap(0); n > 0 {
		msg = cloneWatch(msg)
		msg.Dropped = n
	}
	select {
	case w.ch <- msg:
		h.sent.Add(1)
	default:
		w.pending.Add(msg.Dropped + 1)
		w.dropped.Add(1)
		h.dropped.Add(1)
	}
}

func (h *Hub) markSeen() {
	if h.seen.Load() {
		return
	}
	h.seenOnce.Do(func() {
		h.seen.Store(true)
		close(h.seenCh)
	})
}

// SawEvent reports whether any batch has been applied.
func (h *Hub) SawEvent() bool { return h.seen.Load() }

// FirstEvent is closed when the first batch has been applied.
func (h *Hub) FirstEvent() <-chan struct{} { return h.seenCh }

// Dropped is the number of events dropped for slow watchers, all watchers
// together.
func (h *Hub) Dropped() uint64 { return h.dropped.Load() }

// Delivered is the number of events queued to watchers.
func (h *Hub) Delivered() uint64 { return h.sent.Load() }

// Watchers is the number of open watchers.
func (h *Hub) Watchers() int { return int(h.active.Load()) }

// Subscribe opens a watcher for the events of the given pods (all pods if
// none), buffering up to buffer events (DefaultWatchBuffer if <= 0).
func (h *Hub) Subscribe(pods []string, buffer int) (*Watcher, error) {
	if buffer <= 0 {
		buffer = DefaultWatchBuffer
	}
	w := &Watcher{hub: h, ch: make(chan *kvindexv1.WatchResponse, buffer)}
	if len(pods) > 0 {
		w.pods = make(map[string]struct{}, len(pods))
		for _, p := range pods {
			w.pods[p] = struct{}{}
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrHubClosed
	}
	h.watchers[w] = struct{}{}
	h.active.Store(int32(len(h.watchers)))
	return w, nil
}

// Close ends every watcher (their channels close) and refuses new ones;
// batches keep flowing to the index. Servers call it before a graceful
// stop so that open Watch streams end.
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	h.closed = true
	for w := range h.watchers {
		close(w.ch)
		delete(h.watchers, w)
	}
	h.active.Store(0)
}

// Watcher is one subscription to a Hub.
type Watcher struct {
	hub     *Hub
	pods    map[string]struct{} // nil: every pod
	ch      chan *kvindexv1.WatchResponse
	dropped atomic.Uint64 // total
	pending atomic.Uint64 // dropped since the last queued message
}

func (w *Watcher) wants(pod string) bool {
	if w.pods == nil {
		return true
	}
	_, ok := w.pods[pod]
	return ok
}

// Events delivers the watcher's events; it is closed when the watcher or
// its hub is closed. The messages are shared between watchers and must
// not be modified.
func (w *Watcher) Events() <-chan *kvindexv1.WatchResponse { return w.ch }

// Dropped is the number of events dropped for this watcher.
func (w *Watcher) Dropped() uint64 { return w.dropped.Load() }

// Close ends the subscription. It is safe to call more than once and after
// the hub's Close.
func (w *Watcher) Close() {
	h := w.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.watchers[w]; !ok {
		return
	}
	delete(h.watchers, w)
	close(w.ch)
	h.active.Store(int32(len(h.watchers)))
}

// eventMessage converts one applied event. The hashes are copied: the
// subscriber reuses its event storage once Apply returns.
func eventMessage(engine kvevents.EngineID, seq uint64, ev *kvevents.Event, ms int64) *kvindexv1.WatchResponse {
	m := &kvindexv1.WatchResponse{
		Pod:           engine.Pod,
		DpRank:        uint32(engine.DPRank),
		Model:         engine.Model,
		Seq:           seq,
		Medium:        ev.Medium,
		GroupIdx:      uint32(ev.GroupIdx),
		AppliedUnixMs: ms,
	}
	switch ev.Kind {
	case kvevents.BlockStored:
		m.Kind = kvindexv1.EventKind_EVENT_KIND_BLOCK_STORED
		m.ParentHash, m.HasParent = ev.Parent, ev.HasParent
		m.NumTokens = uint32(len(ev.TokenIDs))
		m.LoraName = ev.LoRAName
	case kvevents.BlockRemoved:
		m.Kind = kvindexv1.EventKind_EVENT_KIND_BLOCK_REMOVED
	case kvevents.AllBlocksCleared:
		m.Kind = kvindexv1.EventKind_EVENT_KIND_ALL_BLOCKS_CLEARED
	}
	if m.Medium == "" && m.Kind != kvindexv1.EventKind_EVENT_KIND_ALL_BLOCKS_CLEARED {
		m.Medium = kvevents.MediumGPU
	}
	if len(ev.Hashes) > 0 {
		m.BlockHashes = append([]uint64(nil), ev.Hashes...)
	}
	return m
}

// cloneWatch copies m field by field (messages must not be copied by
// value); the hash slice is shared, as messages are read-only once built.
func cloneWatch(m *kvindexv1.WatchResponse) *kvindexv1.WatchResponse {
	return &kvindexv1.WatchResponse{
		Pod: m.Pod, DpRank: m.DpRank, Model: m.Model, Seq: m.Seq, Kind: m.Kind,
		BlockHashes: m.BlockHashes, ParentHash: m.ParentHash, HasParent: m.HasParent,
		NumTokens: m.NumTokens, Medium: m.Medium, GroupIdx: m.GroupIdx,
		LoraName: m.LoraName, ResetReason: m.ResetReason, AppliedUnixMs: m.AppliedUnixMs,
		Dropped: m.Dropped,
	}
}

var _ kvevents.Sink = (*Hub)(nil)
