package zmqtransport

import (
	"log/slog"
	"time"
)

// Engine slots in bind mode.
//
// A listen socket creates a stream for every (topic, dp_rank) it hears,
// and topics are whatever peers write, so streams are bounded three ways:
//
//   - A stream must prove itself: within proveWithin of its first
//     message, it must have delivered a batch its Sink accepted (it had
//     events, and an index refused none of them: kvevents.ApplyVerdict).
//     One that has not is dropped, with its entries, as a departed engine
//     is (ListenerStats.UnprovenEngines). A real engine publishes because
//     its cache changed, and its first batch is accepted; junk (batches
//     of events the index refuses, batches without events, batches the
//     sequencer never delivers) is not, and gives its slot back within
//     seconds. A stream resumed from a checkpoint proved itself in the
//     process that took it. Named engines (below) prove themselves too:
//     they take no slot, but junk under a named pod's ranks is dropped
//     all the same.
//   - Slots: the streams of engines admitted through a glob rule, or of
//     any engine when there are no rules, are capped by MaxEngines. An
//     engine named by its pod (an exact rule, which discovery writes for
//     every pod it admits) or by the IP address it speaks from is never
//     refused for lack of slots: its identity is tied to its name or
//     address, so their number is bounded by the rules and the sources,
//     not by what topics say. Since the topic also names the model, a
//     named pod's streams go beyond the cap under one model only (the
//     model of the first of them); others take slots.
//   - Displacement: at the cap, a newcomer takes the slot of the capped
//     stream heard least recently, if that one has been silent for more
//     than displaceAfter (ListenerStats.DisplacedEngines). Its entries
//     are dropped, so nothing of it is reported ok, and if it publishes
//     again it returns as a new engine (verified by a bootstrap replay,
//     or unconfirmed). This is sound because the streams it applies to
//     were admitted by a glob, under which any engine of the network may
//     already speak for every matching pod, clear its entries included:
//     displacement gives a peer no power over them it did not have. It
//     keeps a flood of topics that once published and then fell silent
//     from locking engines out until --forget-after after the flood's
//     connection closes; the price is that an idle engine loses its
//     entries while the listener is full, which the log says, with the
//     cure (a larger --max-engines, or naming the engines).

// proveWithin is how long a bind-mode stream has, from its first
// message, to deliver a batch its Sink accepts; displaceAfter is how long
// a capped stream must have been silent before a newcomer may take its
// slot at the cap. Subscriber.proveWithin and displaceAfter hold them
// (tests shorten them).
const (
	proveWithin   = 5 * time.Second
	displaceAfter = 10 * time.Second
)

// namedPod counts the streams a named pod holds beyond the cap, all of
// one model.
type namedPod struct {
	model string
	n     int
}

// admit decides whether a new stream may be created for rt's engine:
// capped reports whether it takes a slot. At the cap, unproven streams
// past their time are dropped first, then the capped stream silent the
// longest may be displaced. Loop goroutine.
func (ln *listener) admit(rt *route, named bool, now int64) (capped, ok bool) {
	if ln.namedFits(rt, named) {
		return false, true
	}
	if ln.nopen < ln.s.cfg.MaxEngines {
		return true, true
	}
	ln.dropUnproven(now)
	if ln.nopen < ln.s.cfg.MaxEngines || ln.displace(now) {
		return true, true
	}
	return true, false
}

// namedFits reports whether a stream of rt's engine goes beyond the cap:
// its source names its pod, and the pod's streams beyond the cap, if any,
// are of the same model.
func (ln *listener) namedFits(rt *route, named bool) bool {
	if !named {
		return false
	}
	np := ln.namedPods[rt.pod]
	return np == nil || np.model == rt.model
}

// hold counts a new or adopted stream: in a slot (capped) or under its
// named pod. Every stream held is released once (release).
func (ln *listener) hold(st *stream, capped bool) {
	st.capped = capped
	if capped {
		ln.nopen++
		return
	}
	np := ln.namedPods[st.id.Pod]
	if np == nil {
		np = &namedPod{model: st.id.Model}
		ln.namedPods[st.id.Pod] = np
	}
	np.n++
}

