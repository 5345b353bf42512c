package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// Bad relay settings are refused as usage errors that name the flag.
func TestRelayOptions(t *testing.T) {
	const eng = "--engine=vllm-0=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5567"
	for _, tc := range []struct {
		name string
		args []string
		want string // "" means valid
	}{
		{"valid", []string{"--nats=nats://n:4222", "--model=m", eng}, ""},
		{"no nats", []string{"--model=m", eng}, "--nats is required"},
		{"no engine", []string{"--nats=nats://n:4222", "--model=m"}, "no engine"},
		{"no model", []string{"--nats=nats://n:4222", eng}, "no model"},
		{"engine twice", []string{"--nats=nats://n:4222", "--model=m", eng, eng}, "used twice"},
		{"small buffer", []string{"--nats=nats://n:4222", "--model=m", eng, "--relay-buffer=1KiB"}, "--relay-buffer"},
		{"heartbeat", []string{"--nats=nats://n:4222", "--model=m", eng, "--heartbeat=1ms"}, "--heartbeat"},
		{"duplicates beyond age", []string{"--nats=nats://n:4222", "--model=m", eng, "--nats-max-age=1m", "--nats-duplicates=2m"}, "duplicate window"},
		{"replicas", []string{"--nats=nats://n:4222", "--model=m", eng, "--nats-replicas=7"}, "replicas"},
		{"stream name", []string{"--nats=nats://n:4222", "--model=m", eng, "--nats-stream=a.b"}, "stream name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f relayFlags
			fs := pflag.NewFlagSet("relay", pflag.ContinueOnError)
			f.register(fs)
			if err := fs.Parse(tc.args); err != nil {
				if tc.want == "" || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("parse: %v", err)
				}
				return
			}
			o, err := f.options()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("accepted, want an error saying %q", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("error %q, want it to say %q", err, tc.want)
			case tc.want != "":
				if _, ok := err.(usageError); !ok {
					t.Errorf("error %T is not a usage error", err)
				}
				return
			}
			var out bytes.Buffer
			if err := checkRelay(&out, o); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out.String(), "engine vllm-0 (model m): tcp://127.0.0.1:5557, replay tcp://127.0.0.1:5567, 1 rank(s)") {
				t.Errorf("--check printed:\n%s", out.String())
			}
		})
	}
}

// A relay needs the key the replicas share, or --nats-insecure said
// aloud; --check reads the key.
func TestRelayAuthKey(t *testing.T) {
	base := []string{"relay", "--nats", "nats://n:4222", "--model", "m", "--engine", "a=tcp://h:1", "--check"}
	for _, tc := range []struct {
		name  string
		extra []string
		code  int
		want  string
	}{
		{"none", nil, exitUsage, "kvindex: NATS mode needs --nats-auth-key FILE"},
		{"missing file", []string{"--nats-auth-key", "/nonexistent/nats.key"}, exitRuntime, "kvindex: --nats-auth-key /nonexistent/nats.key: open /nonexistent/nats.key"},
		{"short key", []string{"--nats-auth-key", writeFile(t, "short.key", "abc\n")}, exitRuntime, "want at least 32"},
		{"key", []string{"--nats-auth-key", writeFile(t, "nats.key", strings.Repeat("k", 32)+"\n")}, exitOK, ""},
		{"insecure", []string{"--nats-insecure"}, exitOK, ""},
	} {
		out, errOut, code := runCLI(t, append(base, tc.extra...)...)
		if code != tc.code || !strings.Contains(errOut, tc.want) || (code == exitOK && !strings.HasPrefix(out, "settings ok")) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit %d saying %q", tc.name, code, out, errOut, tc.code, tc.want)
		}
	}
	// serve --check reads it too.
	_, errOut, code := runCLI(t, "serve", "--check", "--nats", "nats://n:4222", "--model", "m", "--nats-auth-key", "/nonexistent/nats.key")
	if code != exitRuntime || !strings.Contains(errOut, "kvindex: --nats-auth-key /nonexistent/nats.key: open /nonexistent/nats.key") {
		t.Errorf("serve --check with a missing key: exit %d, stderr %q", code, errOut)
	}
}

// What relay's help and its "no engine" hint show passes --check: each
// Example: command line (continuations joined, $POD_NAME set, the key
// file written) and the hint's --engine.
func TestRelayHelpExamplesCheck(t *testing.T) {
	t.Chdir(t.TempDir())
	if err := os.WriteFile("nats.key", []byte(strings.Repeat("ab", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var lines [][]string
	for line := range strings.SplitSeq(strings.ReplaceAll(newRelayCmd().Example, "\\\n", " "), "\n") {
		words := strings.Fields(os.Expand(strings.ReplaceAll(line, `"`, ""), func(string) string { return "vllm-0" }))
		if len(words) < 2 || words[0] != "kvindex" || words[1] != "relay" {
			t.Fatalf("example line %q is not a kvindex relay command line", line)
		}
		lines = append(lines, words[1:])
	}
	_, hint, _ := runCLI(t, "relay", "--nats", "nats://n:4222", "--model", "m")
	_, engine, ok := strings.Cut(hint, "no engine: give --engine POD=ENDPOINT (e.g. --engine ")
	engine, _, _ = strings.Cut(engine, ")")
	if !ok {
		t.Fatalf("no engine hint: %q", hint)
	}
	lines = append(lines, []string{"relay", "--nats", "nats://n:4222", "--model", "m", "--nats-insecure", "--engine", engine})
	for _, args := range lines {
		out, errOut, code := runCLI(t, append(args, "--check")...)
		if code != exitOK || !strings.HasPrefix(out, "settings ok") {
			t.Errorf("%q --check: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
}

// A KVINDEX_* variable that sets no flag of any command is warned of once,
// with the variable it most likely misspells; one of another command's
// flags is not.
func TestUnknownEnvWarned(t *testing.T) {
	t.Setenv("KVINDEX_NATS_INSECURR", "true")
	t.Setenv("KVINDEX_GRPC_ADDR", ":1") // serve's
	_, errOut, code := runCLI(t, "relay", "--nats", "nats://n:4222", "--model", "m", "--engine", "a=tcp://h:1", "--nats-insecure", "--check")
	want := "kvindex: warning: KVINDEX_NATS_INSECURR sets no flag of any kvindex command; ignored (did you mean KVINDEX_NATS_INSECURE?)\n"
	if code != exitOK || errOut != want {
		t.Errorf("exit %d, stderr %q; want %q", code, errOut, want)
	}
}
