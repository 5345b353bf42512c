package zmqtransport

import (
	"fmt"
	"strconv"
	"strings"
)

// Endpoints and data-parallel ranks.
//
// vLLM's ZmqEventPublisher (vllm/distributed/kv_events.py,
// offset_endpoint_port, since vLLM PR #18925) gives data-parallel rank r
// the configured port + r for both of its sockets: the PUB endpoint and
// the replay ROUTER endpoint (an inproc name gets "_dp<r>"; an ipc
// endpoint raises for r > 0). An engine with N ranks therefore occupies N
// consecutive event ports and N consecutive replay ports, and the two
// bases must be at least N apart. This is read from vLLM's source rather
// than observed on a live multi-rank engine, and the rank vLLM offsets by
// is the one the publisher is created with (newer vLLM passes its
// data-parallel index, local to a node when ranks span nodes), which is
// why a batch's own dp_rank overrides the port's (stream.checkRank).

// acceptedEndpoints lists the endpoint forms kvindex accepts: the
// transports vLLM's publisher supports.
const acceptedEndpoints = "tcp://HOST:PORT, ipc://PATH or inproc://NAME"

// EndpointError is an endpoint kvindex cannot use. Its message,
// `endpoint "EP": REASON`, is meant to follow what names the endpoint
// (an engine, a flag).
type EndpointError struct {
	Endpoint string
	// Reason says what is wrong and what would be accepted.
	Reason string
	// Wildcard marks an endpoint to connect to whose host is "*" (or
	// "[::]"): the side that binds writes that, so the endpoint was
	// probably copied from the engine's own configuration.
	Wildcard bool
}

func (e *EndpointError) Error() string {
	return fmt.Sprintf("endpoint %q: %s", e.Endpoint, e.Reason)
}

// CheckConnectEndpoint reports whether kvindex can connect to ep for
// ranks data-parallel ranks (ranks < 1 counts as 1): tcp://HOST:PORT with
// a host to reach and a port in 1..65535 that stays in range when offset
// by the last rank, inproc://NAME, or ipc://PATH (one rank only). The
// error is an *EndpointError.
func CheckConnectEndpoint(ep string, ranks int) error {
	return checkEndpoint(ep, false, ranks)
}

// CheckBindEndpoint is CheckConnectEndpoint for an endpoint kvindex binds:
// the host may also be "*" (every interface), and with one rank the port
// may be "*" or 0 for an ephemeral port (ListenEndpoint reports it); an
// ephemeral port cannot be offset by a rank.
func CheckBindEndpoint(ep string, ranks int) error {
	return checkEndpoint(ep, true, ranks)
}

func checkEndpoint(ep string, bind bool, ranks int) error {
	ranks = max(ranks, 1)
	bad := func(wildcard bool, format string, args ...any) error {
		return &EndpointError{Endpoint: ep, Reason: fmt.Sprintf(format, args...), Wildcard: wildcard}
	}
	scheme, rest, ok := strings.Cut(ep, "://")
	if !ok {
		return bad(false, "no transport (want %s)", acceptedEndpoints)
	}
	switch scheme {
	case "tcp":
	case "ipc", "inproc":
		if rest == "" {
			return bad(false, "empty %s name (want %s)", scheme, acceptedEndpoints)
		}
		if scheme == "ipc" && ranks > 1 {
			return bad(false, "an ipc endpoint cannot carry data-parallel ranks above 0 (vLLM offsets tcp ports by the rank); use tcp://HOST:PORT for %d ranks", ranks)
		}
		return nil
	default:
		return bad(false, "unknown transport %q (want %s)", scheme, acceptedEndpoints)
	}
	i := strings.LastIndexByte(rest, ':')
	if i < 0 {
		return bad(false, "no port (want tcp://HOST:PORT, e.g. tcp://10.0.0.5:5557)")
	}
	host, port := rest[:i], rest[i+1:]
	switch {
	case host == "":
		return bad(false, "no host (want tcp://HOST:PORT, e.g. tcp://10.0.0.5:5557)")
	case !bind && (host == "*" || host == "[::]"):
		return bad(true, "%q is not a host to connect to: it is how the side that binds names every interface (want the engine's address, e.g. tcp://10.0.0.5:%s)", host, port)
	}
	if port == "*" || port == "0" {
		switch {
		case !bind:
			return bad(false, "port %q: connecting needs the engine's port, in 1..65535", port)
		case ranks > 1:
			return bad(false, "an ephemeral port (%q) cannot be offset by the rank: give rank 0's port, in 1..65535", port)
		}
		return nil
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return bad(false, "port %q is not in 1..65535", port)
	}
	if last := p + ranks - 1; last > 65535 {
		return bad(false, "port %d cannot be offset by %d data-parallel ranks: ports %d-%d go beyond 65535", p, ranks, p, last)
	}
	return nil
}

