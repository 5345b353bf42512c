package security

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"

	"google.golang.org/grpc/codes"
)

// Credential is what a caller presented with a request.
type Credential struct {
	// Token is the bearer token, "" if none or malformed.
	Token string
	// HasToken is true when an authorization header was sent, even a
	// malformed one: such a caller meant to use a token.
	HasToken bool
	// Cert is the client certificate, if its chain was verified.
	Cert *x509.Certificate
	// Remote is the caller's address, for logs.
	Remote string
}

// Refusal reasons, the reason label of kvindex_auth_refused_total.
const (
	ReasonNoCredentials   = "no_credentials"   // neither a token nor a client certificate
	ReasonBadToken        = "bad_token"        // a token that is malformed or not in the auth file
	ReasonUnknownIdentity = "unknown_identity" // a client certificate the auth file does not list
	ReasonScope           = "scope"            // the caller lacks the endpoint's scope
	ReasonTenant          = "tenant"           // the request reaches beyond the caller's salts or LoRAs
)

// Refusal is why a request may not be served: what the server counts
// (Reason), logs (Caller) and answers (Code, Message).
type Refusal struct {
	// Reason is one of the Reason constants.
	Reason string
	// Code is Unauthenticated (no usable credentials) or PermissionDenied
	// (a known caller asking for more than it may).
	Code codes.Code
	// Caller names the caller as far as known, "" if not at all; never
	// the token itself (a bad token is named by TokenFingerprint).
	Caller string
	// Message tells the caller what is wrong.
	Message string
}

func (r *Refusal) Error() string { return r.Message }

// everything is the grant of every caller when the server authorizes by
// certificate alone.
var everything = map[Scope]bool{ScopeQuery: true, ScopeWatch: true, ScopeMetrics: true, ScopeAdmin: true}

// Authorize decides whether cred may use endpoint, which needs the scope
// need, and returns the caller's grant or why not. pol is the auth file's
// policy; nil authorizes by certificate alone: every certificate the
// client CA verified may do everything (the TLS handshake refused the
// others), and a caller without one may do nothing.
func Authorize(pol *Policy, cred *Credential, endpoint string, need Scope) (*Grant, *Refusal) {
	if pol == nil {
		if cred.HasToken {
			return nil, &Refusal{Reason: ReasonBadToken, Code: codes.Unauthenticated,
				Message: "this kvindex accepts client certificates only (it has no auth file); do not send a bearer token"}
		}
		if cred.Cert == nil {
			return nil, &Refusal{Reason: ReasonNoCredentials, Code: codes.Unauthenticated,
				Message: "this endpoint needs a client certificate signed by one of kvindex's client CAs"}
		}
		return &Grant{name: "certificate " + CertName(cred.Cert), scopes: everything}, nil
	}
	var g *Grant
	switch {
	case cred.HasToken:
		if g = pol.Token(cred.Token); g == nil {
			return nil, &Refusal{Reason: ReasonBadToken, Code: codes.Unauthenticated, Caller: TokenFingerprint(cred.Token),
				Message: "the bearer token is not valid for this kvindex (send \"authorization: Bearer TOKEN\" with a token of its auth file)"}
		}
	case cred.Cert != nil:
		if g = pol.Identity(cred.Cert); g == nil {
			return nil, &Refusal{Reason: ReasonUnknownIdentity, Code: codes.PermissionDenied, Caller: "certificate " + CertName(cred.Cert),
				Message: "the client certificate " + CertName(cred.Cert) + " has no entry in kvindex's auth file"}
		}
	default:
		return nil, &Refusal{Reason: ReasonNoCredentials, Code: codes.Unauthenticated,
			Message: "this endpoint needs credentials: a bearer token (authorization: Bearer TOKEN) or a client certificate"}
	}
	if !g.Has(need) {
		return nil, &Refusal{Reason: ReasonScope, Code: codes.PermissionDenied, Caller: g.name,
			Message: g.name + " lacks the " + string(need) + " scope that " + endpoint + " needs"}
	}
	return g, nil
}

// CheckPrompt refuses a prompt that reaches beyond the grant's cache
// salts or LoRA adapters; byHashes is true for a prompt of block hashes.
// The index cannot tell a block's salt or adapter (it stores hashes), but
// it need not: both are hashed into the prompt's block keys (the salt
// into the first block, which every later block chains from; the adapter
// into every block), so a prompt whose salt and adapter the caller may
// use can only match blocks of that salt and adapter. Block hashes
// computed by the caller carry no salt or adapter kvindex could check, so
// a restricted caller cannot query by them.
func (g *Grant) CheckPrompt(byHashes bool, salt, lora string) *Refusal {
	if !g.Restricted() {
		return nil
	}
	refuse := func(msg string) *Refusal {
		return &Refusal{Reason: ReasonTenant, Code: codes.PermissionDenied, Caller: g.name, Message: g.name + msg}
	}
	switch {
	case byHashes:
		return refuse(" is restricted to some cache salts or LoRA adapters and cannot query by block hashes, which kvindex cannot attribute to either; send tokens, text or messages with the cache_salt and lora_name")
	case g.salts != nil && !g.salts[salt]:
		return refuse(" may not query cache_salt " + quoteOrNone(salt))
	case g.loras != nil && !g.loras[lora]:
		return refuse(" may not query lora_name " + quoteOrNone(lora))
	}
	return nil
}

func quoteOrNone(s string) string {
	if s == "" {
		return `"" (none)`
	}
	return `"` + s + `"`
}

// WatchLoRAs applies the tenant rule to a Watch: it returns the LoRA
// adapters the grant may watch (nil: any), or refuses a grant restricted
// to cache salts. Events carry a block's salt at most in the first block
// of a sequence (vLLM hashes it into that block's extra keys, which the
// stream does not carry), never in the blocks chained after it, so
// kvindex cannot tell which of the blocks it streams belong to a salt: a
// salt-restricted caller may query with its salts but not watch.
func (g *Grant) WatchLoRAs() ([]string, *Refusal) {
	if !g.Restricted() {
		return nil, nil
	}
	if g.salts != nil {
		return nil, &Refusal{Reason: ReasonTenant, Code: codes.PermissionDenied, Caller: g.name,
			Message: g.name + " is restricted to cache salts and cannot Watch: kvindex cannot attribute streamed blocks to a salt (only a sequence's first block carries it)"}
	}
	loras := make([]string, 0, len(g.loras))
	for l := range g.loras {
		loras = append(loras, l)
	}
	return loras, nil
}

// TokenFingerprint names an unknown token in logs without revealing it:
// the first 8 hex digits of its SHA-256, which an operator can compare
// with the sha256 column of the auth file.
func TokenFingerprint(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return "token sha256:" + hex.EncodeToString(sum[:4])
}

// CertName names a certificate in logs and messages: its URI, DNS name or
// common name, the first it has.
func CertName(c *x509.Certificate) string {
	switch {
	case len(c.URIs) > 0:
		return "uri=" + c.URIs[0].String()
	case len(c.DNSNames) > 0:
		return "dns=" + c.DNSNames[0]
	}
	return "cn=" + c.Subject.CommonName
}
