package zmqtransport

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/kvevents"
)

// maxRoutes bounds the topics a listener remembers, so a peer inventing
// topics cannot grow memory without bound.
const maxRoutes = 1 << 16

// listener is a bind-mode SUB socket shared by many engines, bound to one
// port per data-parallel rank (SubscriberConfig.ListenRanks). It decodes
// each batch first (the dp_rank inside it picks the stream), then hands it
// to that stream's sequencer. It lives on its own ioLoop.
type listener struct {
	s      *Subscriber
	loop   *ioLoop
	sub    *zmq.Socket
	mon    *zmq.Socket
	bound  []string // the bound endpoint of each rank's port
	ctr    listenerCounters
	dec    kvevents.Decoder
	batch  kvevents.Batch
	rx     *receiver
	routes map[string]*route
	closed bool

	// Slots (slots.go): nopen counts the streams that hold one (at most
	// SubscriberConfig.MaxEngines, bar resumed ones); namedPods, the
	// named pods' streams beyond them. unproven are the streams yet to
	// prove themselves, oldest first; oldest and newest end the list of
	// capped streams, least recently heard first.
	nopen          int
	namedPods      map[string]*namedPod
	unproven       []*stream
	oldest, newest *stream

	// allow is SubscriberConfig.EngineAllow (nil: every source may speak
	// for every pod); zap answers libzmq's ZAP requests with it. follow
	// is set when the replay template dials {addr}.
	allow  *allowList
	zap    *zmq.Socket
	follow bool

	// pending are the streams of resumed positions (SubscriberConfig.
	// Resume) whose engine has not sent anything yet; the first batch of
	// their identity adopts them.
	pending map[kvevents.EngineID]*stream
	// conns names each connection by the fd the monitor reported it
	// accepted on, with a number never reused: a batch whose fd maps to
	// another number than the stream's last one came on a new connection
	// (an fd is reused as soon as it is closed, so the fd alone cannot
	// tell). libzmq reports an accept before any batch of the connection
	// can be read: the monitor is read once per wake-up, and again when a
	// batch comes on an fd it has not named. What remains is a
	// connection closed and replaced on the same fd within one burst
	// (milliseconds), which only a network blip does, never an engine
	// restart; verifying would find the same process anyway.
	conns    map[int]uint64
	nextConn uint64
	// With ZAP (zapOn), connSrc is each connection's source address,
	// sources counts the connections per address, and capped those that
	// count against the cap (listen_conns.go).
	connSrc map[int]netip.Addr
	sources map[netip.Addr]*sourceConns
	capped  int
}

// route is what a topic resolved to: an engine and its ranks' streams.
type route struct {
	topic      string
	pod, model string
	// srcOK and srcBad are the last source addresses allowed and refused
	// for this pod (allow rules), so the rules are not evaluated per
	// message (SetEngineAllow clears them); srcNamed says whether srcOK
	// names the pod (allowList.named).
	srcOK, srcBad string
	srcNamed      bool
	ok            bool // false: the topic matched no pattern
	conflict      bool // a configured engine owns this identity
	ranks         []*stream
	refused       map[int]bool // ranks refused at the MaxEngines cap, counted once
}

