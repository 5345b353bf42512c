package service

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// A listener other hosts can reach is named once, at WARN, with what such
// a host may do; loopback listeners and absent ones are not.
func TestLogBeyondLoopback(t *testing.T) {
	for _, tc := range []struct {
		addrs []string
		warn  []string
	}{
		{[]string{"127.0.0.1:9002", "[::1]:9003", "localhost:8080", ""}, nil},
		{[]string{":9002", "127.0.0.1:9003"}, []string{":9002"}},
		{[]string{"[::]:9002", "0.0.0.0:9003", "10.0.0.5:9004"}, []string{"[::]:9002", "0.0.0.0:9003", "10.0.0.5:9004"}},
		{[]string{"no port"}, []string{"no port"}},
	} {
		var buf bytes.Buffer
		logBeyondLoopback(slog.New(slog.NewTextHandler(&buf, nil)), "may pick", tc.addrs...)
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		if len(tc.warn) == 0 {
			if buf.Len() != 0 {
				t.Errorf("%q: logged %s", tc.addrs, buf.String())
			}
			continue
		}
		if len(lines) != len(tc.warn) {
			t.Fatalf("%q: %d lines, want %d: %s", tc.addrs, len(lines), len(tc.warn), buf.String())
		}
		for i, l := range lines {
			if !strings.Contains(l, "level=WARN") || !strings.Contains(l, "any host that reaches this address may pick") || !strings.Contains(l, "addr="+quoteIfNeeded(tc.warn[i])) {
				t.Errorf("%q: line %d = %s", tc.addrs, i, l)
			}
		}
	}
}

func quoteIfNeeded(s string) string {
	if strings.ContainsAny(s, " =\"") {
		return `"` + s + `"`
	}
	return s
}
