package zmqtransport

import (
	"fmt"
	"net/netip"
	"path"
	"strings"
)

// AllowRule says where the engines of some pods may connect from, in bind
// mode (SubscriberConfig.EngineAllow). Its text form is POD=CIDR.
//
// Pod is a pod name as the topic names it, either exact ("vllm-0",
// "10.0.0.5") or a glob in path.Match syntax ("vllm-*", "*" for every
// pod): a pod whose name is not fixed (a Deployment's) can only be pinned
// to a network, while a StatefulSet's names or a node pool's prefix fit a
// glob. Prefix is the network its engines' connections must come from; a
// single address is written without a length (10.0.0.5 means
// 10.0.0.5/32).
type AllowRule struct {
	Pod    string
	Prefix netip.Prefix
}

// String returns the rule as ParseAllowRule reads it.
func (r AllowRule) String() string {
	if r.Prefix.IsSingleIP() {
		return r.Pod + "=" + r.Prefix.Addr().String()
	}
	return r.Pod + "=" + r.Prefix.String()
}

// ParseAllowRule parses POD=CIDR (see AllowRule). The error says what is
// wrong with the value and what would be accepted, without naming the
// value (the caller names where it came from).
func ParseAllowRule(s string) (AllowRule, error) {
	const want = "want POD=CIDR, e.g. vllm-0=10.0.0.5, 'vllm-*=10.1.0.0/16' or '*=10.0.0.0/8'"
	pod, cidr, ok := strings.Cut(s, "=")
	switch {
	case !ok:
		return AllowRule{}, fmt.Errorf("no '=' (%s)", want)
	case pod == "":
		return AllowRule{}, fmt.Errorf("empty pod (%s)", want)
	case strings.TrimSpace(pod) != pod || strings.TrimSpace(cidr) != cidr:
		return AllowRule{}, fmt.Errorf("spaces around the pod or the network (%s)", want)
	case cidr == "":
		return AllowRule{}, fmt.Errorf("empty network (%s)", want)
	}
	if _, err := path.Match(pod, ""); err != nil {
		return AllowRule{}, fmt.Errorf("pod %q is not a valid glob (path.Match syntax: *, ?, [a-z]): %v", pod, err)
	}
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		a, aerr := netip.ParseAddr(cidr)
		if aerr != nil || a.Zone() != "" {
			return AllowRule{}, fmt.Errorf("%q is not an IP network or address (%s)", cidr, want)
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if m := p.Masked(); m != p {
		return AllowRule{}, fmt.Errorf("network %s has bits set beyond its /%d prefix; did you mean %s?", cidr, p.Bits(), m)
	}
	if p.Addr().Is4In6() {
		// Sources are compared unmapped, so a mapped network would never
		// match: say so rather than refuse every engine silently.
		return AllowRule{}, fmt.Errorf("network %s is IPv4-mapped IPv6; write the IPv4 network", cidr)
	}
	return AllowRule{Pod: pod, Prefix: p}, nil
}

// Warning says what a rule admits beyond what its text suggests, or ""
// when nothing: a glob over a network lets any engine of the network speak
// for every matching pod (but pods named by their IP address, which may
// speak only from it), so one compromised or misconfigured engine can
// write, or wipe, its neighbours' entries.
func (r AllowRule) Warning() string {
	if !isGlob(r.Pod) || r.Prefix.IsSingleIP() {
		return ""
	}
	return fmt.Sprintf("engine allow rule lets any engine in %s speak for every pod matching %q (pods named by their IP address excepted): tie names to addresses with discovery, name the pods by their IP address, or give each pod its own rule",
		r.Prefix, r.Pod)
}

// isGlob reports whether a rule's pod is a pattern rather than a name.
func isGlob(pod string) bool { return strings.ContainsAny(pod, `*?[\`) }

// allowList is SubscriberConfig.EngineAllow compiled. It is immutable, so
// the listener's loop reads it without locks.
type allowList struct {
	exact map[string][]netip.Prefix
	globs []AllowRule
	all   []netip.Prefix // every rule's network: the handshake's test
	// tied counts, per source address, the pods exact rules tie to it:
	// a rule naming the pod with that single address, or a pod named by
	// the address itself. Its connections are bounded by those pods'
	// (listen_conns.go), not by the cap on the others'.
	tied map[netip.Addr]int
}

func compileAllowList(rules []AllowRule) (*allowList, error) {
	if len(rules) == 0 {
		return nil, nil
	}
	a := &allowList{exact: map[string][]netip.Prefix{}, tied: map[netip.Addr]int{}}
	seen := map[AllowRule]bool{}
	tiedPods := map[netip.Addr]map[string]bool{}
	for _, r := range rules {
		// Validate what a caller built by hand as ParseAllowRule would.
		if !r.Prefix.IsValid() {
			return nil, fmt.Errorf("engine allow rule for pod %q: invalid network", r.Pod)
		}
		if _, err := ParseAllowRule(r.String()); err != nil {
			return nil, fmt.Errorf("engine allow rule %q: %v", r.String(), err)
		}
		if seen[r] {
			return nil, fmt.Errorf("engine allow rule %q given twice", r.String())
		}
		seen[r] = true
		if isGlob(r.Pod) {
			a.globs = append(a.globs, r)
		} else {
			a.exact[r.Pod] = append(a.exact[r.Pod], r.Prefix)
			addr, tie := r.Prefix.Addr(), r.Prefix.IsSingleIP()
			if ip, err := netip.ParseAddr(r.Pod); err == nil {
				// A pod named by its address speaks from it alone.
				addr = ip.Unmap().WithZone("")
				tie = r.Prefix.Contains(addr)
			}
			if tie {
				if tiedPods[addr] == nil {
					tiedPods[addr] = map[string]bool{}
				}
				tiedPods[addr][r.Pod] = true
			}
		}
		a.all = append(a.all, r.Prefix)
	}
	for addr, pods := range tiedPods {
		a.tied[addr] = len(pods)
	}
	return a, nil
}

// handshake reports whether any rule lets addr connect: at the handshake
// the pod is not known yet (it comes with each message's topic).
func (a *allowList) handshake(addr netip.Addr) bool {
	addr = addr.Unmap().WithZone("")
	for _, p := range a.all {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// source reports whether a message naming pod may come from addr; if not,
// why says which test failed. A pod named by an IP address (llm-d's
// kv@<pod-ip>@<model>) must also come from that very address: otherwise
// any engine of an allowed network could speak for any other.
func (a *allowList) source(pod string, addr netip.Addr) (ok bool, why string) {
	addr = addr.Unmap().WithZone("")
	if ip, err := netip.ParseAddr(pod); err == nil && ip.Unmap().WithZone("") != addr {
		return false, "the pod is named by an IP address, and its messages must come from that address"
	}
	matched := false
	for _, p := range a.exact[pod] {
		if p.Contains(addr) {
			return true, ""
		}
		matched = true
	}
	for _, r := range a.globs {
		if ok, _ := path.Match(r.Pod, pod); ok {
			if r.Prefix.Contains(addr) {
				return true, ""
			}
			matched = true
		}
	}
	if !matched {
		return false, "no engine allow rule names this pod"
	}
	return false, "the pod's engine allow rules do not include this address"
}

// named reports whether a message allowed for pod from addr names its
// engine rather than matching a glob: an exact rule for the pod (which
// discovery writes for each pod it admits) includes addr, or the pod is
// named by addr itself. Such engines are never refused for lack of slots
// (SubscriberConfig.MaxEngines): their number is bounded by the rules and
// the sources, not by the topics peers invent.
func (a *allowList) named(pod string, addr netip.Addr) bool {
	addr = addr.Unmap().WithZone("")
	if ip, err := netip.ParseAddr(pod); err == nil && ip.Unmap().WithZone("") == addr {
		return true
	}
	for _, p := range a.exact[pod] {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}
