package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/kvindex/kvindex/internal/sim"
	"github.com/kvindex/kvindex/internal/testutil"
)

// modelMention finds a model name in an example: a JSON model field, a
// --model or --tokenizer-model flag, a YAML model key, vllm serve's
// argument or a KV events topic's last part.
var modelMention = regexp.MustCompile(`"model(?:_name)?"\s*:\s*"([^"]+)"|--(?:tokenizer-)?model[ =]([^\s\\'"` + "`" + `\],;)]+)|(?m:^\s*model:\s*(\S+))|vllm serve (\S+)|kv@[^@"]*@([^"\s` + "`" + `,;)]+)`)

// placeholders are the names a syntax summary uses for "your model".
var placeholders = map[string]bool{"M": true, "MODEL": true, "NAME": true, "STRING": true, "<model>": true, "{model}": true}

// Every example in the documentation and in the commands' help names the
// model the walkthrough's simulated engines serve, so that any example
// copied against the walkthrough's server finds it. Lines that show the
// answer to an unknown model are the exception they illustrate.
func TestDocsOneModel(t *testing.T) {
	want := sim.DefaultOptions().Model
	files := []string{"../../README.md", "../../api/README.md"}
	for _, pattern := range []string{"../../deploy/*/README.md", "../../deploy/README.md", "*.go"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	found := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, "unknown model") {
				continue
			}
			for _, m := range modelMention.FindAllStringSubmatch(line, -1) {
				name := strings.Join(m[1:], "")
				if placeholders[name] {
					continue
				}
				found++
				if name != want {
					t.Errorf("%s:%d names model %q; the examples all use %q (the simulated engines' model)", f, i+1, name, want)
				}
			}
		}
	}
	if found < 10 {
		t.Fatalf("found only %d model names; is the pattern broken?", found)
	}
}

// writtenFile finds a file a shell example writes: a redirect or a flag
// that names an output file.
var writtenFile = regexp.MustCompile(`(?:[^2]> |--log-prompts )([A-Za-z0-9_.-]+)`)

// A reader runs the walkthroughs from the repository root: every file a
// shell example writes there is one git ignores, so that following the README
// leaves the working tree clean (and a key never gets committed).
func TestDocsOutputsIgnored(t *testing.T) {
	data, err := os.ReadFile("../../.gitignore")
	if err != nil {
		t.Fatal(err)
	}
	ignored := map[string]bool{}
	for _, l := range strings.Split(string(data), "\n") {
		ignored[strings.TrimPrefix(strings.TrimSpace(l), "/")] = true
	}
	found := 0
	files, _ := filepath.Glob("../../deploy/*/README.md")
	for _, f := range append(files, "../../README.md", "../../api/README.md", "../../deploy/README.md") {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		fenced := false
		for i, line := range strings.Split(string(data), "\n") {
			if fence, ok := strings.CutPrefix(strings.TrimSpace(line), "```"); ok {
				// Shell blocks only: other blocks draw arrows with ">".
				fenced = !fenced && (fence == "sh" || fence == "bash")
				continue
			}
			if !fenced {
				continue
			}
			for _, m := range writtenFile.FindAllStringSubmatch(line, -1) {
				found++
				if !ignored[m[1]] {
					t.Errorf("%s:%d: %q writes %s, which .gitignore does not list", f, i+1, strings.TrimSpace(line), m[1])
				}
			}
		}
	}
	if found == 0 {
		t.Fatal("found no example writing a file; is the pattern broken?")
	}
}

// listenerFlags are the listeners of the modes that serve, which a
// walkthrough on this machine keeps on loopback.
var listenerFlags = map[string][]string{
	"serve":  {"--grpc-addr", "--http-addr"},
	"picker": {"--extproc-addr", "--http-addr"},
	"relay":  {"--http-addr"},
}

var modeCommand = regexp.MustCompile(`(?:^|[\s/])kvindex (serve|picker|relay) `)

// Examples that run everything on this machine (their engines or
// endpoints on 127.0.0.1) keep every listener on loopback too, as a
// reader trying them should: the defaults listen on every interface.
func TestDocsWalkthroughsOnLoopback(t *testing.T) {
	files, _ := filepath.Glob("../../deploy/*/README.md")
	checked := 0
	for _, f := range append(files, "../../README.md", "../../api/README.md") {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		fenced := false
		var cmd strings.Builder
		for i, line := range strings.Split(string(data), "\n") {
			if _, ok := strings.CutPrefix(strings.TrimSpace(line), "```"); ok {
				fenced = !fenced
				continue
			}
			if !fenced {
				continue
			}
			if body, more := strings.CutSuffix(line, "\\"); more {
				cmd.WriteString(body)
				continue
			}
			cmd.WriteString(line)
			full := cmd.String()
			cmd.Reset()
			m := modeCommand.FindStringSubmatch(full)
			if m == nil || !strings.Contains(full, "127.0.0.1") || strings.Contains(full, "...") || strings.Contains(full, "--check") {
				continue
			}
			checked++
			words := strings.Fields(full)
			for _, flag := range listenerFlags[m[1]] {
				j := slices.Index(words, flag)
				if j < 0 || j+1 == len(words) || !strings.HasPrefix(words[j+1], "127.0.0.1:") {
					t.Errorf("%s:%d: kvindex %s runs on this machine but does not give %s 127.0.0.1:PORT: %s", f, i+1, m[1], flag, full)
				}
			}
		}
	}
	if checked < 4 {
		t.Fatalf("checked only %d examples; is the extraction broken?", checked)
	}
}