func (s *Subscriber) startListener() error {
	l, err := newIOLoop(s, "listen")
	if err != nil {
		return err
	}
	ln := &listener{
		s:         s,
		loop:      l,
		dec:       kvevents.Decoder{Flavor: s.cfg.Flavor, Limits: s.cfg.Limits},
		rx:        newReceiver(),
		routes:    map[string]*route{},
		namedPods: map[string]*namedPod{},
		pending:   map[kvevents.EngineID]*stream{},
		conns:     map[int]uint64{},
		connSrc:   map[int]netip.Addr{},
		sources:   map[netip.Addr]*sourceConns{},
		allow:     s.allow,
		follow:    strings.Contains(s.cfg.ReplayTemplate, "{addr}"),
	}
	if ln.allow != nil || ln.follow {
		ln.rx.wantPeer()
	}
	err = l.call(func() error {
		if ln.zapOn() {
			// Before the listen socket exists: libzmq lets a NULL
			// handshake through when no ZAP handler is bound.
			if err := ln.openZAP(); err != nil {
				return err
			}
		}
		if err := ln.open(s.cfg.Listen, s.cfg.Topic, s.cfg.ListenRanks); err != nil {
			return err
		}
		ln.resumePending()
		return nil
	})
	if err != nil {
		if ln.zap != nil {
			_ = l.call(func() error { ln.closeZAP(); return nil })
		}
		l.stop()
		return err
	}
	s.listener = ln
	s.listenerView.Store(ln)
	s.log.Info("zmqtransport: listening", "endpoint", ln.bound[0], "ranks", len(ln.bound),
		"endpoints", strings.Join(ln.bound, " "),
		"topic_pattern", s.topic.src, "replay_template", s.cfg.ReplayTemplate, "engine_allow_rules", len(s.cfg.EngineAllow))
	if ln.allow == nil && !s.cfg.EngineAllowDynamic {
		s.log.Warn("zmqtransport: no engine allow rules: whoever reaches the listen socket can write any pod's entries")
	}
	for _, r := range s.cfg.EngineAllow {
		if w := r.Warning(); w != "" {
			s.log.Warn("zmqtransport: "+w, "rule", r.String())
		}
	}
	return nil
}

// zapOn reports whether connections are checked at the handshake: with
// static rules. Rules that change (EngineAllowDynamic) are checked per
// message only, because libzmq does not retry a peer refused at the
// handshake, and an engine may well connect before its pod is admitted
// (when kvindex restarts, every engine reconnects before discovery has
// listed the pods).
func (ln *listener) zapOn() bool { return ln.allow != nil && !ln.s.cfg.EngineAllowDynamic }

// open binds the SUB socket to endpoint's port + r for each rank r, as
// vLLM's rank r connects there: one socket may be bound to many
// endpoints, and the batches' dp_rank tells the ranks apart.
func (ln *listener) open(endpoint, topic string, ranks int) error {
	var bound []string
	sub, mon, err := ln.s.openSUB(topic, zmq.EVENT_ACCEPTED|zmq.EVENT_DISCONNECTED, func(sub *zmq.Socket) error {
		if ln.zapOn() {
			// libzmq asks the ZAP handler about a NULL-mechanism peer
			// only when the socket has a ZAP domain.
			if err := sub.SetZapDomain(zapDomain); err != nil {
				return fmt.Errorf("zmqtransport: ZAP domain: %w", err)
			}
		}
		for r := range ranks {
			ep, err := offsetEndpoint(endpoint, r)
			if err != nil {
				return err
			}
			if err := sub.Bind(ep); err != nil {
				if ranks > 1 {
					return configerr.Failed("Listen", "bind %s (rank %d's port): %w", ep, r, err)
				}
				return configerr.Failed("Listen", "bind %s: %w", ep, err)
			}
			got, err := sub.GetLastEndpoint()
			if err != nil {
				got = ep
			}
			bound = append(bound, got)
		}
		return nil
	})
	if err != nil {
		return err
	}
	ln.bound = bound
	ln.ctr.endpoint.Store(&bound[0])
	ln.sub, ln.mon = sub, mon
	ln.loop.add(sub, ln.onMessage)
	ln.loop.add(mon, ln.onMonitor)
	ln.loop.members[ln] = struct{}{}
	return nil
}

// close releases the listener's sockets and its streams'. Loop goroutine.
func (ln *listener) close() {
	if ln.closed {
		return
	}
	ln.closed = true
	ln.loop.remove(ln.sub)
	ln.loop.remove(ln.mon)
	closeMonitored(ln.sub, ln.mon)
	ln.closeZAP()
	ln.rx.free()
	for _, rt := range ln.routes {
		for _, st := range rt.ranks {
			if st != nil {
				st.close()
			}
		}
	}
	for _, st := range ln.pending {
		st.close()
	}
	delete(ln.loop.members, ln)
}

// removePod forgets the streams of a pod, resetting each. Loop goroutine.
func (ln *listener) removePod(pod string) int {
	n := 0
	for topic, rt := range ln.routes {
		if rt.pod != pod {
			continue
		}
		for _, st := range rt.ranks {
			if st != nil {
				st.remove()
				ln.release(st)
				n++
			}
		}
		delete(ln.routes, topic)
	}
	for id, st := range ln.pending {
		if id.Pod == pod {
			st.remove()
			ln.release(st)
			delete(ln.pending, id)
			n++
		}
	}
	return n
}

