package watchhub

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/kvevents"
)

// ErrClosed is returned by Subscribe after Close, and by Watcher.Next
// once the hub is closed.
var ErrClosed = errors.New("watchhub: hub closed")

// ErrTooManyWatchers is returned by Subscribe when Limits.MaxWatchers
// watchers are open.
var ErrTooManyWatchers = errors.New("watchhub: too many watchers")

// BehindError ends a watcher that fell too far behind: its queue
// overflowed (Limits.WatchQueueEvents or WatchQueueBytes), or the hub's
// fan-out queue did (Limits.HubQueueBatches or HubQueueBytes). The events
// it lost are gone; a client resynchronises by reconnecting.
type BehindError struct {
	// Events is how many events the watcher lost when it was closed.
	Events uint64
	// Hub is true when the fan-out queue overflowed (every watcher lost
	// the events), false when the watcher's own queue did.
	Hub bool
}

func (e *BehindError) Error() string {
	if e.Hub {
		return fmt.Sprintf("watch fell behind: kvindex's fan-out queue overflowed and dropped %d events; reconnect", e.Events)
	}
	return fmt.Sprintf("watch fell behind by %d events; reconnect", e.Events)
}

// Hub sits between the event subscriber and the index: it is the
// subscriber's kvevents.Sink, applies every batch to the index first and
// then hands it to the watchers (the Watch RPC).
//
// Ingest never waits for a watcher and does no per-watcher work: Apply
// copies the batch once, compactly, into a bounded queue (with no
// watchers it costs one atomic load beyond the index's own work), and one
// fan-out goroutine builds the messages and offers them to each watcher's
// bounded queue. A watcher whose queue overflows is closed with a
// BehindError rather than fed a stream with holes; a batch that does not
// fit in the fan-out queue closes every watcher the same way. So a Watch
// stream delivers every applied event of its pods in order, or ends.
// BenchmarkHubApplyWatchers compares Apply with and without watchers.
type Hub struct {
	sink   kvevents.Sink
	now    func() time.Time
	limits Limits

	mu       sync.RWMutex
	watchers map[*Watcher]struct{}
	closed   bool
	active   atomic.Int64 // len(watchers), read without the lock

	qmu     sync.Mutex
	queue   []*hubItem
	qbytes  int64
	qseq    uint64        // items enqueued so far
	qsignal chan struct{} // cap 1: the queue has items
	stop    chan struct{}
	start   sync.Once
	done    chan struct{} // closed when the fan-out goroutine returns

	seen     atomic.Bool
	seenOnce sync.Once
	seenCh   chan struct{}

	dropped      atomic.Uint64 // events lost by watchers, all causes
	sent         atomic.Uint64 // events queued to watchers
	hubDropped   atomic.Uint64 // batches dropped at the fan-out queue
	closedBehind atomic.Uint64 // watchers closed for falling behind
	refused      atomic.Uint64 // Subscribe calls refused by MaxWatchers
	open         atomic.Int64  // watchers not yet Closed, failed ones included
}

// hubItem is one batch (or reset) waiting for the fan-out, copied out of
// the subscriber's reused storage.
type hubItem struct {
	seq    uint64 // hub queue position, for lost markers
	engine kvevents.EngineID
	bseq   uint64
	ms     int64
	events []kvevents.Event // hashes in one slab, token ids not kept
	ntoks  []uint32         // len(TokenIDs) of each event
	reset  kvevents.ResetReason
	isRst  bool
	lost   uint64 // > 0: a marker; this many events were dropped before it
	bytes  int64
}