// api/README.md's Python client, generated with Debian's protoc and gRPC
// plugin, asks a running kvindex as the document shows, and prints what
// it shows: the document's commands run through bash from the repository
// root, the package install aside (the test needs the packages already).
func TestDocsPythonClient(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatal(err)
	}
	for _, need := range []string{"protoc", "/usr/bin/grpc_python_plugin", "/usr/bin/python3"} {
		if _, err := exec.LookPath(need); err != nil {
			t.Skipf("%s not found: install Debian's protobuf-compiler, protobuf-compiler-grpc, python3-grpcio and python3-protobuf (make test-deps)", need)
		}
	}
	if out, err := exec.Command("/usr/bin/python3", "-c", "import grpc, google.protobuf").CombinedOutput(); err != nil {
		t.Skipf("Debian's python3 lacks python3-grpcio or python3-protobuf (make test-deps): %s", out)
	}
	data, err := os.ReadFile("../../api/README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), "<!-- python-client")
	if !ok {
		t.Fatal("api/README.md has no python-client block")
	}
	blocks := regexp.MustCompile("(?s)```sh\n(.*?)```\n\n```\n(.*?)```").FindStringSubmatch(rest)
	if blocks == nil {
		t.Fatal("the python-client marker is not followed by a sh block and its output")
	}
	script, want := blocks[1], blocks[2]
	var kept []string
	for _, l := range strings.Split(script, "\n") {
		if !strings.HasPrefix(l, "sudo apt-get install") {
			kept = append(kept, l)
		}
	}
	script = strings.Join(kept, "\n")

	x := startE2E(t, []string{"pod-a", "pod-b"})
	prompt := testutil.Seq(5000, 5*e2eBlockSize+7)
	if _, err := x.engines["pod-a"].Process(prompt, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := x.engines["pod-b"].Process(append(slices.Clone(prompt[:3*e2eBlockSize]), testutil.Seq(9000, 2*e2eBlockSize)...), nil); err != nil {
		t.Fatal(err)
	}
	x.awaitMatched(prompt, map[string]uint32{"pod-a": 5, "pod-b": 3})

	script = strings.NewReplacer("/tmp/kvindex-py", t.TempDir(), "localhost:50051", x.svc.GRPCAddr()).Replace(script)
	cmd := exec.Command(bash, "-euo", "pipefail", "-c", script)
	cmd.Dir = "../.."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v:\n%s\nscript:\n%s", err, out, script)
	}
	if string(out) != want {
		t.Errorf("the Python client printed\n%s\napi/README.md shows\n%s", out, want)
	}
}

// buf.yaml describes the API as make proto builds it: one module, proto/,
// holding every .proto file make proto compiles, and exceptions only for
// files that exist.
func TestBufConfig(t *testing.T) {
	data, err := os.ReadFile("../../buf.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Version string
		Modules []struct{ Path string }
		Lint    struct {
			Use        []string
			IgnoreOnly map[string][]string `yaml:"ignore_only"`
		}
	}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Version != "v2" || len(cfg.Modules) != 1 || cfg.Modules[0].Path != "proto" || len(cfg.Lint.Use) == 0 {
		t.Fatalf("buf.yaml: %+v; want version v2, the one module proto and lint rules", cfg)
	}
	makefile, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	protos := regexp.MustCompile(`proto/\S+\.proto`).FindAllString(string(makefile), -1)
	if len(protos) < 2 {
		t.Fatalf("the Makefile compiles %v; is the pattern broken?", protos)
	}
	onDisk, _ := filepath.Glob("../../proto/*/*/*.proto")
	for i := range onDisk {
		onDisk[i] = strings.TrimPrefix(onDisk[i], "../../")
	}
	if slices.Sort(protos); !slices.Equal(slices.Compact(protos), onDisk) {
		t.Errorf("make proto compiles %v; the buf module proto/ holds %v", protos, onDisk)
	}
	for rule, paths := range cfg.Lint.IgnoreOnly {
		for _, p := range paths {
			if _, err := os.Stat("../../" + p); err != nil {
				t.Errorf("buf.yaml: %s ignores %s: %v", rule, p, err)
			}
		}
	}
}