// tcpPort splits a tcp endpoint into the text before its port and the
// port; ok is false for other transports and ephemeral ports.
func tcpPort(ep string) (prefix string, port int, ok bool) {
	if !strings.HasPrefix(ep, "tcp://") {
		return "", 0, false
	}
	i := strings.LastIndexByte(ep, ':')
	if i < len("tcp://") {
		return "", 0, false
	}
	p, err := strconv.Atoi(ep[i+1:])
	if err != nil || p <= 0 {
		return "", 0, false
	}
	return ep[:i+1], p, true
}

// offsetEndpoint returns the endpoint data-parallel rank r of an engine
// uses, the way vLLM derives it (see above): a tcp port grows by r, an
// inproc name gets "_dp<r>", and ipc endpoints cannot carry ranks above 0.
func offsetEndpoint(endpoint string, r int) (string, error) {
	if r == 0 || endpoint == "" {
		return endpoint, nil
	}
	switch {
	case strings.HasPrefix(endpoint, "inproc://"):
		return endpoint + "_dp" + strconv.Itoa(r), nil
	case strings.HasPrefix(endpoint, "tcp://"):
		prefix, port, ok := tcpPort(endpoint)
		if !ok {
			return "", fmt.Errorf("zmqtransport: endpoint %q has no port", endpoint)
		}
		if port+r > 65535 {
			return "", fmt.Errorf("zmqtransport: endpoint %q: port cannot be offset by rank %d", endpoint, r)
		}
		return prefix + strconv.Itoa(port+r), nil
	}
	return "", fmt.Errorf("zmqtransport: endpoint %q cannot carry data-parallel rank %d (only tcp:// and inproc:// can)", endpoint, r)
}

// LayoutError reports an engine whose ports collide once every rank is
// counted as vLLM offsets them: its own event and replay ports, or its
// ports and those of an engine listed before it on the same host.
type LayoutError struct {
	// Index is the engine's position in the list checked.
	Index int
	// Engine is its name.
	Engine string
	// Detail says which ports collide and suggests a layout that does
	// not.
	Detail string
}

func (e *LayoutError) Error() string {
	return fmt.Sprintf("zmqtransport: engine %q: %s", e.Engine, e.Detail)
}

// portUse is one engine socket's claim on an endpoint.
type portUse struct {
	engine int
	replay bool
	rank   int
}

