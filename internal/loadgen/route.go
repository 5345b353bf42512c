package loadgen

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// Route kinds.
const (
	RoundRobin = "round-robin" // the endpoints in turn: the cache-blind baseline
	Pick       = "pick"        // ask a kvindex picker's /v1/pick, then send to its endpoint
	Gateway    = "gateway"     // send everything to one gateway, which routes
)

// PickPath is the picker's decision endpoint, added to a pick URL that
// names no path.
const PickPath = "/v1/pick"

// Endpoint is one engine a round-robin route sends to.
type Endpoint struct {
	Pod  string
	Addr string // HOST:PORT of its OpenAI HTTP API
}

// ParseEndpoint parses POD=HOST:PORT.
func ParseEndpoint(s string) (Endpoint, error) {
	pod, addr, ok := strings.Cut(s, "=")
	if !ok || pod == "" {
		return Endpoint{}, fmt.Errorf("endpoint %q: want POD=HOST:PORT", s)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return Endpoint{}, fmt.Errorf("endpoint %q: want POD=HOST:PORT, the address %q is not HOST:PORT", s, addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return Endpoint{}, fmt.Errorf("endpoint %q: port %q is not a number from 1 to 65535", s, port)
	}
	return Endpoint{Pod: pod, Addr: addr}, nil
}

// Route is how a run sends each request: to the endpoints in turn, to the
// endpoint a picker chooses, or through a gateway.
type Route struct {
	Kind      string     // RoundRobin, Pick or Gateway
	URL       string     // Pick: the picker's /v1/pick URL; Gateway: its base URL
	Endpoints []Endpoint // RoundRobin: the engines
}

// String is the route as ParseRoute reads it back.
func (r Route) String() string {
	if r.Kind == RoundRobin {
		return RoundRobin
	}
	return r.Kind + "=" + r.URL
}

// ParseRoute parses "round-robin" (sending to endpoints, of which it
// needs one at least), "pick=URL" or "gateway=URL". A URL without a scheme
// is taken as http://; a pick URL without a path gets PickPath.
func ParseRoute(s string, endpoints []Endpoint) (Route, error) {
	kind, arg, hasArg := strings.Cut(s, "=")
	switch kind {
	case RoundRobin:
		if hasArg {
			return Route{}, fmt.Errorf("route %q: round-robin takes no URL, it sends to the --endpoint engines", s)
		}
		if len(endpoints) == 0 {
			return Route{}, fmt.Errorf("route round-robin needs the engines: give --endpoint POD=HOST:PORT for each")
		}
		return Route{Kind: RoundRobin, Endpoints: endpoints}, nil
	case Pick, Gateway:
		if !hasArg || arg == "" {
			return Route{}, fmt.Errorf("route %q: want %s=URL", s, kind)
		}
		u, err := baseURL(arg)
		if err != nil {
			return Route{}, fmt.Errorf("route %q: %w", s, err)
		}
		if kind == Pick && (u.Path == "" || u.Path == "/") {
			u.Path = PickPath
		}
		if kind == Gateway {
			u.Path = strings.TrimSuffix(u.Path, "/")
		}
		return Route{Kind: kind, URL: u.String()}, nil
	}
	return Route{}, fmt.Errorf("unknown route %q: want round-robin, pick=URL or gateway=URL", s)
}

// baseURL parses an http(s) URL, taking one without a scheme as http://.
func baseURL(s string) (*url.URL, error) {
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("bad URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("URL scheme %q: want http or https", u.Scheme)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("URL %q names no host", s)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("URL %q: want no query or fragment", s)
	}
	return u, nil
}
