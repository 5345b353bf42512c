package security

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/kvindex/kvindex/internal/configerr"
)

// Scope is a right a caller holds. Each endpoint of the server needs one.
type Scope string

// The scopes.
const (
	// ScopeQuery: LongestPrefix, GetPodScores, Lookup, ListPods (gRPC and
	// HTTP). Lookup's per-block holders say no more than LongestPrefix
	// asked block by block, so it needs no scope of its own.
	ScopeQuery Scope = "query"
	// ScopeWatch: Watch, the stream of every applied event.
	ScopeWatch Scope = "watch"
	// ScopeMetrics: GET /metrics (API and admin listeners).
	ScopeMetrics Scope = "metrics"
	// ScopeAdmin: the admin listener's /debug/pprof/.
	ScopeAdmin Scope = "admin"
)

var allScopes = []Scope{ScopeQuery, ScopeWatch, ScopeMetrics, ScopeAdmin}

// Scopes returns every scope, in the order the auth file's errors list
// them.
func Scopes() []Scope { return slices.Clone(allScopes) }

// maxAuthFile bounds an auth file.
const maxAuthFile = 1 << 20

// Grant is what one token or certificate identity may do.
type Grant struct {
	name   string // "token gateway", "certificate router"; for logs
	scopes map[Scope]bool
	// salts and loras restrict the prompts (and watched events) to these
	// cache salts and LoRA adapters ("" is the unsalted prompt, the base
	// model); nil: any.
	salts, loras map[string]bool
}

// Name names the caller in logs and refusals: "token gateway",
// "certificate router".
func (g *Grant) Name() string { return g.name }

// Has reports whether the grant holds scope s.
func (g *Grant) Has(s Scope) bool { return g.scopes[s] }

// Restricted reports whether the grant limits tenants: some cache salts
// or LoRA adapters only (CheckPrompt, WatchLoRAs).
func (g *Grant) Restricted() bool { return g.salts != nil || g.loras != nil }

type tokenEntry struct {
	sum [32]byte // SHA-256 of the token
	g   *Grant
}

// identityEntry matches a client certificate by one of its names.
type identityEntry struct {
	cn, dns, uri string
	g            *Grant
}

// Policy is one loaded version of the auth file: who may do what.
type Policy struct {
	tokens     []tokenEntry
	identities []identityEntry
}

// authFileEntry is one entry of the auth file as written.
type authFileEntry struct {
	Name   string   `yaml:"name"`
	SHA256 string   `yaml:"sha256"`
	CN     string   `yaml:"cn"`
	DNS    string   `yaml:"dns"`
	URI    string   `yaml:"uri"`
	Scopes []string `yaml:"scopes"`
	Salts  []string `yaml:"salts"`
	LoRAs  []string `yaml:"loras"`
	line   int
}

type authFileDoc struct {
	Tokens     []authFileEntry `yaml:"tokens"`
	Identities []authFileEntry `yaml:"identities"`
}

// LoadPolicy reads and checks the auth file at path (Config.AuthFile). It
// is YAML:
//
//	tokens:                  # bearer tokens ("authorization: Bearer TOKEN")
//	  - name: gateway        # shown in logs and refusals; unique
//	    sha256: 9f86d08...   # hex SHA-256 of the token: the file holds no secret
//	    scopes: [query]      # query, watch, metrics, admin
//	  - name: tenant-a-tools
//	    sha256: ...
//	    scopes: [query, watch]
//	    salts: [tenant-a]    # only prompts with these cache_salt values ("": none)
//	    loras: [""]          # only these LoRA adapters ("": the base model)
//	identities:              # client certificates (mutual TLS), first match wins
//	  - name: router
//	    uri: spiffe://cluster.local/ns/llm/sa/router   # or dns: NAME, or cn: NAME
//	    scopes: [query]
//
// A token is printed into the file with: printf %s "$TOKEN" | sha256sum.
// Omitting salts or loras allows any; an empty list is refused (it would
// allow nothing). Unknown keys are refused, so that a misspelt restriction
// cannot silently allow everything.
//
// Its errors are configuration errors of AuthFile (*configerr.Error).
func LoadPolicy(path string) (*Policy, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, configerr.Failed(FieldAuthFile, "%v: %w", FieldAuthFile, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxAuthFile+1))
	if err != nil {
		return nil, configerr.Failed(FieldAuthFile, "%v %s: %w", FieldAuthFile, path, err)
	}
	if len(data) > maxAuthFile {
		return nil, configerr.Failed(FieldAuthFile, "%v %s: larger than %d bytes", FieldAuthFile, path, maxAuthFile)
	}
	p, err := parsePolicy(data)
	if err != nil {
		return nil, configerr.Failed(FieldAuthFile, "%v %s: %w", FieldAuthFile, path, err)
	}
	return p, nil
}

// Tokens is the number of bearer tokens the policy lists.
func (p *Policy) Tokens() int { return len(p.tokens) }

// Identities is the number of certificate identities the policy lists.
func (p *Policy) Identities() int { return len(p.identities) }

// Token returns the grant of a bearer token, nil if the policy does not
// list it. Every entry is compared, in constant time, whatever matches:
// how long the check takes says nothing about which entry, or how much
// of one, matched.
func (p *Policy) Token(tok string) *Grant {
	sum := sha256.Sum256([]byte(tok))
	var g *Grant
	for i := range p.tokens {
		if subtle.ConstantTimeCompare(sum[:], p.tokens[i].sum[:]) == 1 {
			g = p.tokens[i].g
		}
	}
	return g
}

