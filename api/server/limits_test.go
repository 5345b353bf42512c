package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/api/watchhub"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/tokenizer"
)

// gateTokenizer holds every text prompt until open is closed, so that
// queries stay in flight; entered receives one value per call.
type gateTokenizer struct {
	entered chan struct{}
	open    chan struct{}
}

func (g *gateTokenizer) Tokenize(ctx context.Context, _ string, _ tokenizer.Input) ([]uint64, error) {
	g.entered <- struct{}{}
	select {
	case <-g.open:
		return testutil.Seq(1, 32), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Queries beyond Limits.MaxTokensInFlight are refused at once with
// ResourceExhausted (HTTP 429) naming the limit, while a small query
// still fits; the refusals are counted.
func TestTokensInFlight(t *testing.T) {
	gate := &gateTokenizer{entered: make(chan struct{}, 8), open: make(chan struct{})}
	f := newFixture(t, func(c *Config) {
		c.MaxTokens = 1000
		c.Limits.MaxTokensInFlight = 2500
		c.Tokenizers = []NamedTokenizer{{client.SourceLocal, gate}}
	})
	loadThree(t, f, testutil.Seq(1, 64))
	ctx := context.Background()
	large := strings.Repeat("x", 1000) // counts 1,000 tokens
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := f.client.LongestPrefixText(ctx, testModel, large, nil); err != nil {
				t.Errorf("query in flight: %v", err)
			}
		}()
	}
	<-gate.entered
	<-gate.entered // 2,000 tokens in flight

	_, err := f.client.LongestPrefixText(ctx, testModel, large, nil)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "its limit of 2500 tokens in flight") {
		t.Errorf("third large query: %v; want ResourceExhausted naming the limit", err)
	}
	code, body := post(t, f.url+"/v1/longest-prefix", `{"prompt":"`+large+`"}`)
	if code != http.StatusTooManyRequests || !strings.Contains(string(body), "its limit of 2500 tokens in flight") {
		t.Errorf("HTTP large query: %d %s; want 429", code, body)
	}
	if _, err := f.client.LongestPrefixTokens(ctx, testModel, testutil.Seq(1, 64), nil); err != nil {
		t.Errorf("small query: %v", err)
	}
	if _, err := f.client.LookupTokens(ctx, testModel, testutil.Seq(1, 64), nil); err != nil {
		t.Errorf("small lookup: %v", err)
	}
	text := scrape(t, f.url)
	for _, want := range []string{`kvindex_query_refused_total{reason="tokens_in_flight"} 2`, `kvindex_query_tokens_in_flight 2000`} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("metrics lack %s", want)
		}
	}
	close(gate.open)
	wg.Wait()
	if n := f.srv.tokens.InFlight(); n != 0 {
		t.Errorf("%d tokens in flight after every query ended", n)
	}
}

// Clients that hold HTTP connections open, sending their headers byte by
// byte, are cut off after the header timeout; meanwhile connections beyond
// --http-max-conns wait, and /healthz is answered once a slot frees.
func TestHTTPSlowClients(t *testing.T) {
	const conns = 4
	f := newFixture(t, func(c *Config) {
		c.Limits.HTTPReadHeaderTimeout = 300 * time.Millisecond
		c.Limits.HTTPMaxConns = conns
	})
	lis := serveLimited(t, f)

	closed := make(chan error, conns)
	for i := range conns {
		// Each from its own address: one address may hold only a share
		// of the slots (TestHTTPConnsPerAddress).
		c, err := dialFrom(fmt.Sprintf("127.0.0.%d", i+2), lis.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		go func() { // a byte at a time, until the server hangs up
			req := "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + strings.Repeat("a", 1<<20)
			for i := 0; ; i++ {
				if _, err := c.Write([]byte{req[i%len(req)]}); err != nil {
					return
				}
				time.Sleep(20 * time.Millisecond) // the client's pace, not synchronisation
			}
		}()
		go func() {
			_, err := io.Copy(io.Discard, c) // returns when the server closes
			closed <- err
		}()
	}
	// Every slot is (or will be) held by a slow client: /healthz waits,
	// then is answered.
	hc := &http.Client{Timeout: 30 * time.Second}
	resp, err := hc.Get("http://" + lis.Addr().String() + "/healthz")
	if err != nil {
		t.Fatalf("/healthz: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz: %d", resp.StatusCode)
	}
	for range conns {
		<-closed // each slow client was cut off
	}
	text := scrape(t, f.url)
	if !strings.Contains(text, "kvindex_http_connection_waits_total ") || strings.Contains(text, "kvindex_http_connection_waits_total 0\n") {
		t.Errorf("no connection waits counted:\n%s", grepLines(text, "kvindex_http_conn"))
	}
}

// serveLimited serves f's HTTP API on a loopback listener under its
// connection limits (LimitListener), until the test ends.
func serveLimited(t *testing.T, f *fixture) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := f.srv.NewHTTPServer(HTTPOptions{})
	go hs.Serve(f.srv.LimitListener(lis))
	t.Cleanup(func() { hs.Close() })
	return lis
}

