package server

import (
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// NewHTTPServer returns an http.Server for Handler(opts) with the timeouts
// of Config.Limits; serve it on LimitListener's listener so that the
// connection limit holds too.
func (s *Server) NewHTTPServer(opts HTTPOptions) *http.Server {
	l := s.cfg.Limits
	return &http.Server{
		Handler:           s.Handler(opts),
		ReadHeaderTimeout: l.HTTPReadHeaderTimeout,
		ReadTimeout:       l.HTTPReadTimeout,
		WriteTimeout:      l.HTTPWriteTimeout,
		IdleTimeout:       l.HTTPIdleTimeout,
		MaxHeaderBytes:    64 << 10,
	}
}

// NewAdminServer returns an http.Server for AdminHandler. Its write
// timeout is Limits.HTTPWriteTimeout, which also caps
// /debug/pprof/profile's seconds. Serve it on AdminListener's listener.
func (s *Server) NewAdminServer() *http.Server {
	l := s.cfg.Limits
	return &http.Server{
		Handler:           s.AdminHandler(),
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
		return &limitConn{Conn: c, release: func() {
			l.mu.Lock()
			if l.perAddr[addr]--; l.perAddr[addr] == 0 {
				delete(l.perAddr, addr)
			}
			l.mu.Unlock()
			l.s.conns.open.Add(-1)
			<-l.sem
		}}, nil
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
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
