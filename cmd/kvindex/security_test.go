package main

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/internal/testcerts"
	"github.com/kvindex/kvindex/internal/testutil"
)

// pki is a CA with a server certificate for loopback and client
// certificates, in a test's temporary directory.
type pki struct {
	ca     *testcerts.CA
	server testcerts.Pair
	dir    string
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "ca")
	return &pki{ca: ca, server: ca.Server(t, "kvindex"), dir: dir}
}

// dialTLS is the Go client's TLS option for c.
func dialTLS(t *testing.T, c client.TLSConfig) grpc.DialOption {
	t.Helper()
	o, err := client.WithTLS(c)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// serve under mutual TLS; the Go client and the CLI reach it with a client
// certificate, and are refused without one; the CLI's TLS flags are also
// read from KVINDEX_* variables.
func TestE2EMutualTLS(t *testing.T) {
	p := newPKI(t)
	router := p.ca.Client(t, "router")
	x := startE2EDial(t,
		[]grpc.DialOption{dialTLS(t, client.TLSConfig{CAFile: p.ca.CertFile, CertFile: router.CertFile, KeyFile: router.KeyFile})},
		[]string{"pod-a"},
		"--tls-cert", p.server.CertFile, "--tls-key", p.server.KeyFile, "--tls-client-ca", p.ca.CertFile)
	if !strings.Contains(x.logs.String(), "tls=\"mutual TLS\"") {
		t.Errorf("serve did not log its TLS mode:\n%s", x.logs.String())
	}
	addr := x.svc.GRPCAddr()
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		code  int
		inOut string // in stdout (success) or stderr (failure)
	}{
		{"client certificate", []string{"--tls-ca", p.ca.CertFile, "--tls-cert", router.CertFile, "--tls-key", router.KeyFile}, nil, exitOK, "pod-a"},
		{"from the environment", nil, map[string]string{"KVINDEX_TLS_CA": p.ca.CertFile, "KVINDEX_TLS_CERT": router.CertFile, "KVINDEX_TLS_KEY": router.KeyFile}, exitOK, "pod-a"},
		{"server name", []string{"--tls-ca", p.ca.CertFile, "--tls-cert", router.CertFile, "--tls-key", router.KeyFile, "--tls-server-name", "localhost"}, nil, exitOK, "pod-a"},
		{"https scheme and CA", []string{"--server", "https://" + addr, "--tls-ca", p.ca.CertFile, "--tls-cert", router.CertFile, "--tls-key", router.KeyFile}, nil, exitOK, "pod-a"},
		{"no client certificate", []string{"--tls-ca", p.ca.CertFile}, nil, exitRuntime, "cannot reach kvindex at " + addr + ": the server requires a client certificate: add --tls-cert and --tls-key\n"},
		{"plaintext", nil, nil, exitRuntime, "cannot reach kvindex at " + addr + ": the server speaks TLS: add --tls-ca FILE"},
		{"certificate without key", []string{"--tls-ca", p.ca.CertFile, "--tls-cert", router.CertFile}, nil, exitUsage, "--tls-cert and --tls-key go together"},
		{"token without TLS", []string{"--token-file", router.KeyFile}, nil, exitUsage, "--token-file: a bearer token is sent over TLS only"},
		{"missing CA file", []string{"--tls-ca", p.dir + "/none.pem"}, nil, exitUsage, "no such file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			args := append([]string{"pods", "--server", addr, "--timeout", "5s"}, tc.args...)
			out, errOut, code := runCLI(t, args...)
			text := out
			if tc.code != exitOK {
				text = errOut
			}
			if code != tc.code || !strings.Contains(text, tc.inOut) {
				t.Errorf("exit %d (want %d)\nstdout: %s\nstderr: %s\nwant %q", code, tc.code, out, errOut, tc.inOut)
			}
		})
	}
}

// Go profiles are served on --admin-addr only; --pprof says where they
// went.
func TestE2EAdminListener(t *testing.T) {
	t.Parallel() // its own service and engines on free ports
	x := startE2E(t, []string{"pod-a"}, "--admin-addr", "127.0.0.1:0")
	admin := "http://" + x.svc.AdminAddr()
	tests := []struct {
		url  string
		want int
	}{
		{admin + "/debug/pprof/", http.StatusOK},
		{admin + "/metrics", http.StatusOK},
		{admin + "/readyz", http.StatusOK},
		{admin + "/v1/pods", http.StatusNotFound},
		{"http://" + x.svc.HTTPAddr() + "/debug/pprof/", http.StatusNotFound},
	}
	for _, tc := range tests {
		resp, err := http.Get(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("GET %s: %d, want %d", tc.url, resp.StatusCode, tc.want)
		}
	}

	_, errOut, code := runCLI(t, "serve", "--engine", "a=tcp://127.0.0.1:5557", "--model", "m", "--pprof")
	if code != exitUsage || !strings.Contains(errOut, "--pprof was removed") || !strings.Contains(errOut, "--admin-addr") {
		t.Errorf("--pprof: exit %d, %q", code, errOut)
	}
}