// CheckLayout reports the first engine (connect mode) whose event or
// replay endpoints, over all its ranks, collide with each other or with
// an earlier engine's: two sockets cannot bind one port, and a subscriber
// reading another engine's port would file its events under the wrong
// name. Hosts are compared as written. The error is a *LayoutError.
// Endpoints that CheckConnectEndpoint refuses are skipped.
func CheckLayout(engines []EngineConfig) error {
	used := map[string]portUse{}
	for i, e := range engines {
		n := max(e.Ranks, 1)
		if d := selfOverlap(e, n); d != "" {
			return &LayoutError{Index: i, Engine: e.Name, Detail: d}
		}
		for _, replay := range []bool{false, true} {
			base := e.Endpoint
			if replay {
				base = e.ReplayEndpoint
			}
			if base == "" || CheckConnectEndpoint(base, n) != nil {
				continue
			}
			for r := range n {
				ep, _ := offsetEndpoint(base, r)
				k := endpointKey(ep)
				if u, ok := used[k]; ok && u.engine != i {
					o := engines[u.engine]
					return &LayoutError{Index: i, Engine: e.Name, Detail: fmt.Sprintf(
						"%s is taken: engine %q uses it for %s; engines on one host need ports of their own, counting every rank (vLLM offsets both ports by the rank)",
						socketName(ep, replay, r, n), o.Name, socketUse(u.replay, u.rank, max(o.Ranks, 1)))}
				}
				used[k] = portUse{engine: i, replay: replay, rank: r}
			}
		}
	}
	return nil
}

// selfOverlap describes how an engine's own event and replay endpoints
// collide over its n ranks, with a replay endpoint that would not; "" if
// they do not.
func selfOverlap(e EngineConfig, n int) string {
	if e.ReplayEndpoint == "" || CheckConnectEndpoint(e.Endpoint, n) != nil || CheckConnectEndpoint(e.ReplayEndpoint, n) != nil {
		return ""
	}
	evPrefix, ev, evTCP := tcpPort(e.Endpoint)
	rpPrefix, rp, rpTCP := tcpPort(e.ReplayEndpoint)
	if !evTCP || !rpTCP {
		for r := range n {
			a, _ := offsetEndpoint(e.Endpoint, r)
			b, _ := offsetEndpoint(e.ReplayEndpoint, r)
			if a == b {
				return fmt.Sprintf("the event and replay endpoints are both %q; the replay socket needs its own", a)
			}
		}
		return ""
	}
	if !strings.EqualFold(evPrefix, rpPrefix) || ev-rp >= n || rp-ev >= n {
		return ""
	}
	fix := "leave a gap of at least " + strconv.Itoa(n) + " ports between the event and replay ports"
	gap := (n + 9) / 10 * 10 // a round gap, at least n
	switch {
	case ev+gap+n-1 <= 65535:
		fix = "replay=" + rpPrefix + strconv.Itoa(ev+gap)
	case ev-gap >= 1:
		fix = "replay=" + rpPrefix + strconv.Itoa(ev-gap)
	}
	if n == 1 {
		return fmt.Sprintf("the event and replay ports are both %d; the replay socket needs its own port: %s", ev, fix)
	}
	return fmt.Sprintf("ranks=%d uses event ports %s and replay ports %s, which overlap at %d; vLLM offsets both by the rank, so leave a gap: %s",
		n, portRange(ev, n), portRange(rp, n), max(ev, rp), fix)
}

// socketName names one rank's event or replay socket for an error.
func socketName(ep string, replay bool, rank, ranks int) string {
	kind := "event"
	if replay {
		kind = "replay"
	}
	what := kind + " endpoint " + strconv.Quote(ep)
	if _, port, ok := tcpPort(ep); ok {
		what = kind + " port " + strconv.Itoa(port)
	}
	if ranks == 1 {
		return what
	}
	return "rank " + strconv.Itoa(rank) + "'s " + what
}

// socketUse says what an engine uses a port for, for an error.
func socketUse(replay bool, rank, ranks int) string {
	what := "events"
	if replay {
		what = "replay socket"
	}
	if ranks == 1 {
		if replay {
			return "its " + what
		}
		return what
	}
	return "rank " + strconv.Itoa(rank) + "'s " + what
}

func portRange(from, n int) string {
	if n == 1 {
		return strconv.Itoa(from)
	}
	return strconv.Itoa(from) + "-" + strconv.Itoa(from+n-1)
}

// endpointKey identifies the socket an endpoint names: hosts compare
// without regard to case.
func endpointKey(ep string) string {
	if prefix, port, ok := tcpPort(ep); ok {
		return strings.ToLower(prefix) + strconv.Itoa(port)
	}
	return ep
}
