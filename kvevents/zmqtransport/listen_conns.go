package zmqtransport

import (
	"net/netip"
	"syscall"
)

// Connections to the listen socket, bounded at the handshake.
//
// libzmq keeps a receive queue for each connection of the listen socket,
// up to RcvHWM messages, outside the Go heap, and setting RcvHWM on the
// bound socket does not reach the connections it has not accepted yet, so
// the only bound on the queues' memory is a bound on the connections.
// The queues are sized for MaxEngines streams (memlimit.Split), one
// connection each (an engine rank connects once, to its rank's port), so
// with engine allow rules the ZAP handler admits at most MaxEngines
// connections counted against that cap (ListenerStats.RefusedConnections
// counts the others). A source address that exact rules tie to pods (a
// rule naming a pod with that single address, or a pod named by the
// address) has namedConnsPerRank connections per listen port for each of
// those pods beyond the cap, so named engines are not refused for want of
// room; its connections beyond that count against the cap too. So the
// queues hold at most (MaxEngines + the tied pods' allowance) x RcvHWM
// messages, whatever the number of peers.
//
// libzmq does not retry a connection refused at the handshake (but when
// the connection closes before the refusal reaches the peer): an engine
// admitted only by a glob rule that connects while the cap is full stays
// out until it restarts. The log says so, with the cure. The cap is
// served only under static rules (zapOn): discovery's rules admit pods
// after their engines may have connected, so a handshake refusal there
// could shut out a named engine for good.
//
// The cap counts connections, not engines: the flood's sockets that fit
// are admitted like engines, and their topics then compete for slots
// (slots.go).
//
// The handshake names the source address but not the connection, and the
// monitor names the connection (its fd) but not the address, so they
// meet per address: the monitor counts each address's live connections
// (getpeername on the fd it accepted), the handler counts those it
// admitted, and an address never has more admitted than live ones (a
// connection closing takes one admission with it once the admitted ones
// are all that is left). A connection of an address that closes while
// another of the same address is in its handshake may be counted as
// admitted until that handshake ends (libzmq's handshake timeout, 30 s at
// most): the count errs towards refusing, never towards more queues.

// namedConnsPerRank is the connections an engine rank of a tied pod has
// beyond the cap: its own, and its successor's while a restarted engine's
// old connection is not yet seen closed.
const namedConnsPerRank = 2

// sourceConns are one source address's connections.
type sourceConns struct {
	live     int // accepted, not yet disconnected (monitor)
	admitted int // admitted at the handshake, at most live
}

// counted is how many of an address's admitted connections count against
// the cap, beyond allowance (its tied pods').
func (c *sourceConns) counted(allowance int) int { return max(c.admitted-allowance, 0) }

// allowance is what a source address has beyond the cap.
func (ln *listener) allowance(a netip.Addr) int {
	return ln.allow.tied[a] * namedConnsPerRank * len(ln.bound)
}

// connAccepted counts a connection the monitor saw accepted on fd, and
// returns its source address (invalid if unknown). Loop goroutine.
func (ln *listener) connAccepted(fd int) netip.Addr {
	a := peerAddr(fd)
	c := ln.sources[a]
	if c == nil {
		c = &sourceConns{}
		ln.sources[a] = c
	}
	c.live++
	return a
}

// connClosed uncounts a connection from a closed. Loop goroutine.
func (ln *listener) connClosed(a netip.Addr) {
	c := ln.sources[a]
	if c == nil {
		return
	}
	c.live--
	if c.admitted > c.live {
		ln.setAdmitted(a, c, c.live)
	}
	if c.live <= 0 {
		delete(ln.sources, a)
	}
}

// setAdmitted sets an address's admitted connections, keeping the count
// against the cap.
func (ln *listener) setAdmitted(a netip.Addr, c *sourceConns, n int) {
	allowance := ln.allowance(a)
	ln.capped += (&sourceConns{admitted: n}).counted(allowance) - c.counted(allowance)
	c.admitted = n
}

// admitConn decides whether a connection from a, which some rule names,
// fits: false if it would count against the cap and the cap is full.
// Loop goroutine, after the monitor's events are read.
func (ln *listener) admitConn(a netip.Addr) bool {
	c := ln.sources[a]
	if c == nil || c.admitted >= c.live {
		// libzmq reports the accept before the handshake, but on another
		// socket: its event may still wait unread, behind this request.
		// Read it, or the connection would pass uncounted.
		ln.onMonitor()
		c = ln.sources[a]
	}
	if c == nil || c.admitted >= c.live {
		// Its connection is gone already (or the monitor could not read
		// its address): nothing to queue for, nothing to count.
		return true
	}
	if c.admitted >= ln.allowance(a) && ln.capped >= ln.s.cfg.MaxEngines {
		return false
	}
	ln.setAdmitted(a, c, c.admitted+1)
	return true
}

// peerAddr is the source address of the connection on fd, invalid if it
// is closed.
func peerAddr(fd int) netip.Addr {
	sa, err := syscall.Getpeername(fd)
	if err != nil {
		return netip.Addr{}
	}
	switch sa := sa.(type) {
	case *syscall.SockaddrInet4:
		return netip.AddrFrom4(sa.Addr)
	case *syscall.SockaddrInet6:
		return netip.AddrFrom16(sa.Addr).Unmap()
	}
	return netip.Addr{}
}
