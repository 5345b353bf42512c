package server

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/hex"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/indexerv1"
	"github.com/kvindex/kvindex/api/kvindexv1"
)

// endpointScopes is the scope each gRPC method of kvindex's APIs needs.
// A method of those services missing here is refused to everyone
// (authorizeGRPC), so that a new RPC is never open by omission; health
// and reflection are open.
var endpointScopes = map[string]Scope{
	kvindexv1.IndexService_LongestPrefix_FullMethodName:  ScopeQuery,
	kvindexv1.IndexService_Lookup_FullMethodName:         ScopeQuery,
	kvindexv1.IndexService_ListPods_FullMethodName:       ScopeQuery,
	kvindexv1.IndexService_Watch_FullMethodName:          ScopeWatch,
	indexerv1.IndexerService_GetPodScores_FullMethodName: ScopeQuery,
}

// guardedServices are the services whose methods need a scope.
var guardedServices = []string{kvindexv1.IndexService_ServiceDesc.ServiceName, indexerv1.IndexerService_ServiceDesc.ServiceName}

// Refusal reasons, the reason label of kvindex_auth_refused_total.
const (
	reasonNoCredentials   = "no_credentials"   // neither a token nor a client certificate
	reasonBadToken        = "bad_token"        // a token that is malformed or not in the auth file
	reasonUnknownIdentity = "unknown_identity" // a client certificate the auth file does not list
	reasonScope           = "scope"            // the caller lacks the endpoint's scope
	reasonTenant          = "tenant"           // the request reaches beyond the caller's salts or LoRAs
)

// authMode is how a server decides who may call.
type authMode uint8

const (
	authOff      authMode = iota // no auth file, no client CA: everyone may do everything
	authCertOnly                 // client CA, no auth file: every verified certificate may do everything
	authFile                     // the auth file decides
)

// credential is what a caller presented.
type credential struct {
	token    string // "" if none
	hasToken bool   // an authorization header was sent (even a malformed one)
	cert     *x509.Certificate
	remote   string
}

// callInfo is the authorized caller of a request, in its context, for the
// checks made later (tenants) and their logs.
type callInfo struct {
	g        *grant // nil: unrestricted (authorization off)
	endpoint string
	remote   string
}

type callInfoKey struct{}

func callInfoOf(ctx context.Context) *callInfo {
	ci, _ := ctx.Value(callInfoKey{}).(*callInfo)
	return ci
}

// everything is the grant of every caller when the server authorizes by
// certificate alone.
var everything = map[Scope]bool{ScopeQuery: true, ScopeWatch: true, ScopeMetrics: true, ScopeAdmin: true}

// authorize decides whether cred may use endpoint, which needs need. It
// returns the caller's grant (nil when authorization is off), or the
// refusal, already counted and logged.
func (s *Server) authorize(cred *credential, endpoint string, need Scope) (*grant, error) {
	switch s.authMode {
	case authOff:
		return nil, nil
	case authCertOnly:
		if cred.hasToken {
			return nil, s.refuse(cred, "", endpoint, reasonBadToken, codes.Unauthenticated,
				"this kvindex accepts client certificates only (it has no --auth-tokens); do not send a bearer token")
		}
		if cred.cert == nil {
			return nil, s.refuse(cred, "", endpoint, reasonNoCredentials, codes.Unauthenticated,
				"this endpoint needs a client certificate signed by kvindex's --tls-client-ca")
		}
		return &grant{name: "certificate " + certName(cred.cert), scopes: everything}, nil
	}
	pol := s.auth.get()
	var g *grant
	switch {
	case cred.hasToken:
		if g = pol.token(cred.token); g == nil {
			return nil, s.refuse(cred, tokenFingerprint(cred.token), endpoint, reasonBadToken, codes.Unauthenticated,
				"the bearer token is not valid for this kvindex (send \"authorization: Bearer TOKEN\" with a token of its --auth-tokens file)")
		}
	case cred.cert != nil:
		if g = pol.identity(cred.cert); g == nil {
			return nil, s.refuse(cred, "certificate "+certName(cred.cert), endpoint, reasonUnknownIdentity, codes.PermissionDenied,
				"the client certificate "+certName(cred.cert)+" has no entry in kvindex's --auth-tokens file")
		}
	default:
		return nil, s.refuse(cred, "", endpoint, reasonNoCredentials, codes.Unauthenticated,
			"this endpoint needs credentials: a bearer token (authorization: Bearer TOKEN) or a client certificate")
	}
	if !g.has(need) {
		return nil, s.refuse(cred, g.name, endpoint, reasonScope, codes.PermissionDenied,
			g.name+" lacks the "+string(need)+" scope that "+endpoint+" needs")
	}
	return g, nil
}