// writeToken writes a token file and returns its path and the auth-file
// line of its hash.
func writeToken(t *testing.T, dir, name, token string) string {
	t.Helper()
	p := filepath.Join(dir, name+".token")
	if err := os.WriteFile(p, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// writeAuthFile writes an --auth-tokens file into dir: the tokens
// "query-secret" (name gateway, scope query) and "watch-secret" (tailer,
// watch), then the YAML list entries of more.
func writeAuthFile(t *testing.T, dir, more string) string {
	t.Helper()
	auth := filepath.Join(dir, "auth.yaml")
	if err := os.WriteFile(auth, []byte("tokens:\n"+`  - name: gateway
    sha256: `+tokenSHA("query-secret")+`
    scopes: [query]
  - name: tailer
    sha256: `+tokenSHA("watch-secret")+`
    scopes: [watch]
`+more), 0o600); err != nil {
		t.Fatal(err)
	}
	return auth
}

func tokenSHA(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// serve --auth-tokens: the CLI's --token-file carries a token's scopes;
// tail without the watch scope and query with a watch-only token are
// refused, saying which scope is missing, and counted.
func TestE2ETokens(t *testing.T) {
	t.Parallel() // its own service and engines on free ports
	p := newPKI(t)
	auth := writeAuthFile(t, p.dir, `  - name: tenant-a
    sha256: `+tokenSHA("tenant-secret")+`
    scopes: [query, watch]
    salts: [salt-a]
`)
	queryTok := writeToken(t, p.dir, "query", "query-secret")
	watchTok := writeToken(t, p.dir, "watch", "watch-secret")
	tenantTok := writeToken(t, p.dir, "tenant", "tenant-secret")
	x := startE2EDial(t,
		[]grpc.DialOption{dialTLS(t, client.TLSConfig{CAFile: p.ca.CertFile}), client.WithToken("query-secret")},
		[]string{"pod-a"},
		"--tls-cert", p.server.CertFile, "--tls-key", p.server.KeyFile, "--auth-tokens", auth)
	addr := x.svc.GRPCAddr()
	tests := []struct {
		name  string
		args  []string
		code  int
		inOut string
	}{
		{"pods with the query token", []string{"pods", "--token-file", queryTok}, exitOK, "pod-a"},
		{"query with the query token", []string{"query", "--tokens", idsArg(testutil.Seq(1, 32)), "--token-file", queryTok}, exitOK, "pod-a"},
		{"query with the watch token", []string{"query", "--tokens", idsArg(testutil.Seq(1, 32)), "--token-file", watchTok}, exitRuntime, "token tailer lacks the query scope that LongestPrefix needs (PermissionDenied)"},
		{"tail with the query token", []string{"tail", "--token-file", queryTok}, exitRuntime, "token gateway lacks the watch scope that Watch needs (PermissionDenied)"},
		{"pods without a token", []string{"pods"}, exitRuntime, "needs credentials"},
		{"tenant with its salt", []string{"query", "--tokens", idsArg(testutil.Seq(1, 32)), "--cache-salt", "salt-a", "--token-file", tenantTok}, exitOK, "pod-a"},
		{"tenant without its salt", []string{"lookup", "--tokens", idsArg(testutil.Seq(1, 32)), "--token-file", tenantTok}, exitRuntime, `token tenant-a may not query cache_salt "" (none) (PermissionDenied)`},
		{"tenant tails", []string{"tail", "--token-file", tenantTok}, exitRuntime, "restricted to cache salts and cannot Watch"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := append(tc.args, "--server", addr, "--tls-ca", p.ca.CertFile, "--timeout", "10s")
			out, errOut, code := runCLI(t, args...)
			text := out
			if tc.code != exitOK {
				text = errOut
			}
			if code != tc.code || !strings.Contains(text, tc.inOut) {
				t.Errorf("exit %d (want %d)\nstdout: %s\nstderr: %s\nwant %q", code, tc.code, out, errOut, tc.inOut)
			}
		})
	}
	if logs := x.logs.String(); !strings.Contains(logs, `caller="token tailer"`) || strings.Contains(logs, "secret") {
		t.Errorf("refusals should be logged with the token's name, never the token:\n%s", logs)
	}
}

// serve's security settings: a bad combination is a usage error, a file
// that cannot be loaded stops serve; both name the flags.
func TestServeSecurityFlagErrors(t *testing.T) {
	p := newPKI(t)
	auth := writeFile(t, "auth.yaml", "tokens: []\n")
	base := []string{"serve", "--check", "--listen", "tcp://*:1", "--engine-allow", "*=127.0.0.1"}
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--tls-cert", p.server.CertFile}, exitUsage,
			"kvindex: --tls-cert and --tls-key go together: give both or neither (see 'kvindex serve --help')\n"},
		{[]string{"--tls-client-ca", p.ca.CertFile}, exitUsage,
			"kvindex: --tls-client-ca needs --tls-cert and --tls-key: client certificates are asked for in a TLS handshake (see 'kvindex serve --help')\n"},
		{[]string{"--auth-tokens", auth}, exitRuntime,
			"kvindex: server: --auth-tokens " + auth + ": no tokens and no identities: list at least one\n"},
		{[]string{"--tls-cert", auth, "--tls-key", p.server.KeyFile}, exitRuntime,
			"kvindex: server: --tls-cert " + auth + " / --tls-key " + p.server.KeyFile + ": tls: failed to find any PEM data in certificate input\n"},
		{[]string{"--tls-cert", p.server.CertFile, "--tls-key", p.server.KeyFile, "--tls-client-ca", auth}, exitRuntime,
			"kvindex: server: --tls-client-ca " + auth + ": no PEM certificate in it\n"},
	}
	for _, tc := range tests {
		_, stderr, code := runCLI(t, append(base, tc.args...)...)
		if code != tc.code || stderr != tc.want {
			t.Errorf("%v: exit %d, stderr %q; want exit %d, %q", tc.args, code, stderr, tc.code, tc.want)
		}
	}
}
