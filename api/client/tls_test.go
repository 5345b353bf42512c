package client_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/internal/testcerts"
)

// startTLSServer serves the gRPC health service over TLS on loopback,
// requiring a client certificate of ca when mutual; it returns the address.
func startTLSServer(t *testing.T, ca *testcerts.CA, mutual bool) string {
	t.Helper()
	pair := ca.Server(t, "kvindex")
	cert, err := tls.LoadX509KeyPair(pair.CertFile, pair.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if mutual {
		pool := x509.NewCertPool()
		pem, err := os.ReadFile(ca.CertFile)
		if err != nil {
			t.Fatal(err)
		}
		pool.AppendCertsFromPEM(pem)
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	healthpb.RegisterHealthServer(s, health.NewServer())
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

// startPlainServer serves the gRPC health service in plaintext on
// loopback; it returns the address.
func startPlainServer(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, health.NewServer())
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

// A Dial that fails for want of TLS, or of a client certificate, is
// explained by TLSMismatch, against real servers on loopback; settings
// that fit, or a failure TLS would not fix, are not.
func TestTLSMismatch(t *testing.T) {
	ca := testcerts.NewCA(t, t.TempDir(), "ca")
	router := ca.Client(t, "router")
	plainAddr, tlsAddr, mtlsAddr := startPlainServer(t), startTLSServer(t, ca, false), startTLSServer(t, ca, true)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	withTLS := func(c client.TLSConfig) []grpc.DialOption {
		o, err := client.WithTLS(c)
		if err != nil {
			t.Fatal(err)
		}
		return []grpc.DialOption{o}
	}
	caOnly := withTLS(client.TLSConfig{CAFile: ca.CertFile})
	withCert := withTLS(client.TLSConfig{CAFile: ca.CertFile, CertFile: router.CertFile, KeyFile: router.KeyFile})
	for _, tc := range []struct {
		name            string
		addr            string
		opts            []grpc.DialOption
		useTLS, hasCert bool
		want            error // nil: Dial succeeds, or fails for another reason
		dialOK          bool
	}{
		{"plaintext to plaintext", plainAddr, nil, false, false, nil, true},
		{"plaintext to TLS", tlsAddr, nil, false, false, client.ErrServerSpeaksTLS, false},
		{"plaintext to mutual TLS", mtlsAddr, nil, false, false, client.ErrServerSpeaksTLS, false},
		{"TLS to TLS", tlsAddr, caOnly, true, false, nil, true},
		{"TLS without a certificate to mutual TLS", mtlsAddr, caOnly, true, false, client.ErrClientCertRequired, false},
		{"TLS with a certificate to mutual TLS", mtlsAddr, withCert, true, true, nil, true},
		{"TLS to plaintext", plainAddr, caOnly, true, false, nil, false},
		{"nothing listening", closedAddr, nil, false, false, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := client.Dial(ctx, tc.addr, tc.opts...)
			if (err == nil) != tc.dialOK {
				t.Fatalf("Dial: %v, want success %v", err, tc.dialOK)
			}
			if err == nil {
				c.Close()
			}
			if got := client.TLSMismatch(ctx, tc.addr, tc.useTLS, tc.hasCert); got != tc.want {
				t.Errorf("TLSMismatch: %v, want %v", got, tc.want)
			}
		})
	}
}