// refuse counts and logs a refusal and returns its status. who names the
// caller as far as known (never the token itself: a bad token is logged by
// a fingerprint of its hash).
func (s *Server) refuse(cred *credential, who, endpoint, reason string, code codes.Code, msg string) error {
	s.sec.refused.WithLabelValues(reason, endpoint).Inc()
	if who == "" && cred.cert != nil {
		who = "certificate " + certName(cred.cert)
	}
	s.log.Warn("request refused", "endpoint", endpoint, "reason", reason, "remote", cred.remote, "caller", cmp.Or(who, "anonymous"))
	return status.Error(code, msg)
}

// tokenFingerprint names an unknown token in logs without revealing it:
// the first 8 hex digits of its SHA-256, which an operator can compare
// with the sha256 column of the auth file.
func tokenFingerprint(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return "token sha256:" + hex.EncodeToString(sum[:4])
}

// token returns the grant of a token. Every entry is compared, in
// constant time, whatever matches: how long the check takes says nothing
// about which entry, or how much of one, matched.
func (p *policy) token(tok string) *grant {
	sum := sha256.Sum256([]byte(tok))
	var g *grant
	for i := range p.tokens {
		if subtle.ConstantTimeCompare(sum[:], p.tokens[i].sum[:]) == 1 {
			g = p.tokens[i].g
		}
	}
	return g
}

// identity returns the grant of the first identity entry matching the
// certificate: its subject common name, or one of its DNS or URI names.
func (p *policy) identity(c *x509.Certificate) *grant {
	for _, e := range p.identities {
		switch {
		case e.cn != "" && c.Subject.CommonName == e.cn,
			e.dns != "" && slices.Contains(c.DNSNames, e.dns),
			e.uri != "" && slices.ContainsFunc(c.URIs, func(u *url.URL) bool { return u.String() == e.uri }):
			return e.g
		}
	}
	return nil
}

// certName names a certificate in logs and messages: its URI, DNS name or
// common name, the first it has.
func certName(c *x509.Certificate) string {
	switch {
	case len(c.URIs) > 0:
		return "uri=" + c.URIs[0].String()
	case len(c.DNSNames) > 0:
		return "dns=" + c.DNSNames[0]
	}
	return "cn=" + c.Subject.CommonName
}

// bearer parses an authorization header value.
func bearer(v string) (string, bool) {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(v), " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// grpcCredential reads what a gRPC caller presented.
func grpcCredential(ctx context.Context) *credential {
	cred := &credential{}
	if p, ok := peer.FromContext(ctx); ok {
		if p.Addr != nil {
			cred.remote = p.Addr.String()
		}
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			cred.cert = verifiedLeaf(ti.State.VerifiedChains)
		}
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if vals := md.Get("authorization"); len(vals) > 0 {
			cred.hasToken = true
			cred.token, _ = bearer(vals[0])
		}
	}
	return cred
}

// httpCredential reads what an HTTP caller presented.
func httpCredential(r *http.Request) *credential {
	cred := &credential{remote: r.RemoteAddr}
	if r.TLS != nil {
		cred.cert = verifiedLeaf(r.TLS.VerifiedChains)
	}
	if v := r.Header.Get("Authorization"); v != "" {
		cred.hasToken = true
		cred.token, _ = bearer(v)
	}
	return cred
}

// verifiedLeaf is the client's certificate if its chain was verified.
func verifiedLeaf(chains [][]*x509.Certificate) *x509.Certificate {
	if len(chains) == 0 || len(chains[0]) == 0 {
		return nil
	}
	return chains[0][0]
}

// grpcScope returns the scope a gRPC method needs; open is true for
// methods outside kvindex's APIs (health, reflection).
func grpcScope(full string) (scope Scope, open bool) {
	if s, ok := endpointScopes[full]; ok {
		return s, false
	}
	for _, svc := range guardedServices {
		if strings.HasPrefix(full, "/"+svc+"/") {
			return "", false
		}
	}
	return "", true
}

// authorizeGRPC authorizes a gRPC call and returns its context carrying
// the caller.
func (s *Server) authorizeGRPC(ctx context.Context, full string) (context.Context, error) {
	if s.authMode == authOff {
		return ctx, nil
	}
	scope, open := grpcScope(full)
	if open {
		return ctx, nil
	}
	cred := grpcCredential(ctx)
	endpoint := shortMethod(full)
	if scope == "" {
		return nil, s.refuse(cred, "", endpoint, reasonScope, codes.PermissionDenied, endpoint+" is not open to any caller")
	}
	g, err := s.authorize(cred, endpoint, scope)
	if err != nil {
		return nil, err
	}
	return context.WithValue(ctx, callInfoKey{}, &callInfo{g: g, endpoint: endpoint, remote: cred.remote}), nil
}

