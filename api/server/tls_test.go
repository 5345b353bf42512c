package server

import (
	"context"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/server/security"
	"github.com/kvindex/kvindex/api/watchhub"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/testcerts"
)

// secureServer is a server on real loopback listeners, gRPC and HTTP,
// served as kvindex serve serves them (NewGRPCServer, LimitListener).
type secureServer struct {
	srv      *Server
	hub      *watchhub.Hub
	grpcAddr string
	httpURL  string
}

func startSecure(t *testing.T, sec security.Config, edit func(*Config)) *secureServer {
	t.Helper()
	ix, err := indexer.New(indexer.Options{Hasher: testHasher})
	if err != nil {
		t.Fatal(err)
	}
	hub := watchhub.New(ix, watchhub.Limits{})
	sec.ReloadCheck = time.Nanosecond // every handshake looks at the files
	cfg := Config{Index: ix, BlockSize: testBlockSize, Hub: hub, DefaultModel: testModel, ReadyGrace: -1, Security: sec}
	if edit != nil {
		edit(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	glis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := srv.NewGRPCServer()
	hs := srv.NewHTTPServer(HTTPOptions{})
	go gs.Serve(glis)
	go hs.Serve(srv.LimitListener(hlis))
	t.Cleanup(func() {
		srv.Shutdown()
		gs.Stop()
		hs.Close()
	})
	scheme := "http://"
	if sec.TLS() {
		scheme = "https://"
	}
	return &secureServer{srv: srv, hub: hub, grpcAddr: glis.Addr().String(), httpURL: scheme + hlis.Addr().String()}
}

// dial connects a client with opts; the error is Dial's.
func (s *secureServer) dial(t *testing.T, opts ...grpc.DialOption) (*client.Client, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, s.grpcAddr, opts...)
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

func tlsOption(t *testing.T, c client.TLSConfig) grpc.DialOption {
	t.Helper()
	o, err := client.WithTLS(c)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// httpGet fetches path on a new connection (so each request handshakes).
func (s *secureServer) httpGet(t *testing.T, c client.TLSConfig, path string, header ...string) (int, error) {
	t.Helper()
	cfg, err := c.Config()
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}, Timeout: 10 * time.Second}
	req, err := http.NewRequest(http.MethodGet, s.httpURL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

func TestTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "ca")
	other := testcerts.NewCA(t, dir, "other")
	sp := ca.Server(t, "kvindex")
	s := startSecure(t, security.Config{CertFile: sp.CertFile, KeyFile: sp.KeyFile}, nil)

	tests := []struct {
		name string
		opts []grpc.DialOption
		ok   bool
	}{
		{"trusted CA", []grpc.DialOption{tlsOption(t, client.TLSConfig{CAFile: ca.CertFile})}, true},
		{"server name given", []grpc.DialOption{tlsOption(t, client.TLSConfig{CAFile: ca.CertFile, ServerName: "localhost"})}, true},
		{"wrong server name", []grpc.DialOption{tlsOption(t, client.TLSConfig{CAFile: ca.CertFile, ServerName: "elsewhere"})}, false},
		{"untrusted CA", []grpc.DialOption{tlsOption(t, client.TLSConfig{CAFile: other.CertFile})}, false},
		{"plaintext", nil, false},
	}
	for _, tc := range tests {
		t.Run("grpc "+tc.name, func(t *testing.T) {
			c, err := s.dial(t, tc.opts...)
			if (err == nil) != tc.ok {
				t.Fatalf("dial: %v, want ok=%v", err, tc.ok)
			}
			if err == nil {
				if _, err := c.ListPods(context.Background(), ""); err != nil {
					t.Errorf("ListPods over TLS: %v", err)
				}
			}
		})
	}
	if code, err := s.httpGet(t, client.TLSConfig{CAFile: ca.CertFile}, "/healthz"); err != nil || code != 200 {
		t.Errorf("HTTPS /healthz: %d %v", code, err)
	}
	if _, err := s.httpGet(t, client.TLSConfig{CAFile: other.CertFile}, "/healthz"); err == nil {
		t.Error("HTTPS with an untrusted CA succeeded")
	}
	resp, err := http.Get(strings.Replace(s.httpURL, "https://", "http://", 1) + "/healthz")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Error("plaintext HTTP was answered by the TLS listener")
		}
	}
}