// Identity returns the grant of the first identity entry matching a
// verified client certificate (its subject common name, or one of its DNS
// or URI names), nil if none does.
func (p *Policy) Identity(c *x509.Certificate) *Grant {
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

func parsePolicy(data []byte) (*Policy, error) {
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty: list tokens and/or identities")
		}
		return nil, errors.New(strings.ReplaceAll(err.Error(), "\n", " "))
	}
	var doc authFileDoc
	strict := yaml.NewDecoder(bytes.NewReader(data))
	strict.KnownFields(true)
	if err := strict.Decode(&doc); err != nil {
		return nil, errors.New(strings.ReplaceAll(strings.TrimPrefix(err.Error(), "yaml: unmarshal errors:\n  "), "\n  ", "; "))
	}
	setLines(&root, &doc)
	if len(doc.Tokens) == 0 && len(doc.Identities) == 0 {
		return nil, errors.New("no tokens and no identities: list at least one")
	}
	p := &Policy{}
	names := map[string]int{}
	for i := range doc.Tokens {
		e := &doc.Tokens[i]
		g, err := e.grant("token", names)
		if err != nil {
			return nil, err
		}
		switch {
		case e.CN != "" || e.DNS != "" || e.URI != "":
			return nil, e.errf("a token has no cn, dns or uri (those match certificates: list them under identities)")
		case len(e.SHA256) != 64:
			return nil, e.errf("sha256 must be the 64 hex digits of the token's SHA-256 (printf %%s \"$TOKEN\" | sha256sum)")
		}
		sum, err := hex.DecodeString(e.SHA256)
		if err != nil {
			return nil, e.errf("sha256: not hex: %v", err)
		}
		te := tokenEntry{g: g}
		copy(te.sum[:], sum)
		for _, o := range p.tokens {
			if o.sum == te.sum {
				return nil, e.errf("the same token as %q", o.g.name)
			}
		}
		p.tokens = append(p.tokens, te)
	}
	for i := range doc.Identities {
		e := &doc.Identities[i]
		g, err := e.grant("certificate", names)
		if err != nil {
			return nil, err
		}
		n := 0
		for _, v := range []string{e.CN, e.DNS, e.URI} {
			if v != "" {
				n++
			}
		}
		switch {
		case e.SHA256 != "":
			return nil, e.errf("an identity has no sha256 (tokens do: list it under tokens)")
		case n != 1:
			return nil, e.errf("give exactly one of cn, dns or uri: the certificate name it matches")
		}
		p.identities = append(p.identities, identityEntry{cn: e.CN, dns: e.DNS, uri: e.URI, g: g})
	}
	return p, nil
}

// setLines records each entry's line for error messages.
func setLines(root *yaml.Node, doc *authFileDoc) {
	m := root
	if m.Kind == yaml.DocumentNode && len(m.Content) == 1 {
		m = m.Content[0]
	}
	if m.Kind != yaml.MappingNode {
		return
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		var list []authFileEntry
		switch m.Content[i].Value {
		case "tokens":
			list = doc.Tokens
		case "identities":
			list = doc.Identities
		default:
			continue
		}
		for j, item := range m.Content[i+1].Content {
			if j < len(list) {
				list[j].line = item.Line
			}
		}
	}
}

func (e *authFileEntry) errf(format string, args ...any) error {
	who := ""
	if e.Name != "" {
		who = fmt.Sprintf(" (%s)", e.Name)
	}
	return fmt.Errorf("line %d%s: %s", e.line, who, fmt.Sprintf(format, args...))
}

// grant checks the entry's name, scopes and restrictions; kind is "token"
// or "certificate".
func (e *authFileEntry) grant(kind string, names map[string]int) (*Grant, error) {
	if e.Name == "" {
		return nil, e.errf("every entry needs a name (it is what logs show)")
	}
	if l, ok := names[e.Name]; ok {
		return nil, e.errf("the name %q is used twice (also line %d)", e.Name, l)
	}
	names[e.Name] = e.line
	g := &Grant{name: kind + " " + e.Name, scopes: map[Scope]bool{}}
	if len(e.Scopes) == 0 {
		return nil, e.errf("no scopes: give some of %s", scopeList())
	}
	for _, s := range e.Scopes {
		if !slices.Contains(allScopes, Scope(s)) {
			return nil, e.errf("unknown scope %q (known: %s)", s, scopeList())
		}
		g.scopes[Scope(s)] = true
	}
	var err error
	if g.salts, err = e.set("salts", e.Salts); err != nil {
		return nil, err
	}
	if g.loras, err = e.set("loras", e.LoRAs); err != nil {
		return nil, err
	}
	return g, nil
}

func (e *authFileEntry) set(key string, vals []string) (map[string]bool, error) {
	if vals == nil {
		return nil, nil
	}
	if len(vals) == 0 {
		return nil, e.errf("%s: an empty list allows nothing; omit the key to allow any, or list \"\" for none", key)
	}
	m := make(map[string]bool, len(vals))
	for _, v := range vals {
		m[v] = true
	}
	return m, nil
}

func scopeList() string {
	s := make([]string, len(allScopes))
	for i, sc := range allScopes {
		s[i] = string(sc)
	}
	return strings.Join(s, ", ")
}
