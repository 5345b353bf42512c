package natstransport

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/kvindex/kvindex/kvevents"
)

// SubjectPrefix is the first token of every batch subject; the stream's
// default subjects are SubjectPrefix + ".>".
const SubjectPrefix = "kvevents"

// HeartbeatPrefix is the first two tokens of the relays' heartbeat
// subjects, kvindex.relay.<model>.<relay id>, on core NATS (not stored).
const HeartbeatPrefix = "kvindex.relay"

// EscapeToken makes s one valid subject token, reversibly: bytes in
// [A-Za-z0-9-] are kept and every other byte becomes _XX (uppercase hex),
// so dots, wildcards, whitespace and '$' never reach the subject; the
// empty string becomes "_". ("Llama-3.1-8B" -> "Llama-3_2E1-8B".)
func EscapeToken(s string) string {
	if s == "" {
		return "_"
	}
	clean := true
	for i := 0; i < len(s); i++ {
		if !plainByte(s[i]) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if plainByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('_')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

func plainByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-'
}

// UnescapeToken reverses EscapeToken. It rejects anything EscapeToken
// cannot produce (lower-case hex, an escaped plain byte, a stray byte), so
// each name has exactly one token.
func UnescapeToken(tok string) (string, error) {
	if tok == "_" {
		return "", nil
	}
	if tok == "" {
		return "", errors.New("empty subject token")
	}
	var b []byte
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if plainByte(c) {
			if b != nil {
				b = append(b, c)
			}
			continue
		}
		if c != '_' || i+2 >= len(tok) {
			return "", fmt.Errorf("subject token %q: byte %q at %d is not escaped", tok, c, i)
		}
		hi, lo := unhex(tok[i+1]), unhex(tok[i+2])
		if hi < 0 || lo < 0 {
			return "", fmt.Errorf("subject token %q: bad escape at %d", tok, i)
		}
		v := byte(hi<<4 | lo)
		if plainByte(v) {
			return "", fmt.Errorf("subject token %q: escaped plain byte at %d", tok, i)
		}
		if b == nil {
			b = append(make([]byte, 0, len(tok)), tok[:i]...)
		}
		b = append(b, v)
		i += 2
	}
	if b == nil {
		return tok, nil
	}
	return string(b), nil
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// ModelFilter is the subject filter of one model's batches.
func ModelFilter(model string) string {
	return SubjectPrefix + "." + EscapeToken(model) + ".>"
}

// BatchSubject is the subject of an engine rank's records:
// kvevents.<model>.<pod>.<rank>.
func BatchSubject(e kvevents.EngineID) string {
	return SubjectPrefix + "." + EscapeToken(e.Model) + "." + EscapeToken(e.Pod) + "." + strconv.Itoa(e.DPRank)
}

// ParseSubject reverses BatchSubject.
func ParseSubject(subj string) (kvevents.EngineID, error) {
	toks := strings.Split(subj, ".")
	if len(toks) != 4 || toks[0] != SubjectPrefix {
		return kvevents.EngineID{}, fmt.Errorf("subject %q: want %s.<model>.<pod>.<rank>", subj, SubjectPrefix)
	}
	model, err := UnescapeToken(toks[1])
	if err != nil {
		return kvevents.EngineID{}, err
	}
	pod, err := UnescapeToken(toks[2])
	if err != nil {
		return kvevents.EngineID{}, err
	}
	rank, err := strconv.Atoi(toks[3])
	if err != nil || rank < 0 || rank >= kvevents.MaxDPRank || strconv.Itoa(rank) != toks[3] {
		return kvevents.EngineID{}, fmt.Errorf("subject %q: rank %q not in [0, %d)", subj, toks[3], kvevents.MaxDPRank)
	}
	return kvevents.EngineID{Model: model, Pod: pod, DPRank: rank}, nil
}

// HeartbeatSubject is where a relay announces itself.
func HeartbeatSubject(model, relayID string) string {
	return HeartbeatPrefix + "." + EscapeToken(model) + "." + EscapeToken(relayID)
}

// Header names of a record. Values are ASCII.
const (
	HeaderKind   = "Kvindex-Kind"   // batch | reset | hole
	HeaderSeq    = "Kvindex-Seq"    // batch: the engine's sequence number, decimal
	HeaderPrint  = "Kvindex-Print"  // batch: kvevents.BatchPrint of the payload, 16 hex digits
	HeaderHealth = "Kvindex-Health" // the relay's view of the stream (kvevents.Health's names)
	HeaderPodIP  = "Kvindex-Pod-Ip" // the engine's pod IP, when the relay knows it
	HeaderReason = "Kvindex-Reason" // reset: a kvevents.ResetReason
	HeaderFrom   = "Kvindex-From"   // hole: first lost sequence number
	HeaderTo     = "Kvindex-To"     // hole: last lost sequence number
	HeaderRelay  = "Kvindex-Relay"  // the publishing relay's id (informational)
)

// Kind is the kind of a stored record.
type Kind uint8

// Record kinds.
const (
	KindBatch Kind = iota + 1 // an engine batch, payload unchanged
	KindReset                 // the engine's blocks must be forgotten (Record.Reason)
	KindHole                  // the relay dropped batches From..To (inclusive)
)

func (k Kind) String() string {
	switch k {
	case KindBatch:
		return "batch"
	case KindReset:
		return "reset"
	case KindHole:
		return "hole"
	}
	return "kind?"
}

// Record is what a message's headers say.
type Record struct {
	Kind   Kind
	Seq    uint64 // KindBatch
	Print  uint64 // KindBatch
	Health kvevents.Health
	PodIP  string
	Reason kvevents.ResetReason // KindReset
	From   uint64               // KindHole
	To     uint64               // KindHole
	Relay  string
}

// MsgID is the Nats-Msg-Id of a batch: the same batch (model, pod, rank,
// seq and print) always gets the same id, whichever relay publishes it and
// however often, so JetStream stores it once within the stream's
// duplicate window; another engine process's batch under the same seq
// differs in its print.
func MsgID(e kvevents.EngineID, seq, print uint64) string {
	return EscapeToken(e.Model) + "." + EscapeToken(e.Pod) + "." + strconv.Itoa(e.DPRank) + "." +
		strconv.FormatUint(seq, 10) + "." + fmt.Sprintf("%016x", print)
}

// controlMsgID is the Nats-Msg-Id of a reset or hole record: unique per
// relay process and record, stable when the relay re-publishes it.
func controlMsgID(relayID string, n uint64) string {
	return "relay." + relayID + "." + strconv.FormatUint(n, 10)
}

// Header encodes r as message headers (without Nats-Msg-Id).
func (r *Record) Header() nats.Header {
	h := nats.Header{}
	h.Set(HeaderKind, r.Kind.String())
	h.Set(HeaderHealth, r.Health.String())
	if r.PodIP != "" {
		h.Set(HeaderPodIP, r.PodIP)
	}
	if r.Relay != "" {
		h.Set(HeaderRelay, r.Relay)
	}
	switch r.Kind {
	case KindBatch:
		h.Set(HeaderSeq, strconv.FormatUint(r.Seq, 10))
		h.Set(HeaderPrint, fmt.Sprintf("%016x", r.Print))
	case KindReset:
		h.Set(HeaderReason, string(r.Reason))
	case KindHole:
		h.Set(HeaderFrom, strconv.FormatUint(r.From, 10))
		h.Set(HeaderTo, strconv.FormatUint(r.To, 10))
	}
	return h
}

// ParseHeader reads a record's headers; anything missing, repeated or
// malformed is an error (a record is never half understood).
func ParseHeader(h nats.Header) (Record, error) {
	var r Record
	one := func(name string) (string, error) {
		v := h.Values(name)
		if len(v) != 1 {
			return "", fmt.Errorf("header %s: %d values, want 1", name, len(v))
		}
		return v[0], nil
	}
	num := func(name string) (uint64, error) {
		v, err := one(name)
		if err != nil {
			return 0, err
		}
		// ParseUint takes decimal digits only; the one spelling it also
		// takes that FormatUint never writes is a leading zero.
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || len(v) > 1 && v[0] == '0' {
			return 0, fmt.Errorf("header %s: %q is not a decimal number", name, v)
		}
		return n, nil
	}
	kind, err := one(HeaderKind)
	if err != nil {
		return r, err
	}
	switch kind {
	case "batch":
		r.Kind = KindBatch
	case "reset":
		r.Kind = KindReset
	case "hole":
		r.Kind = KindHole
	default:
		return r, fmt.Errorf("header %s: unknown kind %q", HeaderKind, kind)
	}
	hs, err := one(HeaderHealth)
	if err != nil {
		return r, err
	}
	if r.Health, err = parseHealth(hs); err != nil {
		return r, err
	}
	if v := h.Values(HeaderPodIP); len(v) > 0 {
		r.PodIP = v[0]
	}
	if v := h.Values(HeaderRelay); len(v) > 0 {
		r.Relay = v[0]
	}
	switch r.Kind {
	case KindBatch:
		if r.Seq, err = num(HeaderSeq); err != nil {
			return r, err
		}
		p, err := one(HeaderPrint)
		if err != nil {
			return r, err
		}
		if len(p) != 16 {
			return r, fmt.Errorf("header %s: %q is not 16 hex digits", HeaderPrint, p)
		}
		if r.Print, err = strconv.ParseUint(p, 16, 64); err != nil {
			return r, fmt.Errorf("header %s: %q is not 16 hex digits", HeaderPrint, p)
		}
	case KindReset:
		v, err := one(HeaderReason)
		if err != nil {
			return r, err
		}
		switch reason := kvevents.ResetReason(v); reason {
		case kvevents.ResetRestart, kvevents.ResetCleared, kvevents.ResetRemoved:
			r.Reason = reason
		default:
			return r, fmt.Errorf("header %s: unknown reset reason %q", HeaderReason, v)
		}
	case KindHole:
		if r.From, err = num(HeaderFrom); err != nil {
			return r, err
		}
		if r.To, err = num(HeaderTo); err != nil {
			return r, err
		}
		if r.To < r.From {
			return r, fmt.Errorf("hole %d..%d: reversed", r.From, r.To)
		}
	}
	return r, nil
}

func parseHealth(s string) (kvevents.Health, error) {
	for h := kvevents.HealthOK; h <= kvevents.HealthDegraded; h++ {
		if h.String() == s {
			return h, nil
		}
	}
	return 0, fmt.Errorf("header %s: unknown health %q", HeaderHealth, s)
}