// New returns a Hub applying every batch to sink, with the watch bounds
// of l (zero fields take DefaultLimits').
func New(sink kvevents.Sink, l Limits) *Hub {
	return &Hub{
		sink: sink, now: time.Now, limits: l.WithDefaults(),
		watchers: make(map[*Watcher]struct{}), seenCh: make(chan struct{}),
		qsignal: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
}

// Apply implements kvevents.Sink: it applies the batch to the index, then
// queues one copy of it for the watchers. The caller may reuse events once
// Apply returns.
func (h *Hub) Apply(engine kvevents.EngineID, seq uint64, events []kvevents.Event) {
	h.ApplyVerdict(engine, seq, events)
}

// ApplyVerdict implements kvevents.VerdictSink: Apply, reporting the
// index's verdict on the batch (kvevents.ApplyVerdict).
func (h *Hub) ApplyVerdict(engine kvevents.EngineID, seq uint64, events []kvevents.Event) bool {
	accepted := kvevents.ApplyVerdict(h.sink, engine, seq, events)
	h.queueBatch(engine, seq, events)
	return accepted
}

// queueBatch queues one copy of an applied batch for the watchers.
func (h *Hub) queueBatch(engine kvevents.EngineID, seq uint64, events []kvevents.Event) {
	h.markSeen()
	if h.active.Load() == 0 || len(events) == 0 {
		return
	}
	it := &hubItem{engine: engine, bseq: seq, ms: h.now().UnixMilli()}
	n := 0
	for i := range events {
		n += len(events[i].Hashes)
	}
	slab := make([]uint64, 0, n)
	it.events = make([]kvevents.Event, len(events))
	it.ntoks = make([]uint32, len(events))
	it.bytes = int64(64 + 8*n)
	for i := range events {
		ev := &events[i]
		start := len(slab)
		slab = append(slab, ev.Hashes...)
		it.events[i] = kvevents.Event{
			Kind: ev.Kind, Hashes: slab[start:len(slab):len(slab)], Parent: ev.Parent, HasParent: ev.HasParent,
			Medium: ev.Medium, GroupIdx: ev.GroupIdx, LoRAName: ev.LoRAName, HasLoRAID: ev.HasLoRAID, LoRAID: ev.LoRAID,
		}
		it.ntoks[i] = uint32(min(len(ev.TokenIDs), int(^uint32(0))))
		it.bytes += int64(96 + len(ev.Medium) + len(ev.LoRAName))
	}
	h.enqueue(it, uint64(len(events)))
}

// Reset implements kvevents.Sink: it resets the engine in the index, then
// queues an EVENT_KIND_RESET for the watchers.
func (h *Hub) Reset(engine kvevents.EngineID, reason kvevents.ResetReason) {
	h.sink.Reset(engine, reason)
	if h.active.Load() == 0 {
		return
	}
	h.enqueue(&hubItem{engine: engine, ms: h.now().UnixMilli(), reset: reason, isRst: true, bytes: 128}, 1)
}

// Health implements kvevents.HealthSink: the engine's stream health goes
// to the sink if it wants it (an index shedding what it cannot vouch
// for); Watch streams do not carry it.
func (h *Hub) Health(engine kvevents.EngineID, hl kvevents.Health) {
	if hs, ok := h.sink.(kvevents.HealthSink); ok {
		hs.Health(engine, hl)
	}
}

// enqueue adds it to the fan-out queue, or, if the queue is full, drops it
// and leaves a marker saying how many events were lost (one marker for a
// run of drops: the queue holds at most one item beyond its bound).
func (h *Hub) enqueue(it *hubItem, events uint64) {
	h.qmu.Lock()
	if len(h.queue) >= h.limits.HubQueueBatches || h.qbytes+it.bytes > h.limits.HubQueueBytes {
		h.hubDropped.Add(1)
		if last := len(h.queue) - 1; last >= 0 && h.queue[last].lost > 0 {
			h.queue[last].lost += events
		} else {
			h.qseq++
			h.queue = append(h.queue, &hubItem{seq: h.qseq, lost: events})
		}
	} else {
		h.qseq++
		it.seq = h.qseq
		h.queue = append(h.queue, it)
		h.qbytes += it.bytes
	}
	h.qmu.Unlock()
	select {
	case h.qsignal <- struct{}{}:
	default:
	}
}

// fanOut runs until Close: it takes the queued batches and offers their
// messages to the watchers.
func (h *Hub) fanOut() {
	defer close(h.done)
	var batch []*hubItem
	for {
		select {
		case <-h.stop:
			return
		case <-h.qsignal:
		}
		h.qmu.Lock()
		batch, h.queue = h.queue, batch[:0]
		h.qmu.Unlock()
		for i, it := range batch {
			h.deliver(it)
			batch[i] = nil
			h.qmu.Lock()
			h.qbytes -= it.bytes // held until delivered
			h.qmu.Unlock()
		}
	}
}

// deliver offers one queued item to every watcher that wants it, and
// closes the watchers it overflows.
func (h *Hub) deliver(it *hubItem) {
	var behind, ended []*Watcher
	h.mu.RLock()
	switch {
	case it.lost > 0:
		for w := range h.watchers {
			if w.since < it.seq {
				w.fail(&BehindError{Events: it.lost + w.discard(), Hub: true})
				behind = append(behind, w)
			}
		}
	case it.isRst:
		msg := &kvindexv1.WatchResponse{
			Pod: it.engine.Pod, DpRank: uint32(it.engine.DPRank), Model: it.engine.Model,
			Kind: kvindexv1.EventKind_EVENT_KIND_RESET, ResetReason: string(it.reset), AppliedUnixMs: it.ms,
		}
		for w := range h.watchers {
			if !w.wants(it.engine.Pod) {
				continue
			}
			if w.loras != nil {
				w.forget(it.engine)
			}
			if !h.offer(w, msg, int64(watchOverhead+len(msg.Pod)+len(msg.Model))) {
				behind = append(behind, w)
			}
		}
	default:
		for i := range it.events {
			var msg *kvindexv1.WatchResponse
			var size int64
			for w := range h.watchers {
				if !w.wants(it.engine.Pod) {
					continue
				}
				if msg == nil {
					msg = eventMessage(it.engine, it.bseq, &it.events[i], it.ntoks[i], it.ms)
					size = watchSize(msg)
				}
				m, sz := msg, size
				if w.loras != nil {
					var err error
					if m, err = w.restrict(it.engine, &it.events[i], msg); err != nil {
						w.end(err)
						ended = append(ended, w)
						continue
					}
					if m == nil {
						continue
					}
					if m != msg {
						sz = watchSize(m)
					}
				}
				if !h.offer(w, m, sz) {
					behind = append(behind, w)
				}
			}
		}
	}
	h.mu.RUnlock()
	if len(behind) == 0 && len(ended) == 0 {
		return
	}
	h.mu.Lock()
	for _, w := range behind {
		if _, ok := h.watchers[w]; ok {
			delete(h.watchers, w)
			h.closedBehind.Add(1)
		}
	}
	for _, w := range ended {
		delete(h.watchers, w)
	}
	h.active.Store(int64(len(h.watchers)))
	h.mu.Unlock()
}

// watchOverhead is the accounted size of a message beyond its strings and
// hashes.
const watchOverhead = 160

// watchSize is the bytes a queued message is accounted for.
func watchSize(m *kvindexv1.WatchResponse) int64 {
	return int64(watchOverhead + len(m.Pod) + len(m.Model) + len(m.Medium) + len(m.LoraName) + 8*len(m.BlockHashes))
}

// offer queues msg for w, or, if w's queue is full, fails w; it reports
// whether w is still open. h.mu is read-locked.
func (h *Hub) offer(w *Watcher, msg *kvindexv1.WatchResponse, size int64) bool {
	w.mu.Lock()
	if w.err != nil {
		w.mu.Unlock()
		return false
	}
	if len(w.q)-w.head >= h.limits.WatchQueueEvents || w.bytes+size > h.limits.WatchQueueBytes {
		w.mu.Unlock()
		w.fail(&BehindError{Events: 1 + w.discard()})
		return false
	}
	w.q = append(w.q, queued{msg, size})
	w.bytes += size
	w.mu.Unlock()
	h.sent.Add(1)
	w.wake()
	return true
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

// Dropped is the number of events watchers lost, all watchers and causes
// together (each such watcher was closed).
func (h *Hub) Dropped() uint64 { return h.dropped.Load() }

// Delivered is the number of events queued to watchers.
func (h *Hub) Delivered() uint64 { return h.sent.Load() }

// DroppedBatches is the number of batches the fan-out queue could not
// take.
func (h *Hub) DroppedBatches() uint64 { return h.hubDropped.Load() }

// ClosedBehind is the number of watchers closed for falling behind.
func (h *Hub) ClosedBehind() uint64 { return h.closedBehind.Load() }

// Refused is the number of subscriptions refused by Limits.MaxWatchers.
func (h *Hub) Refused() uint64 { return h.refused.Load() }

// Queued is the number of batches waiting for the fan-out.
func (h *Hub) Queued() int {
	h.qmu.Lock()
	defer h.qmu.Unlock()
	return len(h.queue)
}

// Watchers is the number of watchers the fan-out serves.
func (h *Hub) Watchers() int { return int(h.active.Load()) }

// Open is the number of watchers not yet Closed: those the fan-out serves
// and those it ended whose owner has not let go yet (a Watch handler
// still blocked sending to a client that stopped reading). MaxWatchers
// bounds it, so that such streams cannot pile up either.
func (h *Hub) Open() int { return int(h.open.Load()) }

// MaxWatchers is the hub's cap on open watchers.
func (h *Hub) MaxWatchers() int { return h.limits.MaxWatchers }

// Subscribe opens a watcher for the events of the given pods (all pods if
// none). It fails with ErrTooManyWatchers when Limits.MaxWatchers are
// open, ErrClosed after Close.
func (h *Hub) Subscribe(pods []string) (*Watcher, error) {
	return h.SubscribeLoRAs(pods, nil)
}

// SubscribeLoRAs is Subscribe for a caller restricted to some LoRA
// adapters ("" is the base model; nil: any, as Subscribe). Its watcher
// gets:
//   - the BlockStored events of those adapters; an event of an adapter
//     kvindex cannot name (an engine sending lora_id without lora_name) is
//     withheld;
//   - of each BlockRemoved, only the hashes it was sent as stored, so that
//     it never learns a block of another adapter, even one being evicted;
//   - AllBlocksCleared and resets, which carry no block.
//
// To filter removals the watcher remembers the blocks it was sent, per
// engine, up to MaxRestrictedWatchBlocks; beyond that it is ended with a
// *WatchLimitError (the client reconnects and starts afresh). Blocks the
// index evicts for its memory budget send no event and stay remembered
// until then.
func (h *Hub) SubscribeLoRAs(pods, loras []string) (*Watcher, error) {
	w := &Watcher{hub: h, signal: make(chan struct{}, 1)}
	if loras != nil {
		w.loras = make(map[string]bool, len(loras))
		for _, l := range loras {
			w.loras[l] = true
		}
		w.shown = make(map[kvevents.EngineID]map[uint64]uint32)
	}
	if len(pods) > 0 {
		w.pods = make(map[string]struct{}, len(pods))
		for _, p := range pods {
			w.pods[p] = struct{}{}
		}
	}
	h.start.Do(func() { go h.fanOut() })
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	if h.open.Load() >= int64(h.limits.MaxWatchers) {
		h.refused.Add(1)
		return nil, ErrTooManyWatchers
	}
	h.qmu.Lock()
	w.since = h.qseq // a drop already queued is not this watcher's loss
	h.qmu.Unlock()
	h.watchers[w] = struct{}{}
	h.active.Store(int64(len(h.watchers)))
	h.open.Add(1)
	return w, nil
}

// Close ends every watcher (Next returns ErrClosed once their queues
// are read), refuses new ones and stops the fan-out; batches keep flowing
// to the index. Servers call it before a graceful stop so that open Watch
// streams end.
func (h *Hub) Close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	for w := range h.watchers {
		w.end(ErrClosed)
		delete(h.watchers, w)
	}
	h.active.Store(0)
	h.mu.Unlock()
	started := true
	h.start.Do(func() { started = false })
	close(h.stop)
	if started {
		<-h.done
	}
}

// Watcher is one subscription to a Hub.
type Watcher struct {
	hub   *Hub
	pods  map[string]struct{} // nil: every pod
	loras map[string]bool     // nil: every adapter (SubscribeLoRAs)
	// shown counts, per engine, the stored blocks sent to a watcher with
	// loras (references, as an engine may store a block twice); only the
	// fan-out goroutine touches it.
	shown  map[kvevents.EngineID]map[uint64]uint32
	nshown int
	since  uint64        // hub queue position at Subscribe
	signal chan struct{} // cap 1: the queue has items or err is set
	closed atomic.Bool   // Close was called

	mu    sync.Mutex
	q     []queued
	head  int
	bytes int64
	err   error // set: no more events; Next returns it once q is read
}

type queued struct {
	msg  *kvindexv1.WatchResponse
	size int64
}

func (w *Watcher) wants(pod string) bool {
	if w.pods == nil {
		return true
	}
	_, ok := w.pods[pod]
	return ok
}

func (w *Watcher) wake() {
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

// end makes Next return err once the queue is read (if no error is set
// yet).
func (w *Watcher) end(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
	w.wake()
}

// fail ends w at once with err: its queued events are dropped, so that
// their memory goes now and the client learns now.
func (w *Watcher) fail(err *BehindError) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
		w.hub.dropped.Add(err.Events)
	}
	w.mu.Unlock()
	w.wake()
}

