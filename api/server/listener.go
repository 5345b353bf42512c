package server

import (
	"errors"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// NewHTTPServer returns an http.Server for Handler(opts) with the timeouts
// of Config.Limits; serve it on LimitListener's listener so that the
// connection limit holds too.
func (s *Server) NewHTTPServer(opts HTTPOptions) *http.Server {
	return httpServer(s.Handler(opts), s.cfg.Limits)
}

// NewAdminServer returns an http.Server for AdminHandler. Its write
// timeout is Limits.HTTPWriteTimeout, which also caps
// /debug/pprof/profile's seconds. Serve it on AdminListener's listener.
func (s *Server) NewAdminServer() *http.Server {
	return httpServer(s.AdminHandler(), s.cfg.Limits)
}

// DefaultHTTPServer returns an http.Server for h with DefaultLimits'
// timeouts, for a server without a Server of its own (kvindex picker's).
func DefaultHTTPServer(h http.Handler) *http.Server { return httpServer(h, DefaultLimits) }

func httpServer(h http.Handler, l Limits) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.HTTPReadHeaderTimeout,
		ReadTimeout:       l.HTTPReadTimeout,
		WriteTimeout:      l.HTTPWriteTimeout,
		IdleTimeout:       l.HTTPIdleTimeout,
		MaxHeaderBytes:    64 << 10,
	}
}

// AdminListener returns lis speaking TLS with AdminTLSConfig when TLS is
// configured, else lis.
func (s *Server) AdminListener(lis net.Listener) net.Listener {
	return tlsListener(lis, s.AdminTLSConfig())
}

// LimitListener returns lis accepting at most Limits.HTTPMaxConns open
// connections: beyond that Accept waits for one to close, and the
// connection waits in the kernel's backlog. Because every HTTP connection
// ends within the server's timeouts, a waiting one is served eventually
// (a client holding connections open cannot keep /healthz away for
// good). Waits are counted (kvindex_http_connection_waits_total) and
// logged at most once per connWaitLogEvery. One client address may hold
// at most HTTPMaxConns/PerAddrShare of them: a connection beyond that is
// closed at once (kvindex_http_connections_refused_total), so that one
// host trickling requests cannot take every slot from the others. With
// TLS configured
// (Config.Security) the connections it returns speak TLS; the handshake
// runs in the connection's own goroutine, on its first read.
func (s *Server) LimitListener(lis net.Listener) net.Listener {
	s.conns.max = s.cfg.Limits.HTTPMaxConns
	return tlsListener(&limitListener{Listener: lis, s: s, sem: make(chan struct{}, s.cfg.Limits.HTTPMaxConns), done: make(chan struct{}),
		perAddrMax: max(s.cfg.Limits.HTTPMaxConns/PerAddrShare, 1), perAddr: map[netip.Addr]int{}}, s.HTTPTLSConfig())
}

// PerAddrShare: one client address may hold at most 1/PerAddrShare of
// Limits.HTTPMaxConns.
const PerAddrShare = 4

// connWaitLogEvery rate-limits the log line of a full connection limit.
const connWaitLogEvery = 10 * time.Second

// connStats counts the HTTP connections of LimitListener.
type connStats struct {
	max     int
	open    atomic.Int64
	waits   atomic.Uint64
	refused atomic.Uint64 // beyond the per-address share
	logged  atomic.Int64  // waits' log line
	rlogged atomic.Int64  // refusals' log line

	timeouts atomic.Uint64 // connections past a read deadline
	tlogged  atomic.Int64  // their log line
}

type limitListener struct {
	net.Listener
	s         *Server
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once

	perAddrMax int
	mu         sync.Mutex
	perAddr    map[netip.Addr]int // open connections by client address
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	default:
		st := &l.s.conns
		st.waits.Add(1)
		now := l.s.now().UnixNano()
		if last := st.logged.Load(); now-last >= int64(connWaitLogEvery) && st.logged.CompareAndSwap(last, now) {
			l.s.log.Warn("HTTP connection limit reached; new connections wait", "limit", st.max, "waits_total", st.waits.Load())
		}
		select {
		case l.sem <- struct{}{}:
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			<-l.sem
			return nil, err
		}
		addr := remoteAddr(c)
		l.mu.Lock()
		n := l.perAddr[addr]
		if n >= l.perAddrMax {
			l.mu.Unlock()
			c.Close()
			st := &l.s.conns
			st.refused.Add(1)
			now := l.s.now().UnixNano()
			if last := st.rlogged.Load(); now-last >= int64(connWaitLogEvery) && st.rlogged.CompareAndSwap(last, now) {
				l.s.log.Warn("HTTP connection refused: its client address holds its share of the connection limit",
					"addr", addr, "per_address", l.perAddrMax, "limit", st.max, "refused_total", st.refused.Load())
			}
			continue // the slot serves the next connection
		}
		l.perAddr[addr] = n + 1
		l.mu.Unlock()
		l.s.conns.open.Add(1)
		lc := &limitConn{Conn: c, timedOut: func() { l.s.readTimedOut(addr) }, release: func() {
			l.mu.Lock()
			if l.perAddr[addr]--; l.perAddr[addr] == 0 {
				delete(l.perAddr, addr)
			}
			l.mu.Unlock()
			l.s.conns.open.Add(-1)
			<-l.sem
		}}
		lc.midRequest.Store(true) // its first request's headers are due
		return lc, nil
	}
}

// readTimedOut counts, and logs at most once per connWaitLogEvery, a
// connection closed because its client did not send a request within the
// read deadlines (Limits.HTTPReadHeaderTimeout, HTTPReadTimeout).
func (s *Server) readTimedOut(addr netip.Addr) {
	st := &s.conns
	st.timeouts.Add(1)
	now := s.now().UnixNano()
	if last := st.tlogged.Load(); now-last >= int64(connWaitLogEvery) && st.tlogged.CompareAndSwap(last, now) {
		s.log.Warn("HTTP connection closed: its client did not send its request within the read deadlines",
			"addr", addr, "read_header_timeout", s.cfg.Limits.HTTPReadHeaderTimeout.String(),
			"read_timeout", s.cfg.Limits.HTTPReadTimeout.String(), "timeouts_total", st.timeouts.Load())
	}
}

// remoteAddr is a connection's client address (the zero Addr for a
// connection without one, which then all share one count).
func remoteAddr(c net.Conn) netip.Addr {
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}

type limitConn struct {
	net.Conn
	once     sync.Once
	release  func()
	timedOut func() // counts a read deadline hit mid-request

	// midRequest: the connection is new, or has read bytes of a request
	// and written no answer since, so that a read deadline hit is the
	// client's slowness, not a keep-alive connection's idleness.
	midRequest atomic.Bool
	// aborted: the server set a deadline in the past to end a read
	// itself (net/http does, once a handler is done).
	aborted atomic.Bool
	counted atomic.Bool
}

func (c *limitConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.midRequest.Store(true)
	}
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && c.midRequest.Load() && !c.aborted.Load() && c.counted.CompareAndSwap(false, true) {
		c.timedOut()
	}
	return n, err
}

func (c *limitConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.midRequest.Store(false)
	}
	return n, err
}

func (c *limitConn) SetReadDeadline(t time.Time) error {
	c.aborted.Store(!t.IsZero() && t.Before(time.Now()))
	return c.Conn.SetReadDeadline(t)
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
