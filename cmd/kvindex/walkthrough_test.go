package main

import (
	"bufio"
	"bytes"
	"context"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/internal/service"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/tokenizer"
)

// README.md's "Try it" walkthrough runs as written: kvindex sim (terminal
// 1), the serve line it prints (terminal 2, which must be the line the
// README shows), then query, lookup, pods and tail by text through the
// committed tokenizer (terminal 3), each through bash and the built binary
// from a directory laid out as the repository root. What query and lookup
// print must be what the simulated engines hold for that prompt.
//
// Two things differ from a reader's run, both through settings the
// walkthrough leaves unset: the ports (sim's --port, serve's
// KVINDEX_GRPC_ADDR and KVINDEX_HTTP_ADDR, the clients' KVINDEX_SERVER)
// are free ones, so the test runs beside anything else, and sim's --rate
// is higher, so it is quick. sim runs in the test's process, which reads
// its engines' true state.
func TestWalkthrough(t *testing.T) {
	bash, bin := shellAndBinary(t)
	lines := map[string][]string{}
	for _, ex := range docExamples(t, "../../README.md") {
		if ex.walkthrough {
			sub := strings.Fields(ex.cmd)[1]
			lines[sub] = append(lines[sub], ex.cmd)
		}
	}
	for _, sub := range []string{"sim", "serve", "query", "lookup", "pods", "tail"} {
		if len(lines[sub]) != 1 {
			t.Fatalf("README.md's walkthrough has %d kvindex %s lines, want 1", len(lines[sub]), sub)
		}
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	local, err := tokenizer.LoadFile(filepath.Join(repo, "tokenizer/testdata/qwen2.5/tokenizer.json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	if err := os.Symlink(filepath.Join(repo, "tokenizer"), filepath.Join(work, "tokenizer")); err != nil {
		t.Fatal(err)
	}
	t.Chdir(work)

	// Terminal 1.
	sim := startSim(t, append(strings.Fields(lines["sim"][0])[2:], "--rate", "50")...)
	serveLine := anyListenPort(sim.serveLine())
	if want := movePorts(t, lines["serve"][0], sim.run.Engines()[0].PubEndpoint()); !slices.Equal(shellWords(serveLine), shellWords(want)) {
		t.Fatalf("kvindex sim printed\n%s\nREADME.md shows (ports moved as the test moved them)\n%s", serveLine, want)
	}

	// Terminal 2.
	env := append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	serve := exec.Command(bash, "-c", "exec "+serveLine)
	serve.Dir = work
	serve.Env = env
	serveLog := &testutil.SyncBuffer{}
	serve.Stdout, serve.Stderr = serveLog, serveLog
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	serveDone := make(chan error, 1)
	go func() { serveDone <- serve.Wait() }()
	defer func() {
		serve.Process.Signal(os.Interrupt)
		if err := <-serveDone; err != nil {
			t.Errorf("%s after SIGINT: %v", serveLine, err)
		}
		if t.Failed() {
			t.Logf("kvindex serve:\n%s\nkvindex sim:\n%s", serveLog.String(), sim.out.String())
		}
	}()
	grpcAddr := awaitMatch(t, serveLog, regexp.MustCompile(`msg=serving grpc=(\S+)`), serveDone)
	c, err := client.Dial(context.Background(), grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	env = append(env, "KVINDEX_SERVER="+grpcAddr)

	// Terminal 3, with the workload paused so that the engines' state
	// holds still.
	awaitCaughtUp(t, c, sim.run, 20)
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			sim.run.Resume()
		}
	}
	defer resume()
	ids := local.Encode(lastLine(t, filepath.Join(work, "prompts.txt")), true)
	held := holdings(t, sim.run, ids)
	blocks := len(ids) / 16

	out := runLine(t, bash, work, env, lines["query"][0])
	rows := strings.Split(strings.TrimSpace(out), "\n")
	if len(rows) != 2+len(held) || !strings.HasPrefix(rows[0], "model (server default): "+strconv.Itoa(len(ids))+" tokens (local), "+strconv.Itoa(blocks)+" full blocks of 16 tokens") {
		t.Fatalf("query printed\n%s", out)
	}
	matched := map[string]uint32{}
	for _, row := range rows[2:] {
		f := strings.Fields(row)
		n, _ := strconv.Atoi(f[1])
		matched[f[0]] = uint32(n)
	}
	if !mapsEqual(matched, held) || !slices.Contains(slices.Collect(maps.Values(held)), uint32(blocks)) {
		t.Errorf("query answers %v for the last prompt (%d blocks); the engines hold %v", matched, blocks, held)
	}

	out = runLine(t, bash, work, env, lines["lookup"][0])
	rows = strings.Split(strings.TrimSpace(out), "\n")
	if len(rows) != 2+blocks {
		t.Fatalf("lookup printed %d lines for %d blocks:\n%s", len(rows), blocks, out)
	}
	for i, row := range rows[2:] {
		var got, want []string
		for _, h := range strings.Fields(row)[2:] {
			if h != "-" {
				got = append(got, strings.TrimSuffix(h, "[GPU]"))
			}
		}
		for name, n := range held {
			if int(n) > i {
				want = append(want, name)
			}
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("lookup block %d: holders %v, the engines holding it are %v", i, got, want)
		}
	}

	out = runLine(t, bash, work, env, lines["pods"][0])
	for name := range held {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` +\S+ +\S+ +yes +ok `).MatchString(out) {
			t.Errorf("pods does not show %s connected and ok:\n%s", name, out)
		}
	}

	// tail prints the events of the resumed workload; Ctrl-C ends it.
	tail := exec.Command(bash, "-c", "exec "+lines["tail"][0])
	tail.Dir, tail.Env = work, env
	stdout, err := tail.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var tailErr bytes.Buffer
	tail.Stderr = &tailErr
	if err := tail.Start(); err != nil {
		t.Fatal(err)
	}
	resume()
	first := bufio.NewScanner(stdout)
	if !first.Scan() {
		t.Fatalf("tail printed nothing: %s", tailErr.String())
	}
	if f := strings.Fields(first.Text()); len(f) < 4 || !slices.Contains(slices.Collect(maps.Keys(held)), f[1]) || !strings.HasPrefix(f[2], "seq=") {
		t.Errorf("tail printed %q", first.Text())
	}
	tail.Process.Signal(os.Interrupt)
	if err := tail.Wait(); err != nil {
		t.Errorf("tail after SIGINT: %v: %s", err, tailErr.String())
	}
}

