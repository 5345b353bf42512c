package client_test

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/client"
)

// An address as people type it: a bare host gets the default gRPC port,
// http:// and grpc:// prefixes are dropped, https:// and grpcs:// ask for
// TLS, gRPC's own schemes pass through, and anything else is refused
// naming what is accepted.
func TestParseTarget(t *testing.T) {
	const forms = "want HOST[:PORT] (port 50051 when omitted), optionally after http://, grpc://, https:// or grpcs://"
	for _, tc := range []struct {
		in, want string
		tls      bool
		err      string // the whole error
	}{
		{in: "localhost", want: "localhost:50051"},
		{in: "localhost:6000", want: "localhost:6000"},
		{in: "kvindex.default.svc", want: "kvindex.default.svc:50051"},
		{in: "10.0.0.5", want: "10.0.0.5:50051"},
		{in: "::1", want: "[::1]:50051"},
		{in: "[::1]", want: "[::1]:50051"},
		{in: "[::1]:7000", want: "[::1]:7000"},
		{in: "http://localhost:50051", want: "localhost:50051"},
		{in: "HTTP://localhost:50051", want: "localhost:50051"},
		{in: "http://kvindex/", want: "kvindex:50051"},
		{in: "grpc://10.0.0.5:6000", want: "10.0.0.5:6000"},
		{in: " localhost:6000 ", want: "localhost:6000"},
		{in: "dns:///kvindex:50051", want: "dns:///kvindex:50051"},
		{in: "unix:///run/kvindex.sock", want: "unix:///run/kvindex.sock"},
		{in: "unix:kvindex.sock", want: "unix:kvindex.sock"},
		{in: "passthrough:///10.0.0.5:6000", want: "passthrough:///10.0.0.5:6000"},
		{in: "https://kvindex:50051", want: "kvindex:50051", tls: true},
		{in: "grpcs://kvindex", want: "kvindex:50051", tls: true},
		{in: "ftp://kvindex", err: `unknown scheme "ftp": ` + forms},
		{in: "://kvindex", err: `unknown scheme "": ` + forms},
		{in: "http://kvindex:50051/v1/pods", err: forms},
		{in: "http://", err: forms},
		{in: "kvindex:http", err: `port "http" is not a number in 1..65535: ` + forms},
		{in: "kvindex:0", err: `port "0" is not a number in 1..65535: ` + forms},
		{in: "kvindex:65536", err: `port "65536" is not a number in 1..65535: ` + forms},
		{in: "kvindex:-1", err: `port "-1" is not a number in 1..65535: ` + forms},
		{in: "kvindex:", err: `port "" is not a number in 1..65535: ` + forms},
		{in: "", err: forms},
		{in: "   ", err: forms},
		{in: "a:b:c", err: forms},
		{in: "kv index", err: forms},
		{in: "[kvindex", err: forms},
		{in: "[::1", err: forms},
		{in: "dns:kvindex", err: `port "kvindex" is not a number in 1..65535: ` + forms},
	} {
		got, useTLS, err := client.ParseTarget(tc.in)
		switch {
		case tc.err == "" && (err != nil || got != tc.want || useTLS != tc.tls):
			t.Errorf("ParseTarget(%q) = %q, %v, %v; want %q, %v", tc.in, got, useTLS, err, tc.want, tc.tls)
		case tc.err != "" && (err == nil || err.Error() != tc.err || got != "" || useTLS):
			t.Errorf("ParseTarget(%q) = %q, %v, %v; want the error %q", tc.in, got, useTLS, err, tc.err)
		}
	}
}

// FuzzParseTarget: any input gives a target or an error, never a panic;
// a target that is not one of gRPC's own passes through as HOST:PORT
// with a port in range.
func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{"localhost", "[::1]:7000", "https://kvindex/", "unix:///run/k.sock", "ftp://x", "a:b:c", "\x00:\xff", "[]:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		target, useTLS, err := client.ParseTarget(s)
		if err != nil {
			if target != "" || useTLS {
				t.Errorf("ParseTarget(%q) = %q, %v with the error %v", s, target, useTLS, err)
			}
			return
		}
		if target == strings.TrimSpace(s) && strings.Contains(target, ":/") || strings.HasPrefix(target, "unix") {
			return // one of gRPC's own schemes
		}
		_, port, perr := net.SplitHostPort(target)
		if n, aerr := strconv.Atoi(port); perr != nil || aerr != nil || n < 1 || n > 65535 {
			t.Errorf("ParseTarget(%q) = %q, not HOST:PORT with a port in 1..65535", s, target)
		}
	})
}

// gRPC's failure when the peer answers in HTTP/1.1 is told from other
// failures, and wrapped or not.
func TestIsHTTP1Answer(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{status.Error(codes.Unavailable, `connection error: desc = "error reading server preface: http2: frame too large"`), true},
		{fmt.Errorf("cannot reach kvindex at x: %w", errors.New("http2: failed reading the frame payload: http2: frame too large, note that the frame header looked like an HTTP/1.1 header")), true},
		{status.Error(codes.Unavailable, "connection refused"), false},
		{errors.New(""), false},
		{nil, false},
	} {
		if got := client.IsHTTP1Answer(tc.err); got != tc.want {
			t.Errorf("IsHTTP1Answer(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