// resumePending creates the streams of the resumed positions that belong
// to no configured engine, so they are listed (restored, not connected)
// before their engine sends anything. Loop goroutine.
func (ln *listener) resumePending() {
	configured := map[string]bool{}
	for _, ec := range ln.s.cfg.Engines {
		configured[ec.Name] = true
	}
	for _, id := range ln.s.resumeIDs() {
		if configured[id.Pod] || id.DPRank < 0 || id.DPRank >= kvevents.MaxDPRank {
			continue
		}
		if st := ln.newEngineStream(id, ""); st != nil {
			// In a slot until its engine shows who it is (stream).
			ln.hold(st, true)
			st.ctr.pending.Store(true)
			st.goneAt = ln.s.mono()
			ln.pending[id] = st
		}
	}
}

func (ln *listener) onMessage() {
	if readable(ln.mon) {
		ln.onMonitor() // connections before their batches (see conns)
	}
	now := ln.s.mono()
	for range recvBudget {
		frames, n, err := ln.rx.recv(ln.sub)
		if err != nil {
			if !isEAGAIN(err) {
				ln.s.log.Error("zmqtransport: receive failed", "endpoint", ln.s.cfg.Listen, "err", err)
			}
			return
		}
		ln.ctr.messages.Add(1)
		if n != 3 || len(frames[1]) != 8 {
			c := ln.ctr.malformed.Add(1)
			if logEvery(c) {
				ln.s.log.Warn("zmqtransport: malformed message dropped", "frames", n, "count", c)
			}
			continue
		}
		ln.handle(frames[0], binary.BigEndian.Uint64(frames[1]), frames[2], now)
	}
}

func (ln *listener) handle(topic []byte, seq uint64, payload []byte, now int64) {
	rt := ln.routes[string(topic)]
	if rt == nil {
		rt = ln.resolve(string(topic))
	}
	if !rt.ok {
		c := ln.ctr.unknownTopics.Add(1)
		if logEvery(c) {
			ln.s.log.Warn("zmqtransport: topic matches no pattern; message dropped",
				"topic", string(topic), "pattern", ln.s.topic.src, "count", c)
		}
		return
	}
	peer := ln.rx.peerAddr()
	named := false
	if ln.allow != nil {
		var ok bool
		if ok, named = ln.sourceAllowed(rt, peer); !ok {
			return
		}
	}
	if err := ln.dec.Decode(payload, &ln.batch); err != nil {
		c := ln.ctr.decodeErr.Add(1)
		if logEvery(c) {
			ln.s.log.Warn("zmqtransport: undecodable batch dropped (its rank is unknown, so the gap shows on the next batch)",
				"pod", rt.pod, "seq", seq, "err", err, "count", c)
		}
		return
	}
	rank := 0
	if ln.batch.HasDPRank {
		rank = ln.batch.DPRank
	}
	if rank < 0 || rank >= kvevents.MaxDPRank {
		c := ln.ctr.badRanks.Add(1)
		if logEvery(c) {
			ln.s.log.Warn("zmqtransport: dp_rank out of range; message dropped", "pod", rt.pod, "dp_rank", rank, "count", c)
		}
		return
	}
	st := ln.stream(rt, rank, topic, peer, named, now)
	if st == nil {
		return
	}
	if st.capped {
		ln.touch(st, now)
	}
	if ln.follow {
		st.follow(peer)
	}
	// A batch on a new connection of an engine with history: verify the
	// engine before it (a restarted process may already be past the
	// stream's last seq). A resumed stream verifies on its first batch
	// anyway (kvevents.Sequencer.Resume).
	fd := ln.rx.srcFD()
	conn, known := ln.conns[fd]
	if !known && readable(ln.mon) {
		// Accepted during this burst.
		ln.onMonitor()
		conn = ln.conns[fd]
	}
	st.goneAt = 0
	if conn != st.conn {
		if _, _, _, history := st.seq.Position(); st.conn != 0 && conn != 0 && history {
			st.connectedAgain(now)
		}
		st.conn = conn
		if conn != 0 {
			st.ctr.tracked.Store(true)
			st.ctr.connected.Store(true)
		}
	}
	st.pre, st.preBatch = payload, &ln.batch
	st.seq.Live(seq, payload, now)
	st.pre, st.preBatch = nil, nil
	st.after()
}

