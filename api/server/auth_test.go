package server

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/indexerv1"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/api/server/security"
	"github.com/kvindex/kvindex/api/watchhub"
	"github.com/kvindex/kvindex/internal/testcerts"
	"github.com/kvindex/kvindex/internal/testutil"
)

func sha(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:])
}

// testAuthFile writes an auth file with a token per scope, named after it
// (token "TOKEN-query" has the query scope, ...), and the identities given.
func testAuthFile(t *testing.T, dir, identities string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("tokens:\n")
	for _, sc := range security.Scopes() {
		fmt.Fprintf(&b, "  - name: %s-only\n    sha256: %s\n    scopes: [%s]\n", sc, sha("TOKEN-"+string(sc)), sc)
	}
	b.WriteString(identities)
	p := filepath.Join(dir, "auth.yaml")
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// tokenCall dials s over TLS with token (none if "") and runs one call of
// each gRPC endpoint, returning each call's status code.
func tokenCalls(t *testing.T, s *secureServer, ca, token string) map[string]codes.Code {
	t.Helper()
	opts := []grpc.DialOption{tlsOption(t, client.TLSConfig{CAFile: ca})}
	if token != "" {
		opts = append(opts, client.WithToken(token))
	}
	c, err := s.dial(t, opts...)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	return endpointCalls(t, c, s.hub)
}

// watchCode opens a Watch and returns OK once the hub holds it, or the
// code it was refused with.
func watchCode(t *testing.T, c *client.Client, hub *watchhub.Hub) codes.Code {
	t.Helper()
	before := hub.Open()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Watch(ctx, nil, func(*kvindexv1.WatchResponse) error { return nil }) }()
	var code codes.Code
	testutil.Await(t, awaitBound, "the watch refused or open", func() bool {
		select {
		case err := <-done:
			code = status.Code(err)
			return true
		default:
			return hub.Open() > before
		}
	})
	cancel()
	if code == codes.OK {
		<-done
		testutil.Await(t, awaitBound, "the watch closed", func() bool { return hub.Open() == before })
	}
	return code
}

// endpointCalls calls every gRPC endpoint once.
func endpointCalls(t *testing.T, c *client.Client, hub *watchhub.Hub) map[string]codes.Code {
	t.Helper()
	ctx := context.Background()
	out := map[string]codes.Code{}
	_, err := c.LongestPrefixTokens(ctx, testModel, testutil.Seq(1, 32), nil)
	out["LongestPrefix"] = status.Code(err)
	_, err = c.LookupTokens(ctx, testModel, testutil.Seq(1, 32), nil)
	out["Lookup"] = status.Code(err)
	_, err = c.ListPods(ctx, "")
	out["ListPods"] = status.Code(err)
	_, err = c.HashSamples(ctx, "", nil)
	out["HashSamples"] = status.Code(err)
	_, err = c.Indexer.GetPodScores(ctx, &indexerv1.GetPodScoresRequest{Prompt: "", ModelName: testModel})
	if status.Code(err) == codes.FailedPrecondition { // no tokenizer: past authorization
		err = nil
	}
	out["GetPodScores"] = status.Code(err)
	out["Watch"] = watchCode(t, c, hub)
	_, err = healthpb.NewHealthClient(c.Conn()).Check(ctx, &healthpb.HealthCheckRequest{})
	out["health"] = status.Code(err)
	return out
}

