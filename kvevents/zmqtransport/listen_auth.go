package zmqtransport

import (
	"net/netip"

	zmq "github.com/pebbe/zmq4"
)

// Engine identity in bind mode.
//
// A topic is whatever a peer writes, so with engine allow rules
// (SubscriberConfig.EngineAllow) the listener checks where each message
// comes from, twice:
//
//   - at the ZMQ handshake, libzmq asks a ZAP handler (RFC 27) about every
//     connection, with its source address, even under the NULL mechanism
//     once the socket has a ZAP domain. The listener serves that handler
//     on its own loop, from a REP socket bound to inproc://zeromq.zap.01
//     in the subscriber's context (one handler per context), and refuses
//     addresses no rule names, and connections beyond the cap
//     (listen_conns.go). pebbe/zmq4's AuthStart cannot do it: it
//     binds in pebbe's default context, which the subscriber does not
//     use, keeps its rules in process-wide globals and counts nothing.
//   - per message, the source address libzmq attaches to it (its
//     Peer-Address property, read in the same cgo call as the message)
//     must be allowed for the pod the topic names, before the message
//     reaches a stream: a refused message never creates a stream, moves a
//     sequence or touches the index. Reading the property costs a lookup
//     in the message's metadata; the per-connection alternative (ZMQ_SRCFD
//     and getpeername, cached per fd) would be cheaper but could attribute
//     a message still queued from a closed connection to the connection
//     that reused its fd.

// zapDomain is the listen socket's ZAP domain: any non-empty value makes
// libzmq consult the handler.
const zapDomain = "kvindex-engines"

// zapEndpoint is where libzmq looks for a context's ZAP handler.
const zapEndpoint = "inproc://zeromq.zap.01"

// openZAP binds the ZAP handler in the subscriber's context. Loop
// goroutine.
func (ln *listener) openZAP() error {
	rep, err := ln.s.zctx.NewSocket(zmq.REP)
	if err != nil {
		return err
	}
	if err := rep.SetLinger(0); err != nil {
		rep.Close()
		return err
	}
	if err := rep.Bind(zapEndpoint); err != nil {
		rep.Close()
		return err
	}
	ln.zap = rep
	ln.loop.add(rep, ln.onZAP)
	return nil
}

// closeZAP closes the ZAP handler. Loop goroutine; idempotent.
func (ln *listener) closeZAP() {
	if ln.zap == nil {
		return
	}
	ln.loop.remove(ln.zap)
	ln.zap.Close()
	ln.zap = nil
}

// onZAP answers ZAP requests: [version, request_id, domain, address,
// routing_id, mechanism, credentials...] with [version, request_id,
// status, text, user_id, metadata]. A REP socket must answer each request
// before reading the next.
func (ln *listener) onZAP() {
	if readable(ln.mon) {
		// The connections accepted before their handshake (listen_conns.go).
		ln.onMonitor()
	}
	for range recvBudget {
		req, err := ln.zap.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			return
		}
		var id []byte
		if len(req) > 1 {
			id = req[1]
		}
		status, text := "500", "malformed ZAP request"
		if len(req) >= 6 && string(req[0]) == "1.0" {
			status, text = ln.authorize(string(req[3]))
		}
		if _, err := ln.zap.SendMessageDontwait("1.0", id, status, text, "", ""); err != nil {
			ln.s.log.Error("zmqtransport: ZAP reply not sent", "err", err)
		}
	}
}

// authorize decides a connection from addr at the handshake: some rule
// must name the address (the pod is not known before a message arrives),
// and the connection must fit (listen_conns.go).
func (ln *listener) authorize(addr string) (status, text string) {
	a, err := netip.ParseAddr(addr)
	if err == nil && ln.allow.handshake(a) {
		if ln.admitConn(a.Unmap().WithZone("")) {
			return "200", "OK"
		}
		c := ln.ctr.refusedFull.Add(1)
		if logEvery(c) {
			ln.s.log.Warn("zmqtransport: connection refused at the handshake: the listener has as many connections as its event queues are sized for, from sources no exact engine allow rule ties to a pod; libzmq does not retry it, so an engine refused here stays out until it restarts (raise --max-engines, or name the engines in --engine-allow)",
				"addr", addr, "endpoint", ln.bound0(), "max_engines", ln.s.cfg.MaxEngines, "count", c)
		}
		return "400", "too many connections"
	}
	c := ln.ctr.refusedHandshake.Add(1)
	if logEvery(c) {
		ln.s.log.Warn("zmqtransport: connection refused at the handshake: no engine allow rule names its address",
			"addr", addr, "endpoint", ln.bound0(), "count", c)
	}
	return "400", "address not allowed"
}

// bound0 is rank 0's bound endpoint, for logs ("" before it is bound).
func (ln *listener) bound0() string {
	if len(ln.bound) == 0 {
		return ""
	}
	return ln.bound[0]
}

// sourceAllowed reports whether a message for rt's pod may come from peer
// (its Peer-Address), and if so whether peer names the pod
// (allowList.named); a refused one is counted and logged, rate-limited.
func (ln *listener) sourceAllowed(rt *route, peer []byte) (ok, named bool) {
	switch string(peer) {
	case "":
	case rt.srcOK:
		return true, rt.srcNamed
	case rt.srcBad:
		ln.refuseSource(rt, string(peer), "")
		return false, false
	}
	why := "the message carries no source address"
	if a, err := netip.ParseAddr(string(peer)); err == nil {
		if ok, why = ln.allow.source(rt.pod, a); ok {
			rt.srcOK, rt.srcNamed = string(peer), ln.allow.named(rt.pod, a)
			return true, rt.srcNamed
		}
		rt.srcBad = string(peer)
	}
	ln.refuseSource(rt, string(peer), why)
	return false, false
}

func (ln *listener) refuseSource(rt *route, addr, why string) {
	c := ln.ctr.refusedSource.Add(1)
	if !logEvery(c) {
		return
	}
	if why == "" {
		_, why = ln.allow.source(rt.pod, netip.MustParseAddr(addr))
	}
	ln.s.log.Warn("zmqtransport: message refused: its source may not speak for the pod its topic names; dropped",
		"pod", rt.pod, "model", rt.model, "addr", addr, "reason", why, "count", c)
}
