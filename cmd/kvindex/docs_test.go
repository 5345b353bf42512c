package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/internal/kvindexbin"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/testutil/docgen"
)

// The documentation's facts that the code also states are checked here
// against the code, so each has one home: go test -run TestDocs -update
// rewrites the generated parts of the docs.
var updateDocs = flag.Bool("update", false, "rewrite the generated parts of README.md and api/README.md")

// checkGenerated compares the generated part name of file, on lines of
// its own between its markers, with body, or rewrites it under -update.
func checkGenerated(t *testing.T, file, name, body string) {
	t.Helper()
	docgen.Check(t, file, name, "\n"+body, *updateDocs)
}

// flagTable renders a command's flags as a markdown table: the flag, its
// default and its help, straight from the flag set.
func flagTable(fs *pflag.FlagSet) string {
	var b strings.Builder
	b.WriteString("| flag | default | meaning |\n|---|---|---|\n")
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		name := "--" + f.Name
		if t := f.Value.Type(); t != "bool" {
			name += " " + strings.ToUpper(strings.TrimSuffix(t, "Array"))
		}
		def := f.DefValue
		switch def {
		case "", "[]", "false":
			def = ""
		default:
			def = "`" + def + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", name, def, strings.ReplaceAll(f.Usage, "|", `\|`))
	})
	return b.String()
}

func TestDocsServeFlags(t *testing.T) {
	var f serveFlags
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	f.register(fs)
	checkGenerated(t, "../../api/README.md", "serve-flags", flagTable(fs))
}

// docExample is one kvindex command line of a fenced code block, with the
// output the document shows under it ("$ " lines only).
type docExample struct {
	file, cmd string
	line      int
	output    []string
	// walkthrough: the line is in the block after a "<!-- walkthrough"
	// comment, whose commands run together (TestWalkthrough), not one by
	// one.
	walkthrough bool
}

// docExamples extracts the kvindex command lines of the documents' fenced
// code blocks: lines starting with "kvindex " or "$ kvindex ", joined over
// trailing backslashes. Synopsis lines (alternatives in parentheses or
// brackets) are not commands and are left out.
func docExamples(t *testing.T, files ...string) []docExample {
	t.Helper()
	var out []docExample
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(data), "\n")
		inBlock, marked, walkthrough := false, false, false
		for i := 0; i < len(lines); i++ {
			l := lines[i]
			if strings.HasPrefix(l, "<!-- walkthrough") {
				marked = true
			}
			if strings.HasPrefix(l, "```") {
				inBlock = !inBlock
				walkthrough, marked = inBlock && marked, false
				continue
			}
			if inBlock && strings.HasPrefix(l, "$ ") && !strings.HasPrefix(l, "$ kvindex ") {
				// Another program's command: skip its output.
				for i+1 < len(lines) && !strings.HasPrefix(lines[i+1], "```") && !strings.HasPrefix(lines[i+1], "$ ") {
					i++
				}
				continue
			}
			shown := strings.HasPrefix(l, "$ kvindex ")
			if !inBlock || !(shown || strings.HasPrefix(l, "kvindex ")) {
				continue
			}
			ex := docExample{file: file, line: i + 1, cmd: strings.TrimPrefix(l, "$ "), walkthrough: walkthrough}
			for strings.HasSuffix(ex.cmd, `\`) && i+1 < len(lines) {
				i++
				ex.cmd = strings.TrimSuffix(ex.cmd, `\`) + " " + strings.TrimSpace(lines[i])
			}
			if strings.Contains(ex.cmd, "(--") || strings.Contains(ex.cmd, "[flags]") {
				continue // a synopsis
			}
			for shown && i+1 < len(lines) && !strings.HasPrefix(lines[i+1], "```") && !strings.HasPrefix(lines[i+1], "$ ") {
				i++
				ex.output = append(ex.output, lines[i])
			}
			out = append(out, ex)
		}
	}
	return out
}

