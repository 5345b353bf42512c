package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/loadgen"
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

// kvindex loadgen sends a kvindex trace's text prompts as chat messages
// to simulated engines that tokenize them, once per route: through a
// "gateway" that is one engine, the later turns of a session find the
// earlier ones' blocks in its cache.
func TestLoadgenChatTrace(t *testing.T) {
	const tk = "../../tokenizer/testdata/qwen2.5/tokenizer.json.gz"
	sim := startSim(t, "--engines", "2", "--tokenizer", tk, "--rate", "0", "--http-port", "8000", "--prefill-per-token", "0")
	var lines []string
	for turn := range 3 {
		for _, s := range []string{"a", "b"} {
			text := "You are the assistant of user " + s + "." + strings.Repeat(" Tell me more about caches.", 8*(turn+1))
			lines = append(lines, fmt.Sprintf(`{"timestamp": %d, "session_id": %q, "text": %q, "output_length": 8}`, 10*len(lines), s, text))
		}
	}
	file := filepath.Join(t.TempDir(), "chat.jsonl")
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"loadgen", "--trace", file, "--tokenizer", tk, "--api", "chat", "--compare", "round-robin", "gateway=" + sim.run.Fronts()[0].Addr}
	for i, f := range sim.run.Fronts() {
		args = append(args, "--endpoint", fmt.Sprintf("pod-%d=%s", i, f.Addr))
	}
	out, errOut, code := runCLI(t, append(args, "--json")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep loadgen.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if len(rep.Results) != 2 || rep.Requests != 6 || rep.Trace == nil || rep.Trace.Sessions != 2 {
		t.Fatalf("report %+v, want 2 routes of the trace's 6 requests in 2 sessions", rep)
	}
	for _, r := range rep.Results {
		if r.Requests != 6 || r.Errors != 0 || r.PromptTokens == 0 {
			t.Errorf("%s: %d requests, %d errors (%s), %d prompt tokens", r.Route, r.Requests, r.Errors, r.FirstError, r.PromptTokens)
		}
	}
	// Turns 2 and 3 resend turns 1 and 2 (8 and 16 of their 16 and 24
	// sentences): half of all the tokens, less the partial blocks.
	if gw := rep.Results[1]; gw.CachedFraction < 0.4 || gw.Pods != nil {
		t.Errorf("through one engine: cached fraction %v, want the later turns' earlier blocks (about half), and no pods named (got %v)", gw.CachedFraction, gw.Pods)
	}
	out, _, code = runCLI(t, args...)
	if want := "input: " + file + ", 6 requests"; code != 0 || !strings.HasPrefix(out, want) || !strings.Contains(out, "gateway=http://"+sim.run.Fronts()[0].Addr) {
		t.Errorf("exit %d, table:\n%s\nwant it to start %q and name both routes", code, out, want)
	}
}