// discard empties the queue and returns how many events it held.
func (w *Watcher) discard() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := uint64(len(w.q) - w.head)
	clear(w.q)
	w.q, w.head, w.bytes = nil, 0, 0
	return n
}

// Next returns the watcher's next event, waiting for one until ctx is
// done. After the watcher ends it returns ErrClosed (the hub closed:
// a clean end, once the queued events are read) or a *BehindError (at
// once). The messages are shared between watchers and must not be
// modified.
func (w *Watcher) Next(ctx context.Context) (*kvindexv1.WatchResponse, error) {
	for {
		w.mu.Lock()
		var be *BehindError
		if w.head < len(w.q) && !errors.As(w.err, &be) {
			e := w.q[w.head]
			w.q[w.head] = queued{}
			w.head++
			w.bytes -= e.size
			if w.head == len(w.q) {
				w.q, w.head = w.q[:0], 0
			} else if w.head > 1024 && w.head > len(w.q)/2 {
				w.q = w.q[:copy(w.q, w.q[w.head:])]
				w.head = 0
			}
			w.mu.Unlock()
			return e.msg, nil
		}
		err := w.err
		w.mu.Unlock()
		if err != nil {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-w.signal:
		}
	}
}

// Queued is the number of events waiting in the watcher's queue.
func (w *Watcher) Queued() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.q) - w.head
}