// Every kvindex command line in README.md and api/README.md runs as
// written, through bash and the built binary, against a kvindex following
// two simulated engines in the state the examples show: pod-a holds an
// 87-token prompt's 5 full blocks, pod-b its first 3. `serve` examples run
// with --check (their engine addresses are the reader's, not reachable
// here); a shown output must be what the command prints (for pods, whose
// endpoints and ages differ, the header and the engines; for tail, a live
// event of the pod it follows).
func TestDocsExamples(t *testing.T) {
	bash, bin := shellAndBinary(t)

	x := startE2E(t, []string{"pod-a", "pod-b"})
	prompt := testutil.Seq(5000, 5*e2eBlockSize+7)
	if _, err := x.engines["pod-a"].Process(prompt, nil); err != nil {
		t.Fatal(err)
	}
	other := append(slices.Clone(prompt[:3*e2eBlockSize]), testutil.Seq(9000, 2*e2eBlockSize)...)
	if _, err := x.engines["pod-b"].Process(other, nil); err != nil {
		t.Fatal(err)
	}
	x.awaitMatched(prompt, map[string]uint32{"pod-a": 5, "pod-b": 3})

	work := t.TempDir()
	// The NATS examples' key, as README's `openssl rand -hex 32 > nats.key`
	// makes it.
	if err := os.WriteFile(filepath.Join(work, "nats.key"), []byte(strings.Repeat("ab", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, ids := range map[string][]uint64{"prompt.json": prompt, "prompt64.json": prompt[:4*e2eBlockSize], "block-tokens.json": prompt[:e2eBlockSize]} {
		data, _ := json.Marshal(ids)
		if err := os.WriteFile(filepath.Join(work, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "KVINDEX_SERVER="+x.svc.GRPCAddr())

	examples := docExamples(t, "../../README.md", "../../api/README.md")
	if len(examples) < 8 {
		t.Fatalf("found only %d examples; is the extraction broken?", len(examples))
	}
	for _, ex := range examples {
		if ex.walkthrough {
			continue
		}
		t.Run(fmt.Sprintf("%s:%d", strings.TrimPrefix(ex.file, "../../"), ex.line), func(t *testing.T) {
			args := strings.Fields(ex.cmd)
			switch args[1] {
			case "serve", "relay":
				ex.cmd += " --check"
			case "tail":
				runTailExample(t, x, bash, work, env, ex)
				return
			}
			cmd := exec.Command(bash, "-c", ex.cmd)
			cmd.Dir, cmd.Env = work, env
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("%s\n%v: %s", ex.cmd, err, stderr.String())
			}
			got := strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n")
			switch {
			case len(ex.output) == 0:
			case args[1] == "pods":
				// Endpoints and ages are the reader's; the header and the
				// engines are the same.
				if !slices.Equal(strings.Fields(got[0]), strings.Fields(ex.output[0])) || len(got) != len(ex.output) {
					t.Fatalf("%s printed\n%s\nthe document shows\n%s", ex.cmd, stdout.String(), strings.Join(ex.output, "\n"))
				}
				for i := 1; i < len(got); i++ {
					if strings.Fields(got[i])[0] != strings.Fields(ex.output[i])[0] {
						t.Errorf("line %d: %q, the document shows %q", i, got[i], ex.output[i])
					}
				}
			case !slices.Equal(got, ex.output):
				t.Fatalf("%s printed\n%s\nthe document shows\n%s", ex.cmd, stdout.String(), strings.Join(ex.output, "\n"))
			}
		})
	}
}

// buildKvindex builds the binary into a temporary directory, which it
// returns.
// shellAndBinary returns bash and a folder holding a freshly built
// kvindex, for tests that run documented command lines as a reader would;
// they skip under -short, since building takes a while.
func shellAndBinary(t *testing.T) (bash, bin string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatal(err)
	}
	return bash, buildKvindex(t)
}

func buildKvindex(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	if _, err := kvindexbin.Build(bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

// runTailExample runs a tail example until it prints an event of the pod
// it follows, which an engine publishes once the stream is open, then
// stops it with SIGINT as a reader would.
func runTailExample(t *testing.T, x *e2e, bash, dir string, env []string, ex docExample) {
	cmd := exec.Command(bash, "-c", "exec "+ex.cmd)
	cmd.Dir, cmd.Env = dir, env
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	x.await("the tail's Watch stream", func() bool { return x.svc.Hub().Watchers() > 0 })
	pod := strings.Fields(ex.output[0])[1]
	if _, err := x.engines[pod].Process(testutil.Seq(7_000_000, 3*e2eBlockSize), nil); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		t.Fatalf("%s printed nothing: %s", ex.cmd, stderr.String())
	}
	want := strings.Fields(ex.output[0])
	if got := strings.Fields(lines.Text()); len(got) < 4 || got[1] != want[1] || got[3] != want[3] {
		t.Errorf("%s printed %q; the document shows lines like %q", ex.cmd, lines.Text(), ex.output[0])
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("%s after SIGINT: %v: %s", ex.cmd, err, stderr.String())
	}
}

// README.md's layout table and the folders tell the same story: every
// folder holding a Go package has a row, and every row names a folder that
// exists.
func TestDocsLayout(t *testing.T) {
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, l := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(l, "| `") {
			continue
		}
		cell := strings.Split(l, "|")[1]
		for _, p := range strings.Split(cell, ",") {
			p = strings.Trim(strings.TrimSpace(p), "`")
			if strings.HasSuffix(p, "/") {
				listed[strings.TrimSuffix(p, "/")] = true
			}
		}
	}
	if len(listed) == 0 {
		t.Fatal("README.md has no layout table")
	}
	packages := map[string]bool{}
	err = filepath.WalkDir("../..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "bin") && path != "../.." {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") {
			packages[filepath.ToSlash(strings.TrimPrefix(filepath.Dir(path), "../../"))] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for p := range packages {
		if !listed[p] {
			t.Errorf("package folder %s/ has no row in README.md's layout table", p)
		}
	}
	for p := range listed {
		if st, err := os.Stat(filepath.Join("../..", p)); err != nil || !st.IsDir() {
			t.Errorf("README.md's layout table names %s/, which is not a folder", p)
		}
	}
}

// README.md's count of fuzz targets is the source's: every `func FuzzX(`
// at the start of a line of a _test.go file, as .ci/fuzz finds them.
func TestDocsFuzzTargets(t *testing.T) {
	n := 0
	err := filepath.WalkDir("../..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != "../.." || d.Name() == "testdata" || d.Name() == "bin" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		n += len(regexp.MustCompile(`(?m)^func Fuzz[A-Za-z0-9_]*\(`).FindAll(data, -1))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	docgen.Check(t, "../../README.md", "fuzz-targets", strconv.Itoa(n), *updateDocs)
}
