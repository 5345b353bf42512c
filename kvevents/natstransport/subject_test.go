package natstransport_test

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/natstransport"
)

func TestEscapeToken(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "_"},
		{"Llama-3.1-8B", "Llama-3_2E1-8B"},
		{"Qwen/Qwen3", "Qwen_2FQwen3"},
		{"a_b", "a_5Fb"},
		{"_", "_5F"},
		{"*", "_2A"},
		{">", "_3E"},
		{"$SYS", "_24SYS"},
		{"a b\tc", "a_20b_09c"},
		{"vllm-0", "vllm-0"},
		{"é", "_C3_A9"},
		{"\x00", "_00"},
	} {
		got := natstransport.EscapeToken(tc.in)
		if got != tc.want {
			t.Errorf("EscapeToken(%q) = %q, want %q", tc.in, got, tc.want)
		}
		back, err := natstransport.UnescapeToken(got)
		if err != nil || back != tc.in {
			t.Errorf("UnescapeToken(%q) = %q, %v; want %q", got, back, err, tc.in)
		}
	}
}

func TestUnescapeTokenRejects(t *testing.T) {
	for _, tok := range []string{
		"",     // no token at all
		"a_2",  // truncated escape
		"a_",   // truncated escape
		"_2e",  // lower-case hex: EscapeToken never writes it
		"_41",  // an escaped plain byte ('A')
		"a.b",  // a separator
		"a*",   // a wildcard
		"__",   // '_' must be followed by hex
		"a b",  // whitespace
		"_ZZ",  // not hex
		"x_2D", // '-' is plain
	} {
		if got, err := natstransport.UnescapeToken(tok); err == nil {
			t.Errorf("UnescapeToken(%q) = %q, want an error", tok, got)
		}
	}
}

// validToken reports whether tok is a subject token a NATS client may use
// anywhere: non-empty, no separator, wildcard, whitespace or '$'.
func validToken(tok string) bool {
	return tok != "" && !strings.ContainsAny(tok, ".*> \t\r\n$") && strings.Trim(tok, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") == ""
}

func FuzzEscapeToken(f *testing.F) {
	for _, s := range []string{"", "Llama-3.1-8B", "Qwen/Qwen3", "_", "a_5Fb", "*", ">", "$", "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok := natstransport.EscapeToken(s)
		if !validToken(tok) {
			t.Fatalf("EscapeToken(%q) = %q: not a valid subject token", s, tok)
		}
		back, err := natstransport.UnescapeToken(tok)
		if err != nil || back != s {
			t.Fatalf("round trip of %q: %q, %v", s, back, err)
		}
		// Whatever Unescape accepts, Escape writes back the same way: one
		// token per name.
		if u, err := natstransport.UnescapeToken(s); err == nil && natstransport.EscapeToken(u) != s {
			t.Fatalf("UnescapeToken(%q) = %q, which escapes to %q", s, u, natstransport.EscapeToken(u))
		}
	})
}

func TestSubjects(t *testing.T) {
	for _, tc := range []struct {
		id   kvevents.EngineID
		want string
	}{
		{kvevents.EngineID{Model: "Llama-3.1-8B", Pod: "vllm-0", DPRank: 0}, "kvevents.Llama-3_2E1-8B.vllm-0.0"},
		{kvevents.EngineID{Model: "Qwen/Qwen3", Pod: "p.q", DPRank: 7}, "kvevents.Qwen_2FQwen3.p_2Eq.7"},
		{kvevents.EngineID{Model: "", Pod: "", DPRank: kvevents.MaxDPRank - 1}, "kvevents._._.1023"},
	} {
		got := natstransport.BatchSubject(tc.id)
		if got != tc.want {
			t.Errorf("BatchSubject(%v) = %q, want %q", tc.id, got, tc.want)
		}
		back, err := natstransport.ParseSubject(got)
		if err != nil || back != tc.id {
			t.Errorf("ParseSubject(%q) = %v, %v", got, back, err)
		}
		if !strings.HasPrefix(got, strings.TrimSuffix(natstransport.ModelFilter(tc.id.Model), ">")) {
			t.Errorf("%q is outside its model's filter %q", got, natstransport.ModelFilter(tc.id.Model))
		}
	}
	for _, subj := range []string{
		"kvevents.m.p", "kvevents.m.p.0.1", "other.m.p.0", "kvevents.m.p.-1", "kvevents.m.p.01",
		"kvevents.m.p.1024", "kvevents.m.p.x", "kvevents.m.p_2.0", "kvevents..p.0",
	} {
		if id, err := natstransport.ParseSubject(subj); err == nil {
			t.Errorf("ParseSubject(%q) = %v, want an error", subj, id)
		}
	}
}

