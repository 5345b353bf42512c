package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/flagsource"
	"github.com/kvindex/kvindex/internal/service"
)

// parseServe parses serve's flags, environment and config file the way
// the command does, without starting anything.
func parseServe(t *testing.T, args ...string) (*service.Options, *serveFlags, error) {
	t.Helper()
	return parseServeEnv(t, nil, args...)
}

// parseServeEnv is parseServe with environment variables env.
func parseServeEnv(t *testing.T, env map[string]string, args ...string) (*service.Options, *serveFlags, error) {
	t.Helper()
	var f serveFlags
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	if err := configUsage(flagsource.Apply(fs, "kvindex serve", lookup), flagNames(fs)); err != nil {
		return nil, nil, err
	}
	o, err := f.options()
	return o, &f, err
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestServeConfigFile(t *testing.T) {
	cfg := writeFile(t, "kvindex.yaml", `
grpc-addr: ":6000"
http-addr: ":6001"
model: qwen
engine:
  - a=tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5558
  - b=tcp://10.0.0.6:5557,ranks=2
hash-algo: sha256_cbor
hash-seed: "42"
block-size: 32
memory-budget: 1.5GiB
ready-grace: 5s
admin-addr: 127.0.0.1:6060
log-format: json
`)
	o, f, err := parseServe(t, "--config", cfg, "--http-addr", ":7001", "--hash-seed", "7")
	if err != nil {
		t.Fatal(err)
	}
	hc := o.Index.Hasher.Config()
	switch {
	case o.GRPCAddr != ":6000":
		t.Errorf("grpc-addr %q from the file", o.GRPCAddr)
	case o.HTTPAddr != ":7001":
		t.Errorf("http-addr %q: the flag must override the file", o.HTTPAddr)
	case hc.Seed != "7" || hc.Algo != blockhash.SHA256CBOR || hc.BlockSize != 32:
		t.Errorf("hasher %+v", hc)
	case o.Index.MemoryBudget != 1536<<20:
		t.Errorf("memory budget %d", o.Index.MemoryBudget)
	case len(o.Engines) != 2 || o.Engines[1].Ranks != 2 || o.Engines[0].ReplayEndpoint != "tcp://10.0.0.5:5558" || o.Engines[0].Model != "qwen":
		t.Errorf("engines %+v", o.Engines)
	case o.ReadyGrace != 5*time.Second || o.AdminAddr != "127.0.0.1:6060" || f.log.format != "json":
		t.Errorf("grace %v admin %q log format %q", o.ReadyGrace, o.AdminAddr, f.log.format)
	}

	// Engines on the command line replace the file's list.
	o, _, err = parseServe(t, "--config", cfg, "--engine", "c=tcp://h:1")
	if err != nil || len(o.Engines) != 1 || o.Engines[0].Name != "c" {
		t.Errorf("engines from flags: %+v %v", o.Engines, err)
	}
}

func TestServeConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		file string
		args []string
		err  string
	}{
		{"typo", "grpc-adr: \":1\"\n", nil, `--config ` /* path */},
		{"typo key", "model: m\ngrpc-adr: \":1\"\n", nil, `line 2: unknown key "grpc-adr" (keys are the flag names of kvindex serve)`},
		{"bad type", "block-size: sixteen\n", nil, `line 1: block-size: invalid argument "sixteen"`},
		{"bad size", "memory-budget: lots\n", nil, `line 1: memory-budget: invalid argument "lots"`},
		{"list for one value", "model: [a, b]\n", nil, "line 1: model takes one value, not a list"},
		{"mapping value", "model: {a: b}\n", nil, "line 1: model: want a plain value"},
		{"twice", "model: a\nmodel: b\n", nil, `line 2: key "model" given twice`},
		{"not a mapping", "- a\n", nil, "want a mapping of flag names to values"},
		{"help is no setting", "help: true\n", nil, `unknown key "help"`},
		{"bad value", "ready-grace: soon\n", nil, `ready-grace`},
		{"not yaml", "engine: [\n", nil, "--config"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--config", writeFile(t, "c.yaml", tc.file)}, tc.args...)
			_, _, err := parseServe(t, args...)
			if err == nil || !strings.Contains(err.Error(), tc.err) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q, want one line containing %q", err, tc.err)
			}
		})
	}
	if _, _, err := parseServe(t, "--config", filepath.Join(t.TempDir(), "missing.yaml")); err == nil || !strings.Contains(err.Error(), "--config") {
		t.Errorf("missing file: %v", err)
	}
	// An empty file is no error.
	if _, _, err := parseServe(t, "--config", writeFile(t, "e.yaml", ""), "--listen", "tcp://*:5557", "--engine-allow", "*=127.0.0.1"); err != nil {
		t.Errorf("empty file: %v", err)
	}
}

