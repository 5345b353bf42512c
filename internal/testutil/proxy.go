package testutil

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// TCPProxy forwards every connection it accepts to a target address. A
// test breaks the path in the two ways networks do: Cut closes everything
// (the client sees the far end gone), Stall keeps the current connections
// open but carries nothing more on them (a peer that vanished without
// closing, as its client sees it until TCP gives up).
type TCPProxy struct {
	t      testing.TB
	target string
	addr   string

	mu    sync.Mutex
	ln    net.Listener
	conns []*proxiedConn
}

type proxiedConn struct {
	client, upstream net.Conn
	stalled          atomic.Bool
}

// NewTCPProxy listens on a free loopback port and forwards to target
// (host:port) until the test ends.
func NewTCPProxy(t testing.TB, target string) *TCPProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &TCPProxy{t: t, target: target, addr: ln.Addr().String()}
	p.serve(ln)
	t.Cleanup(p.Cut)
	return p
}

// Addr is the proxy's host:port.
func (p *TCPProxy) Addr() string { return p.addr }

func (p *TCPProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			pc := &proxiedConn{client: c, upstream: u}
			p.mu.Lock()
			p.conns = append(p.conns, pc)
			p.mu.Unlock()
			go pc.pipe(u, c)
			go pc.pipe(c, u)
		}
	}()
}

// pipe copies src to dst and passes src's end on as dst's close, unless
// the connection is stalled: then what arrives is read and dropped, and
// nothing is closed.
func (pc *proxiedConn) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !pc.stalled.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil && !pc.stalled.Load() {
				src.Close()
				return
			}
		}
		if err != nil {
			if !pc.stalled.Load() {
				dst.Close()
			}
			return
		}
	}
}

// Stall freezes the connections open now; new ones are forwarded as
// before.
func (p *TCPProxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pc := range p.conns {
		pc.stalled.Store(true)
	}
}

// Cut closes the listener and every connection.
func (p *TCPProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for _, pc := range p.conns {
		pc.client.Close()
		pc.upstream.Close()
	}
	p.conns = nil
}

// Restore listens again on the same address after Cut.
func (p *TCPProxy) Restore() {
	p.t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatal(err)
	}
	p.serve(ln)
}
