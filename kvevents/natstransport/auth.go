package natstransport

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"slices"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
)

// HeaderMAC carries a record's or a heartbeat's authentication code (Auth):
// 64 hex digits of HMAC-SHA256.
const HeaderMAC = "Kvindex-Mac"

// MinAuthKey is the shortest key NewAuth takes, in bytes.
const MinAuthKey = 32

// Errors of Auth.Verify.
var (
	ErrNoMAC  = errors.New("natstransport: no authentication code (" + HeaderMAC + ")")
	ErrBadMAC = errors.New("natstransport: authentication code does not match: not written with kvindex's key")
)

// Auth authenticates what kvindex writes to NATS with a key its relays and
// replicas share, so that a replica applies only what a kvindex relay
// wrote, whoever else may write to the server. Each record carries, in
// HeaderMAC, an HMAC-SHA256 of its subject, its Kvindex-* headers (names
// sorted) and its payload; each heartbeat one of its subject and body. A
// record moved to another engine's subject, or with a header or a byte of
// its payload changed, no longer verifies. (Replaying a record unchanged
// is not forgery: it is a duplicate, which the consumer drops by its
// sequence and print.) It is safe for concurrent use.
type Auth struct {
	key  []byte
	pool sync.Pool // hash.Hash keyed by the key
}

// NewAuth returns the Auth of key, at least MinAuthKey bytes (a file of
// random bytes, or `openssl rand -hex 32`).
func NewAuth(key []byte) (*Auth, error) {
	if len(key) < MinAuthKey {
		return nil, fmt.Errorf("natstransport: an authentication key of %d bytes; want at least %d (e.g. openssl rand -hex 32)", len(key), MinAuthKey)
	}
	k := slices.Clone(key)
	a := &Auth{key: k}
	a.pool.New = func() any { return hmac.New(sha256.New, k) }
	return a, nil
}

// mac computes the code of a message.
func (a *Auth) mac(subject string, h nats.Header, data []byte) []byte {
	m := a.pool.Get().(hash.Hash)
	defer a.pool.Put(m)
	m.Reset()
	field := func(s string) {
		var n [4]byte
		n[0], n[1], n[2], n[3] = byte(len(s)>>24), byte(len(s)>>16), byte(len(s)>>8), byte(len(s))
		m.Write(n[:])
		m.Write([]byte(s))
	}
	field("kvindex-nats-v1")
	field(subject)
	var names []string
	for name := range h {
		if strings.HasPrefix(name, "Kvindex-") && name != HeaderMAC {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		field(name)
		vs := h[name]
		field(fmt.Sprint(len(vs)))
		for _, v := range vs {
			field(v)
		}
	}
	m.Write(data)
	return m.Sum(nil)
}

// NewHash returns an HMAC-SHA256 keyed with the key, for authenticating
// a stream of bytes (a snapshot) in its own domain, so that no code of
// one kind verifies as another's.
func (a *Auth) NewHash(domain string) hash.Hash {
	m := hmac.New(sha256.New, a.key)
	m.Write([]byte("kvindex-" + domain + "-v1\x00"))
	return m
}

// Sign sets msg's HeaderMAC.
func (a *Auth) Sign(msg *nats.Msg) {
	if msg.Header == nil {
		msg.Header = nats.Header{}
	}
	msg.Header.Set(HeaderMAC, hex.EncodeToString(a.mac(msg.Subject, msg.Header, msg.Data)))
}

// Verify checks a message's HeaderMAC: ErrNoMAC without one, ErrBadMAC if
// it does not match.
func (a *Auth) Verify(subject string, h nats.Header, data []byte) error {
	vs := h[HeaderMAC]
	if len(vs) == 0 {
		return ErrNoMAC
	}
	got, err := hex.DecodeString(vs[0])
	if err != nil || len(vs) != 1 || !hmac.Equal(got, a.mac(subject, h, data)) {
		return ErrBadMAC
	}
	return nil
}