// Close ends the subscription. It is safe to call more than once and after
// the hub's Close.
func (w *Watcher) Close() {
	h := w.hub
	if w.closed.Swap(true) {
		return
	}
	h.open.Add(-1)
	h.mu.Lock()
	if _, ok := h.watchers[w]; ok {
		delete(h.watchers, w)
		h.active.Store(int64(len(h.watchers)))
	}
	h.mu.Unlock()
	w.end(ErrClosed)
	w.discard()
}

// MaxRestrictedWatchBlocks bounds the blocks a watcher restricted to LoRA
// adapters remembers (SubscribeLoRAs): about 40 bytes each.
const MaxRestrictedWatchBlocks = 1 << 20

// WatchLimitError ends a restricted watcher that would remember more than
// MaxRestrictedWatchBlocks blocks.
type WatchLimitError struct{}

func (*WatchLimitError) Error() string {
	return fmt.Sprintf("a Watch restricted to LoRA adapters follows at most %d blocks; reconnect", MaxRestrictedWatchBlocks)
}

// loraAllowed reports whether a BlockStored event's adapter is one the
// watcher may see.
func (w *Watcher) loraAllowed(ev *kvevents.Event) bool {
	if ev.LoRAName == "" && ev.HasLoRAID && ev.LoRAID != 0 {
		return false // an adapter without a name: cannot be attributed
	}
	return w.loras[ev.LoRAName]
}

