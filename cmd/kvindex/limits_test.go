package main

import (
	"strings"
	"testing"
)

// Resource bounds are positive, and the tokens in flight fit the largest
// query; anything else is a usage error naming the flag.
func TestServeLimitFlagErrors(t *testing.T) {
	base := []string{"serve", "--check", "--listen", "tcp://*:1", "--engine-allow", "*=127.0.0.1"}
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--http-max-conns", "0"}, "kvindex: --http-max-conns 0: want a positive value"},
		{[]string{"--http-read-timeout", "0s"}, "kvindex: --http-read-timeout 0s: want a positive value"},
		{[]string{"--grpc-max-conn-idle", "-1s"}, "kvindex: --grpc-max-conn-idle -1s: want a positive value"},
		{[]string{"--watch-queue-bytes", "0"}, "kvindex: --watch-queue-bytes 0: want a positive value"},
		{[]string{"--max-watchers", "-3"}, "kvindex: --max-watchers -3: want a positive value"},
		{[]string{"--max-query-tokens", "300000000"}, "kvindex: --max-query-tokens 300000000: want an integer in 1..200000000"},
		{[]string{"--max-query-tokens", "1000", "--max-tokens-in-flight", "999"}, "kvindex: --max-tokens-in-flight 999 is below --max-query-tokens 1000"},
	}
	for _, tc := range tests {
		_, stderr, code := runCLI(t, append(base, tc.args...)...)
		const hint = " (see 'kvindex serve --help')\n"
		if code != exitUsage || !strings.HasPrefix(stderr, tc.want) || !strings.HasSuffix(stderr, hint) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and one line starting %q", tc.args, code, stderr, tc.want)
		}
	}
	if out, stderr, code := runCLI(t, append(base, "--max-query-tokens", "1000", "--max-tokens-in-flight", "1000")...); code != 0 {
		t.Errorf("tokens in flight equal to the largest query: exit %d, %s%s", code, out, stderr)
	}
}
