package server

import (
	"cmp"
	"context"
	"crypto/x509"
	"net/http"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/indexerv1"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/api/server/security"
)

// The server's side of authorization: which scope each endpoint needs,
// reading what callers present, and refusing them (counted, logged, with
// a gRPC status or its HTTP form). Who may do what is package security's.

// endpointScopes is the scope each gRPC method of kvindex's APIs needs.
// A method of those services missing here is refused to everyone
// (authorizeGRPC), so that a new RPC is never open by omission; health
// and reflection are open.
var endpointScopes = map[string]security.Scope{
	kvindexv1.IndexService_LongestPrefix_FullMethodName:  security.ScopeQuery,
	kvindexv1.IndexService_Lookup_FullMethodName:         security.ScopeQuery,
	kvindexv1.IndexService_ListPods_FullMethodName:       security.ScopeQuery,
	kvindexv1.IndexService_GetHashConfig_FullMethodName:  security.ScopeQuery,
	kvindexv1.IndexService_Watch_FullMethodName:          security.ScopeWatch,
	kvindexv1.IndexService_HashSamples_FullMethodName:    security.ScopeAdmin,
	indexerv1.IndexerService_GetPodScores_FullMethodName: security.ScopeQuery,
}

// guardedServices are the services whose methods need a scope.
var guardedServices = []string{kvindexv1.IndexService_ServiceDesc.ServiceName, indexerv1.IndexerService_ServiceDesc.ServiceName}

// authMode is how a server decides who may call.
type authMode uint8

const (
	authOff      authMode = iota // no auth file, no client CA: everyone may do everything
	authCertOnly                 // client CA, no auth file: every verified certificate may do everything
	authFile                     // the auth file decides
)

// callInfo is the authorized caller of a request, in its context, for the
// checks made later (tenants) and their logs.
type callInfo struct {
	g        *security.Grant // nil: unrestricted (authorization off)
	endpoint string
	remote   string
}

type callInfoKey struct{}

func callInfoOf(ctx context.Context) *callInfo {
	ci, _ := ctx.Value(callInfoKey{}).(*callInfo)
	return ci
}

// authorize decides whether cred may use endpoint, which needs need. It
// returns the caller's grant (nil when authorization is off), or the
// refusal, already counted and logged.
func (s *Server) authorize(cred *security.Credential, endpoint string, need security.Scope) (*security.Grant, error) {
	var pol *security.Policy
	switch s.authMode {
	case authOff:
		return nil, nil
	case authFile:
		pol = s.auth.Get()
	}
	g, r := security.Authorize(pol, cred, endpoint, need)
	if r != nil {
		return nil, s.refuse(cred, endpoint, r)
	}
	return g, nil
}

// refuse counts and logs a refusal and returns its status.
func (s *Server) refuse(cred *security.Credential, endpoint string, r *security.Refusal) error {
	s.sec.refused.WithLabelValues(r.Reason, endpoint).Inc()
	who := r.Caller
	if who == "" && cred.Cert != nil {
		who = "certificate " + security.CertName(cred.Cert)
	}
	s.log.Warn("request refused", "endpoint", endpoint, "reason", r.Reason, "remote", cred.Remote, "caller", cmp.Or(who, "anonymous"))
	return status.Error(r.Code, r.Message)
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
func grpcCredential(ctx context.Context) *security.Credential {
	cred := &security.Credential{}
	if p, ok := peer.FromContext(ctx); ok {
		if p.Addr != nil {
			cred.Remote = p.Addr.String()
		}
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			cred.Cert = verifiedLeaf(ti.State.VerifiedChains)
		}
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if vals := md.Get("authorization"); len(vals) > 0 {
			cred.HasToken = true
			cred.Token, _ = bearer(vals[0])
		}
	}
	return cred
}

// httpCredential reads what an HTTP caller presented.
func httpCredential(r *http.Request) *security.Credential {
	cred := &security.Credential{Remote: r.RemoteAddr}
	if r.TLS != nil {
		cred.Cert = verifiedLeaf(r.TLS.VerifiedChains)
	}
	if v := r.Header.Get("Authorization"); v != "" {
		cred.HasToken = true
		cred.Token, _ = bearer(v)
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
func grpcScope(full string) (scope security.Scope, open bool) {
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
		return nil, s.refuse(cred, endpoint, &security.Refusal{Reason: security.ReasonScope, Code: codes.PermissionDenied,
			Message: endpoint + " is not open to any caller"})
	}
	g, err := s.authorize(cred, endpoint, scope)
	if err != nil {
		return nil, err
	}
	return context.WithValue(ctx, callInfoKey{}, &callInfo{g: g, endpoint: endpoint, remote: cred.Remote}), nil
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
func (s *Server) Guard(scope security.Scope, endpoint string, h http.Handler) http.Handler {
	return s.guard(scope, endpoint, h)
}

// guard makes h need scope; endpoint names it in metrics and logs.
func (s *Server) guard(scope security.Scope, endpoint string, h http.Handler) http.Handler {
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
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callInfoKey{}, &callInfo{g: g, endpoint: endpoint, remote: cred.Remote})))
	})
}

// checkTenant refuses a prompt that reaches beyond the caller's cache
// salts or LoRA adapters (security.Grant.CheckPrompt says why that is
// enough).
func (s *Server) checkTenant(ctx context.Context, p *kvindexv1.Prompt) error {
	ci := callInfoOf(ctx)
	if ci == nil || ci.g == nil {
		return nil
	}
	_, byHashes := p.GetInput().(*kvindexv1.Prompt_BlockHashes)
	if r := ci.g.CheckPrompt(byHashes, p.GetCacheSalt(), p.GetLoraName()); r != nil {
		return s.refuse(&security.Credential{Remote: ci.remote}, ci.endpoint, r)
	}
	return nil
}

// watchTenant applies the tenant rule to a Watch: it returns the LoRA
// adapters the caller may watch (nil: any), or refuses a caller restricted
// to cache salts (security.Grant.WatchLoRAs).
func (s *Server) watchTenant(ctx context.Context) ([]string, error) {
	ci := callInfoOf(ctx)
	if ci == nil || ci.g == nil {
		return nil, nil
	}
	loras, r := ci.g.WatchLoRAs()
	if r != nil {
		return nil, s.refuse(&security.Credential{Remote: ci.remote}, ci.endpoint, r)
	}
	return loras, nil
}
