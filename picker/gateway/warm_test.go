package gateway_test

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/picker/gateway"
)

// slowProxy forwards TCP connections to a backend; while slow, each new
// connection waits setup before it is forwarded, as a connection's setup
// (a TLS handshake, a cross-zone hop) costs far more than a query.
// drop closes every connection it forwards.
type slowProxy struct {
	lis     net.Listener
	backend string
	setup   time.Duration

	mu    sync.Mutex
	slow  bool
	conns []net.Conn
}

func newSlowProxy(t *testing.T, backend string, setup time.Duration) *slowProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &slowProxy{lis: lis, backend: backend, setup: setup}
	t.Cleanup(func() { lis.Close(); p.drop() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go p.forward(c)
		}
	}()
	return p
}

func (p *slowProxy) forward(c net.Conn) {
	p.mu.Lock()
	slow := p.slow
	p.conns = append(p.conns, c)
	p.mu.Unlock()
	if slow {
		time.Sleep(p.setup) // the connection's setup cost, not synchronisation
	}
	b, err := net.Dial("tcp", p.backend)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, b)
	p.mu.Unlock()
	go func() { io.Copy(b, c); b.Close() }()
	io.Copy(c, b)
	c.Close()
}

// drop closes every forwarded connection and makes new ones slow.
func (p *slowProxy) drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.slow = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// The picker warms a remote index's connection before its first request
// and again after the connection is lost, so that the requests right
// after a start or a reconnect are answered by the index, not routed
// without it: a fresh connection's setup (here 1 s) is far past the
// query deadline (100 ms).
func TestRemoteWarmUp(t *testing.T) {
	f := newFleet(t, "pod-a", "pod-b")
	p := newSlowProxy(t, f.indexAddr, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	c, err := client.Dial(ctx, p.lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// The connection is lost before the picker starts: its first query
	// would open a fresh one.
	p.drop()
	svc, reg := newService(t, f, gateway.Remote{Client: c}, func(c *gateway.Config) { c.IndexTimeout = 100 * time.Millisecond })
	wctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	if err := svc.Warm(wctx, waitFor); err != nil {
		t.Fatal(err)
	}
	xc, _ := startPicker(t, svc)
	pick := func(what string) {
		t.Helper()
		e := send(t, xc, "/v1/completions", nil, nil, idsBody(testutil.Seq(1, 64)), 100)
		if e.dest == "" {
			t.Fatalf("%s: not routed: status %d %s", what, e.status, e.body)
		}
		e.finish(t, nil)
		if fb := fallbacks(t, reg); fb != 0 {
			t.Fatalf("%s: routed without the index (%v fallbacks)", what, fb)
		}
	}
	pick("first request after start")
	if n := mustVec(t, reg, "kvindex_picker_index_warmups_total", "ok"); n != 1 {
		t.Errorf("warm-ups at start = %v, want 1", n)
	}

	// Lost again: the picker reconnects and warms the new connection by
	// itself.
	p.drop()
	testutil.Await(t, waitFor, "the reconnect's warm-up", func() bool { return mustVec(t, reg, "kvindex_picker_index_warmups_total", "ok") == 2 })
	pick("first request after a reconnect")
}