// movePorts rewrites the ports of a line written for sim's default --port
// to the ones a sim publishing first at endpoint uses, and serve's
// listeners to port 0.
func movePorts(t *testing.T, line, endpoint string) string {
	t.Helper()
	var f simFlags
	fs := pflag.NewFlagSet("sim", pflag.ContinueOnError)
	f.register(fs)
	def := f.o.Port
	base, err := strconv.Atoi(endpoint[strings.LastIndexByte(endpoint, ':')+1:])
	if err != nil {
		t.Fatal(err)
	}
	return regexp.MustCompile(`127\.0\.0\.1:(\d+)`).ReplaceAllStringFunc(anyListenPort(line), func(m string) string {
		if m == "127.0.0.1:0" {
			return m
		}
		p, _ := strconv.Atoi(m[len("127.0.0.1:"):])
		return "127.0.0.1:" + strconv.Itoa(p-def+base)
	})
}

// anyListenPort gives serve's loopback listeners in line port 0, so
// that the test's serve shares the machine.
func anyListenPort(line string) string {
	d := service.DefaultOptions()
	return strings.NewReplacer("127.0.0.1"+d.GRPCAddr, "127.0.0.1:0", "127.0.0.1"+d.HTTPAddr, "127.0.0.1:0").Replace(line)
}

// awaitMatch waits for re to match the output and returns its first group.
func awaitMatch(t *testing.T, out *testutil.SyncBuffer, re *regexp.Regexp, exited <-chan error) string {
	t.Helper()
	deadline := time.Now().Add(e2eDeadline)
	for {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			return m[1]
		}
		select {
		case err := <-exited:
			t.Fatalf("exited (%v) before printing %s:\n%s", err, re, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s in:\n%s", re, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runLine runs one command line through bash and returns its output.
func runLine(t *testing.T, bash, dir string, env []string, line string) string {
	t.Helper()
	cmd := exec.Command(bash, "-c", line)
	cmd.Dir, cmd.Env = dir, env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s\n%v: %s", line, err, stderr.String())
	}
	return stdout.String()
}