// dialFrom connects to addr from the loopback address src.
func dialFrom(src, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	return d.Dial("tcp", addr)
}

// One client address holds at most a share of the HTTP connections: its
// connection beyond that is closed at once and counted, while other
// addresses are still served.
func TestHTTPConnsPerAddress(t *testing.T) {
	const conns = 2 * PerAddrShare // two per address
	f := newFixture(t, func(c *Config) { c.Limits.HTTPMaxConns = conns })
	lis := serveLimited(t, f)
	var held []net.Conn
	for range 2 {
		c, err := dialFrom("127.0.0.2", lis.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		held = append(held, c)
	}
	// Both are accepted (a request on each is answered) ...
	for _, c := range held {
		if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("a connection within the share: %v %v", resp, err)
		}
		resp.Body.Close()
	}
	// ... a third from the same address is closed unanswered ...
	third, err := dialFrom("127.0.0.2", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	third.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))
	third.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := third.Read(make([]byte, 1)); err == nil || n > 0 {
		t.Errorf("a connection beyond the share was answered (%d bytes, %v)", n, err)
	}
	// ... while another address is served.
	other, err := dialFrom("127.0.0.3", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	other.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))
	if resp, err := http.ReadResponse(bufio.NewReader(other), nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("another address: %v %v", resp, err)
	}
	if text := scrape(t, f.url); !strings.Contains(text, "kvindex_http_connections_refused_total 1\n") {
		t.Errorf("refusal not counted:\n%s", grepLines(text, "kvindex_http_conn"))
	}
}

func grepLines(text, prefix string) string {
	var b strings.Builder
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), prefix) {
			b.WriteString(sc.Text() + "\n")
		}
	}
	return b.String()
}

