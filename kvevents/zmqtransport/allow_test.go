package zmqtransport

import (
	"net/netip"
	"strings"
	"testing"
)

// allowRule parses a rule a test writes, failing loudly on a typo.
func allowRule(s string) AllowRule {
	r, err := ParseAllowRule(s)
	if err != nil {
		panic(err)
	}
	return r
}

func TestParseAllowRule(t *testing.T) {
	for _, tt := range []struct {
		in, want, err string
	}{
		{in: "vllm-0=10.0.0.5", want: "vllm-0=10.0.0.5"},
		{in: "vllm-0=10.0.0.5/32", want: "vllm-0=10.0.0.5"},
		{in: "vllm-*=10.1.0.0/16", want: "vllm-*=10.1.0.0/16"},
		{in: "*=0.0.0.0/0", want: "*=0.0.0.0/0"},
		{in: "10.0.0.5=10.0.0.0/24", want: "10.0.0.5=10.0.0.0/24"},
		{in: "p=fd00::/8", want: "p=fd00::/8"},
		{in: "p=fd00::7", want: "p=fd00::7"},
		{in: "vllm-0", err: "no '='"},
		{in: "=10.0.0.0/8", err: "empty pod"},
		{in: "p=", err: "empty network"},
		{in: " p=10.0.0.1", err: "spaces"},
		{in: "p=10.0.0.1 ", err: "spaces"},
		{in: "p=10.0.0.0/33", err: `"10.0.0.0/33" is not an IP network or address`},
		{in: "p=vllm-0", err: "is not an IP network or address"},
		{in: "p=10.0.0.0/8=x", err: "is not an IP network or address"},
		{in: "p=fe80::1%eth0", err: "is not an IP network or address"},
		{in: "p=10.1.2.3/16", err: "did you mean 10.1.0.0/16?"},
		{in: "p=::ffff:10.0.0.0/104", err: "IPv4-mapped"},
		{in: "vllm-[=10.0.0.0/8", err: "not a valid glob"},
	} {
		r, err := ParseAllowRule(tt.in)
		switch {
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("ParseAllowRule(%q) = %v, %v; want an error saying %q", tt.in, r, err, tt.err)
		case tt.err == "" && (err != nil || r.String() != tt.want):
			t.Errorf("ParseAllowRule(%q) = %v, %v; want %q", tt.in, r, err, tt.want)
		}
	}
}

// FuzzParseAllowRule: the parser never panics, and what it accepts reads
// back unchanged from its String.
func FuzzParseAllowRule(f *testing.F) {
	for _, s := range []string{"vllm-0=10.0.0.5", "*=10.0.0.0/8", "p=fd00::/8", "p=10.1.2.3/16", "=", "[=::", "a=b=c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseAllowRule(s)
		if err != nil {
			return
		}
		again, err := ParseAllowRule(r.String())
		if err != nil || again != r {
			t.Fatalf("%q parsed as %v, which reads back as %v, %v", s, r, again, err)
		}
	})
}

// TestAllowRuleWarning: only a glob over a network lets one engine speak
// for others.
func TestAllowRuleWarning(t *testing.T) {
	for _, tt := range []struct {
		rule string
		warn bool
	}{
		{"pod-a=10.0.0.1", false},
		{"pod-a=10.0.1.0/24", false},
		{"vllm-*=10.0.0.5", false},
		{"vllm-*=10.1.0.0/16", true},
		{"*=127.0.0.0/8", true},
	} {
		w := allowRule(tt.rule).Warning()
		if (w != "") != tt.warn {
			t.Errorf("%s: warning %q, want one: %v", tt.rule, w, tt.warn)
		}
		if tt.warn && !strings.Contains(w, allowRule(tt.rule).Prefix.String()) {
			t.Errorf("%s: warning %q does not name the network", tt.rule, w)
		}
	}
}

