package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// kvindex loadgen refuses bad routes, endpoints and settings as usage
// errors, on one line, before it sends anything.
func TestLoadgenBadFlags(t *testing.T) {
	text := filepath.Join(t.TempDir(), "text.jsonl")
	if err := os.WriteFile(text, []byte(`{"timestamp": 0, "token_ids": [1, 2, 3], "output_length": 4}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no route: give --route round-robin, --route pick=URL or --route gateway=URL"},
		{[]string{"--route", "random"}, `unknown route "random": want round-robin, pick=URL or gateway=URL`},
		{[]string{"--route", "round-robin"}, "route round-robin needs the engines: give --endpoint POD=HOST:PORT for each"},
		{[]string{"--route", "round-robin=http://x"}, `route "round-robin=http://x": round-robin takes no URL`},
		{[]string{"--route", "pick"}, `route "pick": want pick=URL`},
		{[]string{"--route", "pick="}, `route "pick=": want pick=URL`},
		{[]string{"--route", "gateway=ftp://x"}, `route "gateway=ftp://x": URL scheme "ftp": want http or https`},
		{[]string{"--route", "gateway=http://x/?a=b"}, `route "gateway=http://x/?a=b": URL "http://x/?a=b": want no query or fragment`},
		{[]string{"--route", "round-robin", "--endpoint", "127.0.0.1:8000"}, `--endpoint: endpoint "127.0.0.1:8000": want POD=HOST:PORT`},
		{[]string{"--route", "round-robin", "--endpoint", "pod-0=localhost"}, `--endpoint: endpoint "pod-0=localhost": want POD=HOST:PORT, the address "localhost" is not HOST:PORT`},
		{[]string{"--route", "round-robin", "--endpoint", "pod-0=h:99999"}, `--endpoint: endpoint "pod-0=h:99999": port "99999" is not a number from 1 to 65535`},
		{[]string{"--route", "pick=x", "--route", "gateway=y"}, "2 routes: give --compare to run each"},
		{[]string{"--route", "pick=x", "gateway=y"}, `kvindex loadgen takes routes as arguments with --compare only, got "gateway=y"`},
		{[]string{"--route", "pick=x", "--sessions", "0"}, "--sessions 0: want at least 1"},
		{[]string{"--route", "pick=x", "--rate", "0"}, "--rate 0: want requests per second, above 0"},
		{[]string{"--route", "pick=x", "--requests", "-1"}, "--requests -1: want 0 (all) or more"},
		{[]string{"--route", "pick=x", "--api", "grpc"}, `--api "grpc": want chat or completions`},
		{[]string{"--route", "pick=x", "--api", "chat"}, "--api chat sends text, and the prompts of agents are token ids: use --api completions"},
		{[]string{"--route", "pick=x", "--concurrency", "0"}, "--concurrency 0: want 1..65536"},
		{[]string{"--route", "pick=x", "--trace", "/nonexistent/t.jsonl"}, "--trace: open /nonexistent/t.jsonl: no such file or directory"},
		{[]string{"--route", "pick=x", "--trace", text, "--time-scale", "-1"}, "--time-scale must be > 0 (got -1)"},
		{[]string{"--route", "pick=x", "--trace", text, "--rate", "8"}, "--rate shapes the built-in workload, which --trace replaces"},
		{[]string{"--route", "pick=x", "--trace", text, "--sessions", "8"}, "--sessions shapes the built-in workload, which --trace replaces"},
		{[]string{"--route", "pick=x", "--time-scale", "2"}, "--time-scale applies to --trace only"},
		{[]string{"--route", "pick=x", "--tokenizer", "t.json"}, "--tokenizer applies to --trace only"},
		{[]string{"--route", "pick=x", "--trace", text, "--api", "chat"}, "--api chat sends text, and the prompts of " + text + " are token ids"},
	} {
		_, errOut, code := runCLI(t, append([]string{"loadgen"}, tc.args...)...)
		if code != exitUsage || !strings.HasPrefix(errOut, "kvindex: "+tc.want) || !strings.HasSuffix(errOut, "(see 'kvindex loadgen --help')\n") {
			t.Errorf("%v: exit %d, %q; want exit %d and %q", tc.args, code, errOut, exitUsage, tc.want)
		}
	}
}