// restrict returns what a watcher with loras may see of one event: msg
// itself, a copy with fewer hashes, or nil for nothing.
func (w *Watcher) restrict(e kvevents.EngineID, ev *kvevents.Event, msg *kvindexv1.WatchResponse) (*kvindexv1.WatchResponse, error) {
	switch ev.Kind {
	case kvevents.BlockStored:
		if !w.loraAllowed(ev) {
			return nil, nil
		}
		if w.nshown+len(ev.Hashes) > MaxRestrictedWatchBlocks {
			return nil, &WatchLimitError{}
		}
		m := w.shown[e]
		if m == nil {
			m = make(map[uint64]uint32)
			w.shown[e] = m
		}
		for _, k := range ev.Hashes {
			if m[k] == 0 {
				w.nshown++
			}
			m[k]++
		}
		return msg, nil
	case kvevents.BlockRemoved:
		m := w.shown[e]
		var keep []uint64
		for _, k := range ev.Hashes {
			n, ok := m[k]
			if !ok {
				continue
			}
			if n <= 1 {
				delete(m, k)
				w.nshown--
			} else {
				m[k] = n - 1
			}
			keep = append(keep, k)
		}
		switch len(keep) {
		case 0:
			return nil, nil
		case len(ev.Hashes):
			return msg, nil
		}
		c := proto.Clone(msg).(*kvindexv1.WatchResponse)
		c.BlockHashes = keep
		return c, nil
	case kvevents.AllBlocksCleared:
		w.forget(e)
	}
	return msg, nil
}

// forget drops what a restricted watcher remembers of an engine.
func (w *Watcher) forget(e kvevents.EngineID) {
	w.nshown -= len(w.shown[e])
	delete(w.shown, e)
}

// eventMessage converts one applied event; ntoks is its number of token
// ids.
func eventMessage(engine kvevents.EngineID, seq uint64, ev *kvevents.Event, ntoks uint32, ms int64) *kvindexv1.WatchResponse {
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
		m.NumTokens = ntoks
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
		m.BlockHashes = ev.Hashes // the hub's own copy, read-only from here
	}
	return m
}

var _ kvevents.VerdictSink = (*Hub)(nil)