func TestAllowList(t *testing.T) {
	a, err := compileAllowList([]AllowRule{
		allowRule("pod-a=10.0.0.1"),
		allowRule("pod-a=10.0.1.0/24"),
		allowRule("vllm-*=10.1.0.0/16"),
		allowRule("*=10.2.0.0/16"),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		pod, addr string
		ok        bool
		why       string
		named     bool // an exact rule or the address itself names the pod: no slot needed
	}{
		{pod: "pod-a", addr: "10.0.0.1", ok: true, named: true},
		{pod: "pod-a", addr: "10.0.1.9", ok: true, named: true},
		{pod: "pod-a", addr: "::ffff:10.0.0.1", ok: true, named: true}, // mapped, as a dual-stack socket reports it
		{pod: "pod-a", addr: "10.0.0.2", why: "do not include this address"},
		{pod: "pod-a", addr: "10.2.3.4", ok: true}, // the catch-all rule
		{pod: "vllm-3", addr: "10.1.9.9", ok: true},
		{pod: "vllm-3", addr: "10.0.0.1", why: "do not include"},
		{pod: "other", addr: "10.2.0.1", ok: true},
		{pod: "other", addr: "10.9.0.1", why: "do not include"},
		// A pod named by an address must come from it, whatever the rules.
		{pod: "10.2.0.7", addr: "10.2.0.7", ok: true, named: true},
		{pod: "10.2.0.7", addr: "10.2.0.8", why: "named by an IP address"},
	} {
		addr := netip.MustParseAddr(tt.addr)
		ok, why := a.source(tt.pod, addr)
		if ok != tt.ok || !strings.Contains(why, tt.why) {
			t.Errorf("source(%q, %s) = %v %q; want %v %q", tt.pod, tt.addr, ok, why, tt.ok, tt.why)
		}
		if ok && a.named(tt.pod, addr) != tt.named {
			t.Errorf("named(%q, %s) = %v, want %v", tt.pod, tt.addr, !tt.named, tt.named)
		}
	}
	noCatchAll, err := compileAllowList([]AllowRule{allowRule("pod-a=10.0.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	if ok, why := noCatchAll.source("pod-b", netip.MustParseAddr("10.0.0.1")); ok || !strings.Contains(why, "no engine allow rule names this pod") {
		t.Errorf("pod-b from pod-a's address: %v %q", ok, why)
	}
	for addr, want := range map[string]bool{"10.0.0.1": true, "10.1.200.3": true, "10.3.0.1": false, "fd00::1": false} {
		if got := a.handshake(netip.MustParseAddr(addr)); got != want {
			t.Errorf("handshake(%s) = %v, want %v", addr, got, want)
		}
	}
}

// TestAllowListTied: the addresses whose connections the handshake does
// not count against the cap, and for how many pods (listen_conns.go).
func TestAllowListTied(t *testing.T) {
	a, err := compileAllowList([]AllowRule{
		allowRule("vllm-0=10.0.0.5"), allowRule("vllm-1=10.0.0.5"), // two pods on one address
		allowRule("vllm-2=10.0.1.0/24"),   // an exact pod over a network: not tied
		allowRule("10.0.2.7=10.0.2.0/24"), // a pod named by its address
		allowRule("10.0.3.7=10.0.4.0/24"), // named by an address its rule excludes
		allowRule("*=10.0.0.0/8"),         // a glob ties nothing
		allowRule("vllm-*=10.0.9.9"),      // nor over one address
		allowRule("vllm-0=10.0.0.6"),      // a pod on two addresses
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		addr string
		want int
	}{
		{"10.0.0.5", 2}, {"10.0.0.6", 1}, {"10.0.1.3", 0}, {"10.0.2.7", 1},
		{"10.0.3.7", 0}, {"10.0.4.1", 0}, {"10.0.9.9", 0}, {"10.9.9.9", 0},
	} {
		if got := a.tied[netip.MustParseAddr(tt.addr)]; got != tt.want {
			t.Errorf("tied[%s] = %d, want %d", tt.addr, got, tt.want)
		}
	}
}