// disconnected marks the streams whose batches came on connection conn as
// no longer connected: a departed engine is reported so (and verified on
// its next batch) instead of borrowing the other engines' connections.
func (ln *listener) disconnected(conn uint64) {
	if conn == 0 {
		return
	}
	now := ln.s.mono()
	for _, rt := range ln.routes {
		for _, st := range rt.ranks {
			if st != nil && st.conn == conn {
				st.ctr.connected.Store(false)
				st.goneAt = now
			}
		}
	}
}

// maxNamedForgotten bounds the engines one log line names.
const maxNamedForgotten = 10

// forgetDeparted removes the streams whose connection has been gone for
// ForgetAfter, and the resumed streams whose engine never showed up in
// that time (SubscriberConfig.ForgetAfter). Loop goroutine.
func (ln *listener) forgetDeparted(now int64) {
	after := int64(ln.s.cfg.ForgetAfter)
	gone := func(st *stream) bool { return st != nil && st.goneAt != 0 && now-st.goneAt >= after }
	var names []string
	n := 0
	forget := func(st *stream) {
		st.remove()
		ln.release(st)
		n++
		if len(names) < maxNamedForgotten {
			names = append(names, st.id.String())
		}
	}
	for topic, rt := range ln.routes {
		live := false
		for rank, st := range rt.ranks {
			if gone(st) {
				forget(st)
				rt.ranks[rank] = nil
			}
			live = live || rt.ranks[rank] != nil
		}
		if !live && len(rt.ranks) > 0 {
			delete(ln.routes, topic)
		}
	}
	for id, st := range ln.pending {
		if gone(st) {
			forget(st)
			delete(ln.pending, id)
		}
	}
	if n == 0 {
		return
	}
	ln.ctr.forgotten.Add(uint64(n))
	if n > len(names) {
		names = append(names, fmt.Sprintf("and %d more", n-len(names)))
	}
	ln.s.log.Info("zmqtransport: departed engines forgotten", "count", n,
		"gone_for", ln.s.cfg.ForgetAfter.String(), "engines", strings.Join(names, ", "))
}

// resolve parses a new topic and remembers the answer.
func (ln *listener) resolve(topic string) *route {
	rt := &route{topic: topic}
	pod, model, err := ln.s.topic.parse(topic)
	if err == nil {
		if model == "" {
			model = ln.s.cfg.Model
		}
		rt.pod, rt.model, rt.ok = pod, model, true
	}
	if len(ln.routes) < maxRoutes {
		ln.routes[topic] = rt
	}
	return rt
}

// stream returns the stream of one rank of a route, creating it on first
// sight if a slot allows (slots.go); nil if it does not, or if its
// identity belongs to a configured engine. named: the message's source
// names its pod (allowList.named).
func (ln *listener) stream(rt *route, rank int, topic, peer []byte, named bool, now int64) *stream {
	if rank < len(rt.ranks) && rt.ranks[rank] != nil {
		return rt.ranks[rank]
	}
	if rt.conflict {
		ln.ctr.conflicts.Add(1)
		return nil
	}
	id := kvevents.EngineID{Model: rt.model, Pod: rt.pod, DPRank: rank}
	st := ln.pending[id]
	if st != nil {
		delete(ln.pending, id)
		st.ctr.pending.Store(false)
		// A resumed stream proved itself in the process that took the
		// checkpoint; it leaves its slot if its source names it.
		if ln.namedFits(rt, named) {
			ln.release(st)
			ln.hold(st, false)
		}
	} else {
		capped, ok := ln.admit(rt, named, now)
		if !ok {
			ln.refuse(rt, rank, topic)
			return nil
		}
		delete(rt.refused, rank)
		if st = ln.newEngineStream(id, string(peer)); st == nil {
			// Remember the conflict so the next message does not try again.
			rt.conflict = true
			return nil
		}
		ln.hold(st, capped)
		ln.expectProof(st, now)
	}
	for len(rt.ranks) <= rank {
		rt.ranks = append(rt.ranks, nil)
	}
	rt.ranks[rank] = st
	st.rt = rt
	st.logAttrs(slog.LevelInfo, "zmqtransport: engine discovered", slog.String("replay", st.replayEP))
	return st
}

