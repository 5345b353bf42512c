package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runCLIIn is runCLI with stdin.
func runCLIIn(t *testing.T, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = runIn(args, strings.NewReader(stdin), &out, &errb)
	return out.String(), errb.String(), code
}

// --server takes what people type (client.ParseTarget, whose tests hold
// the forms); one it refuses is a usage error naming the flag, before
// anything is dialled.
func TestServerTarget(t *testing.T) {
	_, errOut, code := runCLI(t, "pods", "--server", "ftp://kvindex")
	if code != exitUsage || !strings.HasPrefix(errOut, `kvindex: --server "ftp://kvindex": `) {
		t.Errorf("ftp: exit %d, %q", code, errOut)
	}
}

// Against a running kvindex: --server with an http:// prefix reaches it;
// --server naming its HTTP port says so; tail --pod refuses a pod the
// server does not know, naming those it does.
func TestCLIServerAndPodChecks(t *testing.T) {
	t.Parallel() // its own service and engines on free ports
	x := startE2E(t, []string{"pod-a", "pod-b"})

	out, errOut, code := runCLI(t, "pods", "--server", "http://"+x.svc.GRPCAddr())
	if code != 0 || !strings.Contains(out, "pod-a") {
		t.Errorf("--server http://%s: exit %d, %q %q", x.svc.GRPCAddr(), code, out, errOut)
	}

	for _, cmd := range [][]string{{"pods"}, {"query", "--tokens", "1,2,3"}, {"tail"}} {
		_, errOut, code = runCLI(t, append(cmd, "--server", x.svc.HTTPAddr())...)
		want := "kvindex: --server " + x.svc.HTTPAddr() + " answers HTTP/1.1, not gRPC: that looks like kvindex's HTTP port (--http-addr); the gRPC API is on --grpc-addr (default :50051)\n"
		if code != exitRuntime || errOut != want {
			t.Errorf("%s at the HTTP port: exit %d, %q; want %q", cmd[0], code, errOut, want)
		}
	}

	// Bounded: a tail that accepted the pod would wait for its events.
	root := newRootCmd()
	root.SetArgs([]string{"tail", "--server", x.svc.GRPCAddr(), "--pod", "pod-a", "--pod", "nosuch"})
	root.SetOut(io.Discard)
	ctx, cancel := context.WithTimeout(context.Background(), e2eDeadline)
	defer cancel()
	err := root.ExecuteContext(ctx)
	want := `--pod "nosuch": kvindex at ` + x.svc.GRPCAddr() + " follows no such pod; known pods: pod-a, pod-b"
	if err == nil || err.Error() != want {
		t.Errorf("tail --pod nosuch: %v; want %q", err, want)
	}
}

// hash refuses fewer tokens than one block instead of printing nothing.
func TestHashShortInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tokens", "1,2,3"}, "kvindex: 3 tokens are less than one block of 16: engines hash only full blocks\n"},
		{[]string{"--tokens", "7"}, "kvindex: 1 token is less than one block of 16: engines hash only full blocks\n"},
		{[]string{"--block-size", "4", "--tokens", "1,2,3"}, "kvindex: 3 tokens are less than one block of 4: engines hash only full blocks\n"},
	} {
		out, errOut, code := runCLI(t, append([]string{"hash"}, tc.args...)...)
		if code != exitRuntime || errOut != tc.want || out != "" {
			t.Errorf("hash %v: exit %d, stdout %q, stderr %q; want exit 1 and %q", tc.args, code, out, errOut, tc.want)
		}
	}
}

// "-" as --tokens-file or --messages-file reads stdin.
func TestStdinFiles(t *testing.T) {
	want, _, code := runCLI(t, "hash", "--tokens", range48)
	if code != 0 {
		t.Fatal("hash --tokens failed")
	}
	for _, in := range []string{range48, "[" + range48 + "]", strings.ReplaceAll(range48, ",", "\n")} {
		out, errOut, code := runCLIIn(t, in, "hash", "--tokens-file", "-")
		if code != 0 || out != want {
			t.Errorf("hash --tokens-file - with %.20q...: exit %d, %q, %q", in, code, out, errOut)
		}
	}
	_, errOut, code := runCLIIn(t, "", "hash", "--tokens-file", "-")
	if code != exitRuntime || errOut != "kvindex: --tokens-file - (stdin) is empty\n" {
		t.Errorf("empty stdin: exit %d, %q", code, errOut)
	}
	_, errOut, code = runCLIIn(t, "[1,x]", "hash", "--tokens-file", "-")
	if code != exitRuntime || !strings.HasPrefix(errOut, "kvindex: --tokens-file - (stdin): not a JSON array of integers") {
		t.Errorf("bad stdin: exit %d, %q", code, errOut)
	}
	// --messages-file - reads stdin as well: the bad message names it.
	_, errOut, code = runCLIIn(t, `{"messages":"hi"}`, "query", "--messages-file", "-", "--server", "127.0.0.1:1")
	if code != exitRuntime || !strings.HasPrefix(errOut, "kvindex: --messages-file - (stdin): want a JSON array") {
		t.Errorf("--messages-file -: exit %d, %q", code, errOut)
	}
}

// demo --out is checked before the simulation runs, not after.
func TestDemoOutCheckedFirst(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(file, "charts")
	root := newRootCmd()
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	// A run far too long to finish: the check must come before it.
	root.SetArgs([]string{"demo", "--requests", "1000000", "--out", dir})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := root.ExecuteContext(ctx)
	want := "--out " + dir + ": cannot create the directory: not a directory"
	if err == nil || err.Error() != want {
		t.Fatalf("demo --out under a file: %v; want %q", err, want)
	}
	if out.Len() != 0 {
		t.Errorf("printed %q before refusing --out", out.String())
	}
}