// A Watch stream that falls behind ends with ResourceExhausted saying so;
// Watch streams beyond MaxWatchers are refused with ResourceExhausted.
func TestWatchLimits(t *testing.T) {
	var hub *watchhub.Hub
	f := newFixture(t, func(c *Config) {
		hub = watchhub.New(c.Index.(kvevents.Sink), watchhub.Limits{MaxWatchers: 1, HubQueueBytes: 1})
		c.Hub = hub
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := f.client.Index.Watch(ctx, &kvindexv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Await(t, awaitBound, "the watch registered", func() bool { return hub.Watchers() == 1 })
	second, err := f.client.Index.Watch(ctx, &kvindexv1.WatchRequest{})
	if err == nil {
		_, err = second.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "at most 1 Watch streams at once") {
		t.Errorf("second watcher: %v; want ResourceExhausted naming the limit", err)
	}

	// Every batch is larger than the fan-out queue's 1 byte: it overflows.
	for i := range 10 {
		hub.Apply(engine("a", 0), uint64(i), []kvevents.Event{stored(t, testutil.Seq(1, 32), 2)})
	}
	for err = nil; err == nil; {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("watch: %v; want ResourceExhausted", err)
	}
	if !strings.Contains(err.Error(), "watch fell behind") || !strings.Contains(err.Error(), "reconnect") {
		t.Errorf("watch ended with %v; want the fell-behind notice", err)
	}
	// The server counts the stream's end as it closes it, which may be
	// just after the client reads the status.
	for _, want := range []string{"kvindex_watch_closed_behind_total 1", "kvindex_watch_refused_total 1", "kvindex_watchers 0"} {
		testutil.Await(t, awaitBound, "metrics with "+want, func() bool { return strings.Contains(scrape(t, f.url), want+"\n") })
	}
}

// Counts never wrap: answers saturate their uint32 fields (the gates'
// sums are internal/inflight's tests).
func TestCountsSaturate(t *testing.T) {
	for _, tc := range []struct {
		in   int64
		want uint32
	}{{-1, 0}, {0, 0}, {7, 7}, {math.MaxUint32, math.MaxUint32}, {math.MaxUint32 + 1, math.MaxUint32}, {math.MaxInt64, math.MaxUint32}} {
		if got := sat32(tc.in); got != tc.want {
			t.Errorf("sat32(%d) = %d, want %d", tc.in, got, tc.want)
		}
	}
	if _, err := New(Config{Index: newTestIndex(t), BlockSize: 16, MaxTokens: MaxMaxTokens + 1}); err == nil || !strings.Contains(err.Error(), "MaxTokens 200000001 is above") {
		t.Errorf("MaxTokens beyond MaxMaxTokens: %v, want an error naming MaxTokens", err)
	}
}

func newTestIndex(t *testing.T) *indexer.Index {
	t.Helper()
	ix, err := indexer.New(indexer.Options{Hasher: testHasher})
	if err != nil {
		t.Fatal(err)
	}
	return ix
}

// The gRPC server advertises --grpc-max-streams in its HTTP/2 SETTINGS
// (clients keep to it), and closes connections idle for
// --grpc-max-conn-idle (the client's connection leaves READY).
func TestGRPCLimits(t *testing.T) {
	f := newFixture(t, func(c *Config) {
		c.Limits.GRPCMaxStreams = 7
		c.Limits.GRPCMaxConnIdle = 200 * time.Millisecond
	})
	addr := f.client.Addr()

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	// The client preface and an empty SETTINGS frame.
	if _, err := c.Write(append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0)); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	var maxStreams uint32
	found := false
	for !found {
		var hdr [9]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			t.Fatalf("reading the server's frames: %v", err)
		}
		n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
		payload := make([]byte, n)
		if _, err := io.ReadFull(r, payload); err != nil {
			t.Fatal(err)
		}
		if hdr[3] != 4 || hdr[4]&1 != 0 { // SETTINGS, not an ACK
			continue
		}
		for i := 0; i+6 <= n; i += 6 {
			if id := uint16(payload[i])<<8 | uint16(payload[i+1]); id == 3 { // MAX_CONCURRENT_STREAMS
				maxStreams = uint32(payload[i+2])<<24 | uint32(payload[i+3])<<16 | uint32(payload[i+4])<<8 | uint32(payload[i+5])
			}
		}
		found = true
	}
	if maxStreams != 7 {
		t.Errorf("SETTINGS_MAX_CONCURRENT_STREAMS %d, want 7", maxStreams)
	}

	conn := f.client.Conn()
	if _, err := f.client.ListPods(context.Background(), ""); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for st := conn.GetState(); st == connectivity.Ready; st = conn.GetState() {
		if !conn.WaitForStateChange(ctx, st) {
			t.Fatal("the idle connection was not closed by the server")
		}
	}
}

// A connection whose client does not send its request within the read
// deadlines is closed and counted; a keep-alive connection closed for
// idleness, or one answered, is not.
func TestHTTPReadTimeoutsCounted(t *testing.T) {
	tests := []struct {
		name    string
		send    string // then the client sends nothing more
		counted bool
	}{
		{"nothing sent", "", true},
		{"headers trickled", "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ", true},
		{"body short of its length", "POST /v1/lookup HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"model\":", true},
		{"idle after an answer", "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, func(c *Config) {
				c.Limits.HTTPReadHeaderTimeout, c.Limits.HTTPReadTimeout, c.Limits.HTTPIdleTimeout = 100*time.Millisecond, 200*time.Millisecond, 100*time.Millisecond
			})
			lis := serveLimited(t, f)
			c, err := dialFrom("127.0.0.1", lis.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write([]byte(tt.send)); err != nil {
				t.Fatal(err)
			}
			// The server closes the connection: read until it does.
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			if _, err := io.Copy(io.Discard, c); err != nil {
				t.Fatalf("the server did not close the connection: %v", err)
			}
			want := "kvindex_http_read_timeouts_total 0\n"
			if tt.counted {
				want = "kvindex_http_read_timeouts_total 1\n"
			}
			if text := scrape(t, f.url); !strings.Contains(text, want) {
				t.Errorf("want %q:\n%s", want, grepLines(text, "kvindex_http_read"))
			}
		})
	}
}