// newEngineStream creates, claims and registers the stream of a bind-mode
// engine rank (the caller holds it: slots.go); nil if its identity
// belongs to another stream. addr is the source of its first batch ("" for a resumed
// stream, whose engine has sent nothing yet).
func (ln *listener) newEngineStream(id kvevents.EngineID, addr string) *stream {
	rank := id.DPRank
	var replayEP string
	if ln.s.cfg.ReplayTemplate != "" && (addr != "" || !ln.follow) {
		ep, err := expandReplayTemplate(ln.s.cfg.ReplayTemplate, id.Pod, id.Model, addr, rank)
		if err != nil {
			ln.s.log.Warn("zmqtransport: no replay endpoint for engine", "engine", id.String(), "err", err)
		} else {
			replayEP = ep
		}
	}
	endpoint := ln.bound[0]
	if rank < len(ln.bound) {
		endpoint = ln.bound[rank]
	}
	st := ln.s.newStream(ln.loop, id, endpoint, replayEP, ln)
	st.addr = addr
	if !ln.s.claim(id, st) {
		st.close()
		c := ln.ctr.conflicts.Add(1)
		ln.s.log.Warn("zmqtransport: engine identity already read by another stream; its messages are dropped",
			"pod", id.Pod, "dp_rank", id.DPRank, "model", id.Model, "count", c)
		return nil
	}
	if err := st.openDealer(); err != nil {
		ln.s.log.Warn("zmqtransport: replay socket not opened; gaps will degrade the stream",
			"engine", id.String(), "err", err)
		none := ""
		st.replayEP = none
		st.ctr.replayEndpoint.Store(&none)
		if !ln.follow {
			st.seq.DisableReplay()
		}
	}
	ln.s.register(st)
	return st
}

// refuse drops a message of an engine rank that would exceed the
// MaxEngines cap. Each refused rank is counted and logged once while it
// stays refused (a topic the route table cannot remember is counted per
// message); the log is rate-limited, so a flood of invented topics costs
// a counter, not a log line each.
func (ln *listener) refuse(rt *route, rank int, topic []byte) {
	if rt.refused[rank] {
		return
	}
	if rt.refused == nil {
		rt.refused = map[int]bool{}
	}
	rt.refused[rank] = true
	c := ln.ctr.refused.Add(1)
	if logEvery(c) {
		ln.s.log.Warn("zmqtransport: engine refused: the listener has its maximum of streams, and none is free to take (raise --max-engines if the fleet is this large, or name the engines in --engine-allow); its messages are dropped",
			"topic", string(topic), "dp_rank", rank, "max_engines", ln.s.cfg.MaxEngines, "count", c)
	}
}

// onMonitor counts connected peers and names their connections.
func (ln *listener) onMonitor() {
	for {
		ev, addr, fd, err := ln.mon.RecvEvent(zmq.DONTWAIT)
		if err != nil {
			return
		}
		switch {
		case ev&zmq.EVENT_ACCEPTED != 0:
			ln.nextConn++
			ln.conns[fd] = ln.nextConn
			if ln.zapOn() {
				ln.connSrc[fd] = ln.connAccepted(fd)
			}
			p := ln.ctr.peers.Add(1)
			ln.s.log.LogAttrs(context.Background(), slog.LevelInfo, "zmqtransport: engine connected to listener",
				slog.String("addr", addr), slog.Int64("peers", p))
		case ev&zmq.EVENT_DISCONNECTED != 0:
			ln.disconnected(ln.conns[fd])
			delete(ln.conns, fd)
			if a, ok := ln.connSrc[fd]; ok {
				ln.connClosed(a)
				delete(ln.connSrc, fd)
			}
			p := ln.ctr.peers.Add(-1)
			ln.s.log.LogAttrs(context.Background(), slog.LevelInfo, "zmqtransport: engine disconnected from listener",
				slog.String("addr", addr), slog.Int64("peers", p))
		}
	}
}