func (s *Server) authUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, err := s.authorizeGRPC(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (s *Server) authStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, err := s.authorizeGRPC(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	return handler(srv, &authedStream{ServerStream: ss, ctx: ctx})
}

// authedStream is a stream whose context carries the caller.
type authedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (a *authedStream) Context() context.Context { return a.ctx }

// Guard makes h need scope, as kvindex's own endpoints do (nothing with
// authorization off); endpoint names it in metrics and logs. It lets a
// handler served beside the API (the in-process picker's /v1/pick) take
// the same callers.
func (s *Server) Guard(scope Scope, endpoint string, h http.Handler) http.Handler {
	return s.guard(scope, endpoint, h)
}

// guard makes h need scope; endpoint names it in metrics and logs.
func (s *Server) guard(scope Scope, endpoint string, h http.Handler) http.Handler {
	if s.authMode == authOff {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cred := httpCredential(r)
		g, err := s.authorize(cred, endpoint, scope)
		if err != nil {
			if status.Code(err) == codes.Unauthenticated {
				w.Header().Set("WWW-Authenticate", `Bearer realm="kvindex"`)
			}
			writeStatus(w, err)
			return
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callInfoKey{}, &callInfo{g: g, endpoint: endpoint, remote: cred.remote})))
	})
}

// checkTenant refuses a prompt that reaches beyond the caller's cache
// salts or LoRA adapters. The index cannot tell a block's salt or adapter
// (it stores hashes), but it need not: both are hashed into the prompt's
// block keys (the salt into the first block, which every later block
// chains from; the adapter into every block), so a prompt whose salt and
// adapter the caller may use can only match blocks of that salt and
// adapter. Block hashes computed by the caller carry no salt or adapter
// kvindex could check, so a restricted caller cannot query by them.
func (s *Server) checkTenant(ctx context.Context, p *kvindexv1.Prompt) error {
	ci := callInfoOf(ctx)
	if ci == nil || ci.g == nil || !ci.g.restricted() {
		return nil
	}
	g := ci.g
	cred := &credential{remote: ci.remote}
	if _, ok := p.GetInput().(*kvindexv1.Prompt_BlockHashes); ok {
		return s.refuse(cred, g.name, ci.endpoint, reasonTenant, codes.PermissionDenied,
			g.name+" is restricted to some cache salts or LoRA adapters and cannot query by block hashes, which kvindex cannot attribute to either; send tokens, text or messages with the cache_salt and lora_name")
	}
	if g.salts != nil && !g.salts[p.GetCacheSalt()] {
		return s.refuse(cred, g.name, ci.endpoint, reasonTenant, codes.PermissionDenied,
			g.name+" may not query cache_salt "+quoteOrNone(p.GetCacheSalt()))
	}
	if g.loras != nil && !g.loras[p.GetLoraName()] {
		return s.refuse(cred, g.name, ci.endpoint, reasonTenant, codes.PermissionDenied,
			g.name+" may not query lora_name "+quoteOrNone(p.GetLoraName()))
	}
	return nil
}

func quoteOrNone(s string) string {
	if s == "" {
		return `"" (none)`
	}
	return `"` + s + `"`
}

// watchTenant applies the tenant rule to a Watch: it returns the LoRA
// adapters the caller may watch (nil: any), or refuses a caller restricted
// to cache salts. Events carry a block's salt at most in the first block
// of a sequence (vLLM hashes it into that block's extra keys, which the
// stream does not carry), never in the blocks chained after it, so kvindex
// cannot tell which of the blocks it streams belong to a salt: a
// salt-restricted caller may query with its salts but not watch.
func (s *Server) watchTenant(ctx context.Context) ([]string, error) {
	ci := callInfoOf(ctx)
	if ci == nil || ci.g == nil || !ci.g.restricted() {
		return nil, nil
	}
	g := ci.g
	if g.salts != nil {
		return nil, s.refuse(&credential{remote: ci.remote}, g.name, ci.endpoint, reasonTenant, codes.PermissionDenied,
			g.name+" is restricted to cache salts and cannot Watch: kvindex cannot attribute streamed blocks to a salt (only a sequence's first block carries it)")
	}
	loras := make([]string, 0, len(g.loras))
	for l := range g.loras {
		loras = append(loras, l)
	}
	return loras, nil
}