func TestTokenScopes(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "ca")
	sp := ca.Server(t, "kvindex")
	var logs testutil.SyncBuffer
	s := startSecure(t, security.Config{CertFile: sp.CertFile, KeyFile: sp.KeyFile, AuthFile: testAuthFile(t, dir, "")}, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	ok, perm, unauth := codes.OK, codes.PermissionDenied, codes.Unauthenticated
	tests := []struct {
		token string
		want  map[string]codes.Code
	}{
		{"TOKEN-query", map[string]codes.Code{"LongestPrefix": ok, "Lookup": ok, "ListPods": ok, "HashSamples": perm, "GetPodScores": ok, "Watch": perm, "health": ok}},
		{"TOKEN-watch", map[string]codes.Code{"LongestPrefix": perm, "Lookup": perm, "ListPods": perm, "HashSamples": perm, "GetPodScores": perm, "Watch": ok, "health": ok}},
		{"TOKEN-admin", map[string]codes.Code{"LongestPrefix": perm, "Lookup": perm, "ListPods": perm, "HashSamples": ok, "GetPodScores": perm, "Watch": perm, "health": ok}},
		{"wrong-token", map[string]codes.Code{"LongestPrefix": unauth, "Lookup": unauth, "ListPods": unauth, "HashSamples": unauth, "GetPodScores": unauth, "Watch": unauth, "health": ok}},
		{"", map[string]codes.Code{"LongestPrefix": unauth, "Lookup": unauth, "ListPods": unauth, "HashSamples": unauth, "GetPodScores": unauth, "Watch": unauth, "health": ok}},
	}
	for _, tc := range tests {
		t.Run("grpc "+cmp.Or(tc.token, "no token"), func(t *testing.T) {
			got := tokenCalls(t, s, ca.CertFile, tc.token)
			for ep, want := range tc.want {
				if got[ep] != want {
					t.Errorf("%s: %v, want %v", ep, got[ep], want)
				}
			}
		})
	}

	httpTests := []struct {
		path, token string
		want        int
	}{
		{"/v1/pods", "TOKEN-query", 200},
		{"/v1/pods", "TOKEN-watch", 403},
		{"/v1/pods", "", 401},
		{"/v1/pods", "wrong-token", 401},
		{"/metrics", "TOKEN-metrics", 200},
		{"/metrics", "TOKEN-query", 403},
		{"/metrics", "", 401},
		{"/healthz", "", 200},
		{"/readyz", "", 503},
	}
	for _, tc := range httpTests {
		var hdr []string
		if tc.token != "" {
			hdr = []string{"Authorization", "Bearer " + tc.token}
		}
		code, err := s.httpGet(t, client.TLSConfig{CAFile: ca.CertFile}, tc.path, hdr...)
		if err != nil || code != tc.want {
			t.Errorf("GET %s with %q: %d %v, want %d", tc.path, tc.token, code, err, tc.want)
		}
	}

	refused := s.srv.sec.refused
	for _, c := range []struct {
		reason, endpoint string
		want             float64
	}{
		{security.ReasonScope, "Watch", 2}, // query-only and admin-only tokens
		{security.ReasonBadToken, "Watch", 1},
		{security.ReasonNoCredentials, "Watch", 1},
		{security.ReasonScope, "LongestPrefix", 2},
		{security.ReasonScope, "/v1/pods", 1},
		{security.ReasonNoCredentials, "/metrics", 1},
	} {
		if n := counterValue(t, refused.WithLabelValues(c.reason, c.endpoint)); n != c.want {
			t.Errorf("kvindex_auth_refused_total{reason=%q,endpoint=%q} = %v, want %v", c.reason, c.endpoint, n, c.want)
		}
	}
	out := logs.String()
	if strings.Contains(out, "TOKEN-") || strings.Contains(out, "wrong-token") {
		t.Errorf("a token reached the logs:\n%s", out)
	}
	for _, want := range []string{`caller="token query-only"`, `reason=scope`, `caller="token sha256:` + sha("wrong-token")[:8], `remote=127.0.0.1:`} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %q:\n%s", want, out)
		}
	}
}

// Certificates carry scopes through the auth file's identities; with a
// client CA and no auth file, every certificate of the CA may do
// everything.
func TestIdentityScopes(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "ca")
	sp := ca.Server(t, "kvindex")
	auth := testAuthFile(t, dir, `identities:
  - name: router
    uri: spiffe://test/router
    scopes: [query]
  - name: tail
    dns: tail.kvindex.test
    scopes: [watch]
`)
	certs := map[string]testcerts.Pair{
		"router":   ca.Issue(t, "router", testcerts.Leaf{CN: "x", URIs: []string{"spiffe://test/router"}, Client: true}),
		"tail":     ca.Issue(t, "tail", testcerts.Leaf{CN: "y", DNS: []string{"tail.kvindex.test"}, Client: true}),
		"stranger": ca.Client(t, "stranger"),
	}
	withFile := startSecure(t, security.Config{CertFile: sp.CertFile, KeyFile: sp.KeyFile, ClientCAFile: ca.CertFile, AuthFile: auth}, nil)
	caOnly := startSecure(t, security.Config{CertFile: sp.CertFile, KeyFile: sp.KeyFile, ClientCAFile: ca.CertFile}, nil)
	ok, perm, unauth := codes.OK, codes.PermissionDenied, codes.Unauthenticated
	tests := []struct {
		name   string
		s      *secureServer
		cert   string
		token  string
		lookup codes.Code
		watch  codes.Code
	}{
		{"query identity", withFile, "router", "", ok, perm},
		{"watch identity", withFile, "tail", "", perm, ok},
		{"unlisted identity", withFile, "stranger", "", perm, perm},
		{"token decides over the certificate", withFile, "router", "TOKEN-watch", perm, ok},
		{"CA alone: any certificate", caOnly, "stranger", "", ok, ok},
		{"CA alone: tokens refused", caOnly, "stranger", "TOKEN-query", unauth, unauth},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := certs[tc.cert]
			opts := []grpc.DialOption{tlsOption(t, client.TLSConfig{CAFile: ca.CertFile, CertFile: p.CertFile, KeyFile: p.KeyFile})}
			if tc.token != "" {
				opts = append(opts, client.WithToken(tc.token))
			}
			c, err := tc.s.dial(t, opts...)
			if err != nil {
				t.Fatal(err)
			}
			got := endpointCalls(t, c, tc.s.hub)
			if got["Lookup"] != tc.lookup || got["Watch"] != tc.watch {
				t.Errorf("Lookup %v, Watch %v; want %v, %v", got["Lookup"], got["Watch"], tc.lookup, tc.watch)
			}
		})
	}
}