// release undoes hold for a stream being removed or re-held.
func (ln *listener) release(st *stream) {
	if st.capped {
		ln.nopen--
		ln.unlink(st)
		return
	}
	if np := ln.namedPods[st.id.Pod]; np != nil {
		if np.n--; np.n <= 0 {
			delete(ln.namedPods, st.id.Pod)
		}
	}
}

// expectProof starts a new stream's proving window (see proveWithin).
func (ln *listener) expectProof(st *stream, now int64) {
	st.proveBy = now + int64(ln.s.proveWithin)
	ln.unproven = append(ln.unproven, st)
}

// dropUnproven drops the streams whose proving window has passed without
// an accepted batch. The queue is in creation order, hence in deadline
// order: it stops at the first stream still within its window. Loop
// goroutine.
func (ln *listener) dropUnproven(now int64) {
	q := ln.unproven
	i := 0
	for ; i < len(q); i++ {
		st := q[i]
		if !st.closed && st.proveBy != 0 {
			if now < st.proveBy {
				break
			}
			ln.drop(st)
			// Counted once dropped: whoever reads the count (a test, a
			// dashboard) then finds the entries gone too.
			c := ln.ctr.unproven.Add(1)
			if logEvery(c) {
				st.logAttrs(slog.LevelWarn, "zmqtransport: engine dropped: nothing it sent was accepted by the index in its first seconds (junk, or a topic nothing real publishes under); its slot is free",
					slog.Duration("within", ln.s.proveWithin), slog.Uint64("count", c))
			}
		}
		q[i] = nil
	}
	ln.unproven = q[i:]
}

// displace drops the capped stream heard least recently if it has been
// silent for displaceAfter, freeing its slot; false if there is none.
func (ln *listener) displace(now int64) bool {
	st := ln.oldest
	if st == nil || now-st.lastMsg < int64(ln.s.displaceAfter) {
		return false
	}
	silent := time.Duration(now - st.lastMsg)
	ln.drop(st)
	c := ln.ctr.displaced.Add(1) // once dropped, as in dropUnproven
	if logEvery(c) {
		st.logAttrs(slog.LevelWarn, "zmqtransport: engine displaced: the listener has its maximum of streams, and this engine, admitted by a glob rule, had been silent longest; its entries are dropped (raise --max-engines, or name the engines in --engine-allow)",
			slog.Duration("silent", silent.Round(time.Millisecond)), slog.Int("max_engines", ln.s.cfg.MaxEngines), slog.Uint64("count", c))
	}
	return true
}

// drop removes a stream for good: its entries reset, its slot released,
// its route forgotten once no rank is left. Loop goroutine.
func (ln *listener) drop(st *stream) {
	st.remove()
	ln.release(st)
	rt := st.rt
	if rt == nil {
		return
	}
	rank := st.id.DPRank
	if rank < len(rt.ranks) && rt.ranks[rank] == st {
		rt.ranks[rank] = nil
	}
	for _, other := range rt.ranks {
		if other != nil {
			return
		}
	}
	if ln.routes[rt.topic] == rt {
		delete(ln.routes, rt.topic)
	}
}

// touch notes a message of a capped stream: it becomes the most recently
// heard.
func (ln *listener) touch(st *stream, now int64) {
	st.lastMsg = now
	if ln.newest == st {
		return
	}
	ln.unlink(st)
	st.older, st.newer = ln.newest, nil
	if ln.newest != nil {
		ln.newest.newer = st
	} else {
		ln.oldest = st
	}
	ln.newest = st
	st.linked = true
}

// unlink takes a stream out of the list of capped streams, if in it.
func (ln *listener) unlink(st *stream) {
	if !st.linked {
		return
	}
	if st.older != nil {
		st.older.newer = st.newer
	} else {
		ln.oldest = st.newer
	}
	if st.newer != nil {
		st.newer.older = st.older
	} else {
		ln.newest = st.older
	}
	st.older, st.newer, st.linked = nil, nil, false
}