func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "ca")
	rogue := testcerts.NewCA(t, dir, "rogue")
	sp := ca.Server(t, "kvindex")
	s := startSecure(t, security.Config{CertFile: sp.CertFile, KeyFile: sp.KeyFile, ClientCAFile: ca.CertFile}, nil)
	good := ca.Client(t, "router")
	bad := rogue.Issue(t, "rogue-router", testcerts.Leaf{CN: "router", Client: true})

	tests := []struct {
		name string
		cfg  client.TLSConfig
		ok   bool
	}{
		{"client certificate", client.TLSConfig{CAFile: ca.CertFile, CertFile: good.CertFile, KeyFile: good.KeyFile}, true},
		{"no client certificate", client.TLSConfig{CAFile: ca.CertFile}, false},
		{"certificate of another CA", client.TLSConfig{CAFile: ca.CertFile, CertFile: bad.CertFile, KeyFile: bad.KeyFile}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := s.dial(t, tlsOption(t, tc.cfg))
			if (err == nil) != tc.ok {
				t.Fatalf("gRPC dial: %v, want ok=%v", err, tc.ok)
			}
			if err == nil {
				if _, err := c.ListPods(context.Background(), ""); err != nil {
					t.Errorf("ListPods: %v", err)
				}
			}
			code, err := s.httpGet(t, tc.cfg, "/healthz")
			if (err == nil && code == 200) != tc.ok {
				t.Errorf("HTTPS /healthz: %d %v, want ok=%v", code, err, tc.ok)
			}
		})
	}
}

// A rotated certificate is served from the next handshake on; a broken
// one is refused (logged, counted) and the one loaded before stays.
func TestTLSReload(t *testing.T) {
	dir := t.TempDir()
	ca1 := testcerts.NewCA(t, dir, "ca1")
	ca2 := testcerts.NewCA(t, dir, "ca2")
	live := ca1.Server(t, "live")
	s := startSecure(t, security.Config{CertFile: live.CertFile, KeyFile: live.KeyFile}, nil)
	trusts := func(ca *testcerts.CA) bool {
		_, err := s.httpGet(t, client.TLSConfig{CAFile: ca.CertFile}, "/healthz")
		return err == nil
	}
	if !trusts(ca1) || trusts(ca2) {
		t.Fatal("before the rotation the server should present ca1's certificate")
	}

	testcerts.Install(t, ca2.Server(t, "next"), live)
	if trusts(ca1) || !trusts(ca2) {
		t.Fatal("after the rotation the server should present ca2's certificate")
	}
	if _, err := s.dial(t, tlsOption(t, client.TLSConfig{CAFile: ca2.CertFile})); err != nil {
		t.Errorf("gRPC after the rotation: %v", err)
	}
	reloads := s.srv.sec.reloads
	if n := counterValue(t, reloads.WithLabelValues("tls", "ok")); n != 1 {
		t.Errorf("ok reloads = %v, want 1", n)
	}

	// A key that does not belong to the certificate.
	if err := os.WriteFile(live.KeyFile, mustRead(t, ca1.Server(t, "stray").KeyFile), 0o600); err != nil {
		t.Fatal(err)
	}
	testcerts.Touch(t, live.KeyFile)
	if !trusts(ca2) {
		t.Error("a broken rotation replaced the working certificate")
	}
	if n := counterValue(t, reloads.WithLabelValues("tls", "error")); n != 1 {
		t.Errorf("failed reloads = %v, want 1", n)
	}
}

// counterValue reads one counter.
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Files that are missing or do not match stop New with the setting named.
func TestSecurityConfigErrors(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "ca")
	sp := ca.Server(t, "kvindex")
	tests := []struct {
		name string
		sec  security.Config
		want string
	}{
		{"cert without key", security.Config{CertFile: sp.CertFile}, "CertFile and KeyFile go together"},
		{"client CA without cert", security.Config{ClientCAFile: ca.CertFile}, "ClientCAFile needs CertFile"},
		{"missing cert", security.Config{CertFile: dir + "/none.pem", KeyFile: sp.KeyFile}, "no such file"},
		{"key of another cert", security.Config{CertFile: sp.CertFile, KeyFile: ca.Server(t, "x").KeyFile}, "private key does not match"},
		{"client CA not PEM", security.Config{CertFile: sp.CertFile, KeyFile: sp.KeyFile, ClientCAFile: sp.KeyFile}, "no PEM certificate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ix, _ := indexer.New(indexer.Options{Hasher: testHasher})
			_, err := New(Config{Index: ix, BlockSize: testBlockSize, Security: tc.sec})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
