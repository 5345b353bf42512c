package client

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
)

// grpcSchemes are gRPC's own target schemes, which ParseTarget passes
// through as gRPC reads them (e.g. dns:///kvindex:50051,
// unix:///run/kvindex.sock).
var grpcSchemes = []string{"dns", "unix", "unix-abstract", "passthrough", "ipv4", "ipv6", "xds"}

// targetForms says what ParseTarget accepts, for its errors.
const targetForms = "want HOST[:PORT] (port " + DefaultPort + " when omitted), optionally after http://, grpc://, https:// or grpcs://"

// ParseTarget turns an address as people type it into the gRPC target to
// dial: HOST:PORT, with DefaultPort added to a bare host (a name, an IPv4
// address, or an IPv6 address with or without brackets), and an http://,
// grpc://, https:// or grpcs:// prefix dropped; useTLS is true for the
// last two. gRPC's own target schemes (dns:///, unix://, passthrough:///,
// ...) pass through unchanged. Surrounding spaces are ignored. Anything
// else, such as a URL with a path or a port outside 1..65535, is an error
// that says what is accepted.
func ParseTarget(s string) (target string, useTLS bool, err error) {
	s = strings.TrimSpace(s)
	if scheme, rest, ok := strings.Cut(s, ":"); ok && slices.Contains(grpcSchemes, scheme) && (strings.HasPrefix(rest, "/") || strings.HasPrefix(scheme, "unix")) {
		return s, false, nil
	}
	if scheme, rest, ok := strings.Cut(s, "://"); ok {
		switch strings.ToLower(scheme) {
		case "http", "grpc":
			s = strings.TrimSuffix(rest, "/")
		case "https", "grpcs":
			s, useTLS = strings.TrimSuffix(rest, "/"), true
		default:
			return "", false, fmt.Errorf("unknown scheme %q: %s", scheme, targetForms)
		}
	}
	if s == "" || strings.ContainsAny(s, "/ ") {
		return "", false, errors.New(targetForms)
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		// No port: a host name, an IPv4 address, or an IPv6 address with
		// or without brackets.
		host = s
		if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
			host = s[1 : len(s)-1]
		}
		if strings.Contains(host, ":") && net.ParseIP(host) == nil || strings.ContainsAny(host, "[]") {
			return "", false, errors.New(targetForms)
		}
		port = DefaultPort
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", false, fmt.Errorf("port %q is not a number in 1..65535: %s", port, targetForms)
	}
	return net.JoinHostPort(host, port), useTLS, nil
}

// IsHTTP1Answer reports whether err is gRPC's failure when the peer
// speaks HTTP/1.1 rather than gRPC (its reply reads as an oversized
// HTTP/2 frame): the address is most likely a server's HTTP port, such
// as kvindex's own HTTP API, rather than its gRPC port.
func IsHTTP1Answer(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "looked like an HTTP/1.1 header") || strings.Contains(msg, "http2: frame too large")
}