func TestMsgID(t *testing.T) {
	a := kvevents.EngineID{Model: "m", Pod: "p", DPRank: 1}
	base := natstransport.MsgID(a, 5, 0xabc)
	if base != natstransport.MsgID(a, 5, 0xabc) {
		t.Fatal("MsgID is not stable")
	}
	for _, tc := range []struct {
		name  string
		id    kvevents.EngineID
		seq   uint64
		print uint64
	}{
		{"another seq", a, 6, 0xabc},
		{"another print (engine process)", a, 5, 0xabd},
		{"another rank", kvevents.EngineID{Model: "m", Pod: "p", DPRank: 2}, 5, 0xabc},
		{"another pod", kvevents.EngineID{Model: "m", Pod: "q", DPRank: 1}, 5, 0xabc},
		{"another model", kvevents.EngineID{Model: "n", Pod: "p", DPRank: 1}, 5, 0xabc},
		{"pod with a dot", kvevents.EngineID{Model: "m", Pod: "p.1", DPRank: 1}, 5, 0xabc},
	} {
		if got := natstransport.MsgID(tc.id, tc.seq, tc.print); got == base {
			t.Errorf("%s: same id %q", tc.name, got)
		}
	}
}

func TestHeaderRoundTrip(t *testing.T) {
	for _, r := range []natstransport.Record{
		{Kind: natstransport.KindBatch, Seq: 0, Print: 0, Health: kvevents.HealthOK},
		{Kind: natstransport.KindBatch, Seq: 1<<64 - 1, Print: 1<<64 - 1, Health: kvevents.HealthDegraded, PodIP: "10.0.0.7", Relay: "r1"},
		{Kind: natstransport.KindReset, Reason: kvevents.ResetRestart, Health: kvevents.HealthUnconfirmed},
		{Kind: natstransport.KindReset, Reason: kvevents.ResetRemoved, Health: kvevents.HealthRestored},
		{Kind: natstransport.KindHole, From: 3, To: 3, Health: kvevents.HealthOK},
		{Kind: natstransport.KindHole, From: 3, To: 1 << 40, Health: kvevents.HealthOK},
	} {
		got, err := natstransport.ParseHeader(r.Header())
		if err != nil || got != r {
			t.Errorf("round trip of %+v: %+v, %v", r, got, err)
		}
	}
}

func TestParseHeaderRejects(t *testing.T) {
	h := func(kv ...string) nats.Header {
		out := nats.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Add(kv[i], kv[i+1])
		}
		return out
	}
	const (
		K, S, P, H = natstransport.HeaderKind, natstransport.HeaderSeq, natstransport.HeaderPrint, natstransport.HeaderHealth
		R, F, T    = natstransport.HeaderReason, natstransport.HeaderFrom, natstransport.HeaderTo
	)
	for _, tc := range []struct {
		name string
		h    nats.Header
	}{
		{"none", nil},
		{"unknown kind", h(K, "party", H, "ok")},
		{"two kinds", h(K, "batch", K, "hole", H, "ok", S, "1", P, "0000000000000001")},
		{"no health", h(K, "batch", S, "1", P, "0000000000000001")},
		{"unknown health", h(K, "batch", H, "great", S, "1", P, "0000000000000001")},
		{"no seq", h(K, "batch", H, "ok", P, "0000000000000001")},
		{"negative seq", h(K, "batch", H, "ok", S, "-1", P, "0000000000000001")},
		{"seq with sign", h(K, "batch", H, "ok", S, "+1", P, "0000000000000001")},
		{"seq with zeros", h(K, "batch", H, "ok", S, "01", P, "0000000000000001")},
		{"seq overflow", h(K, "batch", H, "ok", S, "18446744073709551616", P, "0000000000000001")},
		{"short print", h(K, "batch", H, "ok", S, "1", P, "1")},
		{"print not hex", h(K, "batch", H, "ok", S, "1", P, "000000000000000g")},
		{"print with sign", h(K, "batch", H, "ok", S, "1", P, "+000000000000001")},
		{"reset without reason", h(K, "reset", H, "ok")},
		{"unknown reason", h(K, "reset", H, "ok", R, "boredom")},
		{"hole without to", h(K, "hole", H, "ok", F, "1")},
		{"reversed hole", h(K, "hole", H, "ok", F, "5", T, "4")},
	} {
		if r, err := natstransport.ParseHeader(tc.h); err == nil {
			t.Errorf("%s: parsed as %+v, want an error", tc.name, r)
		}
	}
}

// FuzzParseHeader: any header block a client can publish parses or fails
// cleanly, and what parses encodes back to itself.
func FuzzParseHeader(f *testing.F) {
	f.Add("batch", "ok", "12", "00000000000000ff", "", "", "")
	f.Add("reset", "degraded", "", "", "restart", "", "")
	f.Add("hole", "restored", "", "", "", "3", "9")
	f.Add("hole", "ok", "", "", "", "9", "3")
	f.Fuzz(func(t *testing.T, kind, health, seq, print, reason, from, to string) {
		h := nats.Header{}
		set := func(k, v string) {
			if v != "" {
				h.Set(k, v)
			}
		}
		set(natstransport.HeaderKind, kind)
		set(natstransport.HeaderHealth, health)
		set(natstransport.HeaderSeq, seq)
		set(natstransport.HeaderPrint, print)
		set(natstransport.HeaderReason, reason)
		set(natstransport.HeaderFrom, from)
		set(natstransport.HeaderTo, to)
		r, err := natstransport.ParseHeader(h)
		if err != nil {
			return
		}
		again, err := natstransport.ParseHeader(r.Header())
		if err != nil || again != r {
			t.Fatalf("%+v re-encoded parses as %+v, %v", r, again, err)
		}
	})
}