// Bad settings stop serve with exit status 2 and exactly one line on
// stderr, which ends by naming the help to read.
func TestServeFlagErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"serve"}, "kvindex: no event source: give --engine NAME=ENDPOINT (connect mode), --discover-selector LABELS (connect mode, pods found on Kubernetes), --listen ENDPOINT (bind mode) or --nats URL (NATS mode, fed by kvindex relay)"},
		{[]string{"serve", "--nats", "nats://n:4222", "--model", "m", "--listen", "tcp://*:1", "--engine-allow", "*=127.0.0.1"}, "kvindex: --nats replaces --engine, --listen and --discover-selector"},
		{[]string{"serve", "--nats", "nats://n:4222", "--model", "m", "--state-dir", "/tmp/x"}, "kvindex: --state-dir does not apply with --nats"},
		{[]string{"serve", "--nats", "nats://n:4222"}, "kvindex: --nats needs --model"},
		{[]string{"serve", "--nats", "nats://n:4222", "--model", "m"}, "kvindex: NATS mode needs --nats-auth-key FILE"},
		{[]string{"serve", "--nats", "nats://n:4222", "--model", "m", "--nats-auth-key", "k", "--nats-insecure"}, "kvindex: --nats-auth-key and --nats-insecure: give one"},
		{[]string{"serve", "--listen", "tcp://*:1", "--engine-allow", "*=127.0.0.1", "--snapshot-keep", "3"}, "kvindex: --snapshot-bucket and --snapshot-keep apply to NATS mode (--nats) only"},
		{[]string{"serve", "--nats", "nats://n:4222", "--model", "m", "--snapshot-keep", "0"}, "kvindex: --snapshot-keep 0: want at least 1"},
		{[]string{"serve", "--nats", "nats://n:4222", "--model", "m", "--nats-max-age", "1m"}, "kvindex: --nats-stream settings: stream duplicate window 2m0s exceeds its max age 1m0s"},
		{[]string{"serve", "--engine", "a"}, "kvindex: --engine \"a\": missing \"=ENDPOINT\" (want NAME=ENDPOINT[,replay=ENDPOINT][,ranks=N][,model=M])"},
		{[]string{"serve", "--model", "m", "--engine", "a=tcp://x:1", "--engine", "a=tcp://y:1"}, "kvindex: --engine \"a=tcp://y:1\": the name \"a\" is used twice"},
		{[]string{"serve", "--listen", "tcp://*:1", "--engine-allow", "*=127.0.0.1", "--hash-algo", "md5"}, "kvindex: unknown --hash-algo \"md5\""},
		{[]string{"serve", "--listen", "tcp://*:1", "--engine-allow", "*=127.0.0.1", "--block-size", "0"}, "kvindex: --block-size 0 out of range"},
		{[]string{"serve", "--listen", "tcp://*:1", "--engine-allow", "*=127.0.0.1", "--memory-budget", "lots"}, "kvindex: invalid argument \"lots\" for \"--memory-budget\" flag: \"lots\": want a size"},
		{[]string{"serve", "--listen", "tcp://*:1", "--engine-allow", "*=127.0.0.1", "--max-engines", "-1"}, "kvindex: --max-engines -1: want at least 1 (0: from the memory budget)"},
		{[]string{"serve", "--listen", "tcp://*:1", "--engine-allow", "*=127.0.0.1", "--log-level", "loud"}, "kvindex: --log-level \"loud\": want debug, info, warn or error"},
		{[]string{"serve", "--listen", "tcp://*:1", "--engine-allow", "*=127.0.0.1", "--log-format", "xml"}, "kvindex: --log-format \"xml\": want text or json"},
		{[]string{"serve", "--listen", "tcp://*:1", "--engine-allow", "*=127.0.0.1", "--grpc-addr", ":9", "--http-addr", ":9"}, "kvindex: --grpc-addr and --http-addr are both \":9\""},
		{[]string{"serve", "--listen", "tcp://*:1", "--engine-allow", "*=127.0.0.1", "--tokenizer", "/nonexistent/tokenizer.json", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, "kvindex: --tokenizer /nonexistent/tokenizer.json: "},
		{[]string{"serve", "--listen", "tcp://*:1", "--engine-allow", "*=127.0.0.1", "--chat-template", "/nonexistent/t.jinja", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, "kvindex: --chat-template needs --tokenizer: "},
		{[]string{"serve", "--listen", "tcp://*:1", "--engine-allow", "*=127.0.0.1", "--tokenizer", "../../tokenizer/testdata/qwen2.5/tokenizer.json.gz", "--chat-template", "/nonexistent/t.jinja", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, "kvindex: --chat-template: chat template: open /nonexistent/t.jinja"},
		{[]string{"serve", "--listen", "tcp://*:1", "--engine-allow", "*=127.0.0.1", "--tokenize-url", "vllm:8000", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, "kvindex: --tokenize-url: base URL \"vllm:8000\""},
		{[]string{"serve", "--listen", "tcp://*:1", "--engine-allow", "*=127.0.0.1", "--topic-pattern", "kv@{model}", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, "kvindex: --topic-pattern: topic template \"kv@{model}\" has no {pod}"},
		{[]string{"serve", "--listen", "tcp://*:1", "--engine-allow", "*=127.0.0.1", "--replay-template", "tcp://x:1", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, "kvindex: --replay-template \"tcp://x:1\": no {addr} or {pod}"},
		// Data-parallel layouts: every rank's ports, within and across engines.
		// (--check: a setting that is wrongly accepted fails at once
		// instead of starting a server.)
		{[]string{"serve", "--check", "--model", "m", "--engine", "pod-a=tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5567", "--engine", "pod-b=tcp://10.0.0.6:5557,replay=tcp://10.0.0.6:5558,ranks=2"},
			"kvindex: --engine \"pod-b=tcp://10.0.0.6:5557,replay=tcp://10.0.0.6:5558,ranks=2\": ranks=2 uses event ports 5557-5558 and replay ports 5558-5559, which overlap at 5558; vLLM offsets both by the rank, so leave a gap: replay=tcp://10.0.0.6:5567"},
		{[]string{"serve", "--check", "--model", "m", "--engine", "a=tcp://h:5557,ranks=2", "--engine", "b=tcp://h:5558"},
			"kvindex: --engine \"b=tcp://h:5558\": event port 5558 is taken: engine \"a\" uses it for rank 1's events"},
		// Endpoints.
		{[]string{"serve", "--check", "--model", "m", "--engine", "a=tcp://*:5557"}, "kvindex: --engine \"a=tcp://*:5557\": a connect-mode endpoint needs the engine's host"},
		{[]string{"serve", "--check", "--model", "m", "--engine", "a=127.0.0.1"}, "kvindex: --engine \"a=127.0.0.1\": endpoint \"tcp://127.0.0.1\": no port"},
		{[]string{"serve", "--check", "--listen", "tcp://127.0.0.1:99999"}, "kvindex: --listen \"tcp://127.0.0.1:99999\": port \"99999\" is not in 1..65535"},
		{[]string{"serve", "--check", "--listen", "127.0.0.1"}, "kvindex: --listen \"127.0.0.1\": no port"},
		{[]string{"serve", "--check", "--listen", "tcp://*:*", "--listen-ranks", "2"}, "kvindex: --listen \"tcp://*:*\": an ephemeral port (\"*\") cannot be offset by the rank"},
		{[]string{"serve", "--check", "--listen", "tcp://*:65535", "--listen-ranks", "2"}, "kvindex: --listen \"tcp://*:65535\": port 65535 cannot be offset by 2 data-parallel ranks"},
		{[]string{"serve", "--check", "--listen", "tcp://*:5557", "--listen-ranks", "0"}, "kvindex: --listen-ranks 0: want an integer in 1..1024"},
		{[]string{"serve", "--check", "--listen", "tcp://*:5557"}, "kvindex: bind mode (--listen) needs engine allow rules (--engine-allow POD=CIDR) or discovery (--discover-selector)"},
		{[]string{"serve", "--check", "--listen", "tcp://*:1", "--engine-allow", "*=127.0.0.1", "--replay-template", "tcp://{pod}:0"}, "kvindex: --replay-template \"tcp://{pod}:0\": port \"0\": connecting needs the engine's port"},
		// Engine allow rules.
		{[]string{"serve", "--check", "--listen", "tcp://*:1", "--engine-allow", "*=127.0.0.1", "--engine-allow", "vllm-0"}, "kvindex: --engine-allow \"vllm-0\": no '='"},
		{[]string{"serve", "--check", "--listen", "tcp://*:1", "--engine-allow", "*=127.0.0.1", "--engine-allow", "=10.0.0.0/8"}, "kvindex: --engine-allow \"=10.0.0.0/8\": empty pod"},
		{[]string{"serve", "--check", "--listen", "tcp://*:1", "--engine-allow", "*=127.0.0.1", "--engine-allow", "p=10.0.0.0/33"}, "kvindex: --engine-allow \"p=10.0.0.0/33\": \"10.0.0.0/33\" is not an IP network or address"},
		{[]string{"serve", "--check", "--listen", "tcp://*:1", "--engine-allow", "*=127.0.0.1", "--engine-allow", "p=10.1.2.3/16"}, "kvindex: --engine-allow \"p=10.1.2.3/16\": network 10.1.2.3/16 has bits set beyond its /16 prefix; did you mean 10.1.0.0/16?"},
		{[]string{"serve", "--check", "--listen", "tcp://*:1", "--engine-allow", "*=127.0.0.1", "--engine-allow", "p=10.0.0.5", "--engine-allow", "p=10.0.0.5/32"}, "kvindex: --engine-allow \"p=10.0.0.5/32\": the same rule as \"p=10.0.0.5\", given before"},
		{[]string{"serve", "--check", "--listen", "tcp://*:1", "--engine-allow", "*=127.0.0.1", "--engine-allow", "*=10.0.0.0/8", "--replay-template", "tcp://{pod}:5567"}, "kvindex: --replay-template \"tcp://{pod}:5567\": with engine allow rules the replay host must be the engine's source address: want tcp://{addr}:PORT"},
		{[]string{"serve", "--check", "--listen", "ipc:///tmp/kv", "--engine-allow", "*=10.0.0.0/8"}, "kvindex: --engine-allow needs a tcp --listen endpoint"},
		{[]string{"serve", "--check", "--model", "m", "--engine", "a=tcp://h:1", "--engine-allow", "a=10.0.0.1"}, "kvindex: --engine-allow applies to bind mode (--listen) only"},
		// Bind-mode flags without bind mode.
		{[]string{"serve", "--check", "--model", "m", "--engine", "a=tcp://h:1", "--replay-template", "tcp://{pod}:5567"}, "kvindex: --replay-template applies to bind mode (--listen) only; in connect mode give each engine's replay endpoint: --engine NAME=ENDPOINT,replay=ENDPOINT"},
		{[]string{"serve", "--check", "--model", "m", "--engine", "a=tcp://h:1", "--topic-pattern", "x.{pod}"}, "kvindex: --topic-pattern applies to bind mode (--listen) only"},
		{[]string{"serve", "--check", "--model", "m", "--engine", "a=tcp://h:1", "--listen-ranks", "2"}, "kvindex: --listen-ranks applies to bind mode (--listen) only; in connect mode give each engine's ranks: --engine NAME=ENDPOINT,ranks=N"},
	}
	for _, tc := range tests {
		_, stderr, code := runCLI(t, tc.args...)
		lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
		const hint = " (see 'kvindex serve --help')\n"
		if code != exitUsage || !strings.HasPrefix(stderr, tc.want) || !strings.HasSuffix(stderr, hint) || len(lines) != 1 {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and one line starting %q, ending %q", tc.args, code, stderr, tc.want, hint)
		}
	}
}

// The command line wins over the environment, which wins over the file.
func TestServeSettingsPrecedence(t *testing.T) {
	cfg := writeFile(t, "kvindex.yaml", "grpc-addr: \":6000\"\nhttp-addr: \":6001\"\nmodel: from-file\nmemory-budget: 1GiB\nlisten: tcp://*:5557\nengine-allow:\n  - \"*=127.0.0.1\"\n")
	env := map[string]string{
		"KVINDEX_CONFIG":    cfg,
		"KVINDEX_HTTP_ADDR": ":7001",
		"KVINDEX_MODEL":     "from-env",
		"KVINDEX_ENGINE":    "a=tcp://h:1\nb=tcp://h:2,ranks=2",
		"KVINDEX_BOGUS":     "ignored: names no flag of serve",
	}
	o, _, err := parseServeEnv(t, env, "--model", "from-flag")
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case o.GRPCAddr != ":6000":
		t.Errorf("grpc-addr %q, want the file's", o.GRPCAddr)
	case o.HTTPAddr != ":7001":
		t.Errorf("http-addr %q, want the environment's over the file's", o.HTTPAddr)
	case o.Model != "from-flag":
		t.Errorf("model %q, want the command line's over the environment's", o.Model)
	case o.Index.MemoryBudget != 1<<30:
		t.Errorf("memory budget %d, want the file's 1GiB", o.Index.MemoryBudget)
	case len(o.Engines) != 2 || o.Engines[1].Name != "b" || o.Engines[1].Ranks != 2 || o.Engines[0].Model != "from-flag":
		t.Errorf("engines %+v, want a and b from KVINDEX_ENGINE", o.Engines)
	}

	_, _, err = parseServeEnv(t, map[string]string{"KVINDEX_BLOCK_SIZE": "big"}, "--listen", "tcp://*:1", "--engine-allow", "*=127.0.0.1")
	if err == nil || !strings.Contains(err.Error(), `KVINDEX_BLOCK_SIZE="big": invalid argument`) {
		t.Errorf("bad environment value: %v, want an error naming the variable", err)
	}
}

// Every serve flag can be set from the file and the environment: the
// mapping walks the flag set, so no flag needs its own code.
func TestServeEveryFlagSettable(t *testing.T) {
	var f serveFlags
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	f.register(fs)
	fs.VisitAll(func(fl *pflag.Flag) {
		if fl.Name == "config" {
			return
		}
		val := fl.DefValue
		if _, list := fl.Value.(pflag.SliceValue); list {
			val = "x=tcp://h:1"
		}
		for _, src := range []string{"env", "file"} {
			var f2 serveFlags
			fs2 := pflag.NewFlagSet("serve", pflag.ContinueOnError)
			f2.register(fs2)
			env := map[string]string{}
			if src == "env" {
				env[flagsource.EnvName(fl.Name)] = val
			} else {
				env["KVINDEX_CONFIG"] = writeFile(t, "c.yaml", fl.Name+": "+strconv.Quote(val)+"\n")
			}
			lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
			if err := configUsage(flagsource.Apply(fs2, "kvindex serve", lookup), flagNames(fs2)); err != nil {
				t.Errorf("%s from %s: %v", fl.Name, src, err)
				continue
			}
			if !fs2.Lookup(fl.Name).Changed {
				t.Errorf("%s from %s: not set", fl.Name, src)
			}
		}
	})
}

// serve --check validates everything serve would load and exits without
// listening: the addresses it names stay free.
func TestServeCheck(t *testing.T) {
	out, errOut, code := runCLI(t, "serve", "--check", "--model", "m", "--grpc-addr", "127.0.0.1:1", "--http-addr", "127.0.0.1:2",
		"--engine", "pod-a=tcp://127.0.0.1:3,replay=tcp://127.0.0.1:4")
	if code != exitOK || !strings.HasPrefix(out, "settings ok: hash sha256 seed \"vllm-none-hash\", block size 16") ||
		!strings.Contains(out, "engine pod-a (model m): tcp://127.0.0.1:3, replay tcp://127.0.0.1:4, 1 rank(s)") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = runCLI(t, "serve", "--check", "--listen", "tcp://127.0.0.1:3", "--listen-ranks", "4", "--replay-template", "tcp://{addr}:20", "--engine-allow", "*=127.0.0.1")
	if code != exitOK || !strings.Contains(out, "listen tcp://127.0.0.1:3, 4 rank(s), topics kv@{pod}@{model}, replay tcp://{addr}:20, engine allow rules 1") {
		t.Errorf("bind mode with ranks: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// --engine-allow from a --config list, with the replay template it
	// requires.
	cfg := writeFile(t, "kvindex.yaml", "listen: tcp://127.0.0.1:3\nreplay-template: tcp://{addr}:5567\nengine-allow:\n  - vllm-*=10.1.0.0/16\n  - 10.0.0.5=10.0.0.5\n")
	out, errOut, code = runCLI(t, "serve", "--check", "--config", cfg)
	if code != exitOK || !strings.Contains(out, "replay tcp://{addr}:5567, engine allow rules 2") {
		t.Errorf("engine allow rules: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	bad := writeFile(t, "tokenizer.json", `{"model":{"type":"Unigram"}}`)
	_, errOut, code = runCLI(t, "serve", "--check", "--listen", "tcp://127.0.0.1:*", "--engine-allow", "*=127.0.0.1", "--tokenizer", bad)
	if code != exitUsage || !strings.HasPrefix(errOut, "kvindex: --tokenizer "+bad+": ") {
		t.Errorf("bad tokenizer: exit %d, %q", code, errOut)
	}
}