// The admin listener's profiles need the admin scope; its probes stay
// open, without a client certificate even where the API ports require
// one.
func TestAdminScope(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "ca")
	sp := ca.Server(t, "kvindex")
	s := startSecure(t, security.Config{CertFile: sp.CertFile, KeyFile: sp.KeyFile, ClientCAFile: ca.CertFile, AuthFile: testAuthFile(t, dir, "")}, nil)
	h := s.srv.AdminHandler()
	tests := []struct {
		path, token string
		want        int
	}{
		{"/debug/pprof/", "TOKEN-admin", 200},
		{"/debug/pprof/cmdline", "TOKEN-admin", 200},
		{"/debug/pprof/", "TOKEN-query", 403},
		{"/debug/pprof/", "", 401},
		{"/metrics", "TOKEN-metrics", 200},
		{"/healthz", "", 200},
	}
	for _, tc := range tests {
		rec := &responseRecorder{header: http.Header{}}
		req, _ := http.NewRequest(http.MethodGet, tc.path, nil)
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		h.ServeHTTP(rec, req)
		if rec.code == 0 {
			rec.code = 200
		}
		if rec.code != tc.want {
			t.Errorf("admin %s with %q: %d, want %d", tc.path, tc.token, rec.code, tc.want)
		}
		if tc.want == 401 && !strings.HasPrefix(rec.header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("401 without WWW-Authenticate: %v", rec.header)
		}
	}
	if s.srv.AdminTLSConfig() == nil {
		t.Fatal("no admin TLS configuration")
	}
}

// Every method of kvindex's services has a scope: a new RPC is refused to
// everyone until it is given one, rather than open.
func TestEveryMethodHasAScope(t *testing.T) {
	for _, sd := range []grpc.ServiceDesc{kvindexv1.IndexService_ServiceDesc, indexerv1.IndexerService_ServiceDesc} {
		for _, m := range sd.Methods {
			if _, ok := endpointScopes["/"+sd.ServiceName+"/"+m.MethodName]; !ok {
				t.Errorf("%s/%s has no scope", sd.ServiceName, m.MethodName)
			}
		}
		for _, m := range sd.Streams {
			if _, ok := endpointScopes["/"+sd.ServiceName+"/"+m.StreamName]; !ok {
				t.Errorf("%s/%s has no scope", sd.ServiceName, m.StreamName)
			}
		}
	}
	if _, open := grpcScope("/kvindex.v1.IndexService/Future"); open {
		t.Error("an unknown method of IndexService is open")
	}
	if _, open := grpcScope("/grpc.health.v1.Health/Check"); !open {
		t.Error("health is not open")
	}
}

// A token removed from the file is refused from the next check on; a
// broken file keeps the version loaded before.
func TestAuthFileReload(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "ca")
	sp := ca.Server(t, "kvindex")
	auth := testAuthFile(t, dir, "")
	s := startSecure(t, security.Config{CertFile: sp.CertFile, KeyFile: sp.KeyFile, AuthFile: auth}, nil)
	lookup := func(token string) codes.Code {
		return tokenCalls(t, s, ca.CertFile, token)["Lookup"]
	}
	if got := lookup("TOKEN-query"); got != codes.OK {
		t.Fatalf("before: %v", got)
	}
	write := func(content string) {
		if err := os.WriteFile(auth, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		testcerts.Touch(t, auth)
	}
	write("tokens:\n  - name: new\n    sha256: " + sha("TOKEN-new") + "\n    scopes: [query]\n")
	if got := lookup("TOKEN-query"); got != codes.Unauthenticated {
		t.Errorf("a removed token: %v", got)
	}
	if got := lookup("TOKEN-new"); got != codes.OK {
		t.Errorf("an added token: %v", got)
	}
	write("tokens: [oops\n")
	if got := lookup("TOKEN-new"); got != codes.OK {
		t.Errorf("after a broken file: %v", got)
	}
	reloads := s.srv.sec.reloads
	if ok, bad := counterValue(t, reloads.WithLabelValues("auth", "ok")), counterValue(t, reloads.WithLabelValues("auth", "error")); ok != 1 || bad != 1 {
		t.Errorf("auth reloads ok %v, error %v; want 1, 1", ok, bad)
	}
}
