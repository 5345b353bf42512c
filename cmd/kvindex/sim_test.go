package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/internal/service"
	"github.com/kvindex/kvindex/internal/sim"
	"github.com/kvindex/kvindex/internal/testutil"
)

// parseSim parses kvindex sim's flags and plans the run, as the command
// does before it starts anything.
func parseSim(args ...string) (*sim.Plan, error) {
	var f simFlags
	fs := pflag.NewFlagSet("sim", pflag.ContinueOnError)
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	o, err := f.options(fs)
	if err != nil {
		return nil, err
	}
	p, err := sim.NewPlan(o)
	if err != nil {
		return nil, configUsage(err, simFlagNames)
	}
	return p, nil
}

// simEngine is an engine rank of the sim, as the tests below name it
// (their sim is the running one).
type simEngine = sim.Engine

// The serve line sim prints follows its engines: every rank's event and
// replay ports, the hashing, the tokenizer; event and replay ports never
// overlap (vLLM offsets both by the rank).
func TestSimServeLine(t *testing.T) {
	const hash = "--hash-algo sha256 --hash-seed vllm-none-hash --block-size 16"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "kvindex serve --model Qwen/Qwen2.5-7B-Instruct " + hash +
			" --engine pod-0=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5559 --engine pod-1=tcp://127.0.0.1:5558,replay=tcp://127.0.0.1:5560 --grpc-addr 127.0.0.1:50051 --http-addr 127.0.0.1:8080"},
		{[]string{"--engines", "2", "--ranks", "3", "--port", "7000", "--model", "m", "--hash-algo", "sha256_cbor", "--hash-seed", "0", "--block-size", "32"},
			"kvindex serve --model m --hash-algo sha256_cbor --hash-seed 0 --block-size 32" +
				" --engine pod-0=tcp://127.0.0.1:7000,replay=tcp://127.0.0.1:7006,ranks=3 --engine pod-1=tcp://127.0.0.1:7003,replay=tcp://127.0.0.1:7009,ranks=3 --grpc-addr 127.0.0.1:50051 --http-addr 127.0.0.1:8080"},
		{[]string{"--engines", "1", "--replay-port", "6000", "--tokenizer", "my tokenizer.json"},
			"kvindex serve --model Qwen/Qwen2.5-7B-Instruct " + hash + " --tokenizer 'my tokenizer.json' --engine pod-0=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:6000 --grpc-addr 127.0.0.1:50051 --http-addr 127.0.0.1:8080"},
		{[]string{"--engines", "3", "--no-replay"},
			"kvindex serve --model Qwen/Qwen2.5-7B-Instruct " + hash + " --engine pod-0=tcp://127.0.0.1:5557 --engine pod-1=tcp://127.0.0.1:5558 --engine pod-2=tcp://127.0.0.1:5559 --grpc-addr 127.0.0.1:50051 --http-addr 127.0.0.1:8080"},
		{[]string{"--connect", "tcp://127.0.0.1:5557", "--ranks", "2"},
			"kvindex serve --model Qwen/Qwen2.5-7B-Instruct " + hash + " --listen tcp://127.0.0.1:5557 --replay-template 'tcp://{addr}:5558' --engine-allow '*=127.0.0.0/8' --grpc-addr 127.0.0.1:50051 --http-addr 127.0.0.1:8080"},
		{[]string{"--connect", "kvindex.example:6000", "--no-replay"},
			"kvindex serve --model Qwen/Qwen2.5-7B-Instruct " + hash + " --listen 'tcp://*:6000'"},
	} {
		p, err := parseSim(tc.args...)
		if err != nil {
			t.Errorf("%v: %v", tc.args, err)
			continue
		}
		if got := sim.ShellLine(sim.ServeArgs(p.Follow())); got != tc.want {
			t.Errorf("%v:\n got %s\nwant %s", tc.args, got, tc.want)
		}
	}
}

func TestSimBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--engines", "0"}, "--engines 0: want 1..256"},
		{[]string{"--ranks", "0"}, "--ranks 0: want 1..1024"},
		{[]string{"--capacity", "0"}, "--capacity 0: want 1..16777216 blocks"},
		{[]string{"--engines", "256", "--ranks", "16", "--capacity", "8192"}, "--engines 256 x --ranks 16 x --capacity 8192 = 33554432 blocks: at most 16777216 in all"},
		{[]string{"--rate", "0"}, "--rate 0 sends no workload, which leaves nothing to do without --http-port"},
		{[]string{"--rate", "-1"}, "--rate -1: want a number of requests per second, at most 10000 (0: no workload, with --http-port)"},
		{[]string{"--rate", "NaN"}, "--rate NaN: want"},
		{[]string{"--rate", "0", "--http-port", "8000", "--requests", "5"}, "--requests 5 and --rate 0 contradict each other"},
		{[]string{"--max-num-seqs", "4"}, "--max-num-seqs and --prefill-per-token shape the HTTP fronts: give --http-port too"},
		{[]string{"--http-port", "8000", "--max-num-seqs", "0"}, "--max-num-seqs 0: want 1..65536"},
		{[]string{"--http-port", "8000", "--prefill-per-token", "-1us"}, "--prefill-per-token -1µs: want 0 to 1s"},
		{[]string{"--http-port", "65535"}, "--http-port 65535: 2 engine ranks need ports 65535-65536, beyond 1..65535"},
		{[]string{"--http-port", "5558"}, "--http-port 5558 overlaps --port 5557: 2 engines serve HTTP on ports 5558-5559, 2 engine ranks use ports 5557-5558"},
		{[]string{"--http-port", "5555", "--engines", "3"}, "--http-port 5555 overlaps --port 5557: 3 engines serve HTTP on ports 5555-5557, 3 engine ranks use ports 5557-5559"},
		{[]string{"--http-port", "5561", "--engines", "3"}, "--http-port 5561 overlaps --replay-port 5560"},
		{[]string{"--sessions", "0"}, "--sessions 0: want 1..4096"},
		{[]string{"--turns", "0"}, "--turns 0: want at least 1"},
		{[]string{"--requests", "-1"}, "--requests -1: want 0 (until Ctrl-C) or more"},
		{[]string{"--model", "a b"}, `--model "a b": want a model name without spaces`},
		{[]string{"--hash-algo", "md5"}, `unknown --hash-algo "md5"`},
		{[]string{"--no-replay", "--replay-port", "6000"}, "--replay-port and --no-replay contradict each other: give one"},
		{[]string{"--port", "65535"}, "--port 65535: 2 engine ranks need ports 65535-65536, beyond 1..65535"},
		{[]string{"--engines", "2", "--ranks", "2", "--replay-port", "5559"},
			"--port 5557 and --replay-port 5559 overlap: 4 engine ranks use event ports 5557-5560 and replay ports 5559-5562; vLLM adds the rank to both, so the two ranges must be apart (e.g. --replay-port 5561)"},
		{[]string{"--connect", "tcp://127.0.0.1:5557", "--port", "6000"}, "--port 6000 applies to connect mode, where the engines bind; with --connect they connect to kvindex's --listen endpoint"},
		{[]string{"--connect", "tcp://*:5557"}, `--connect "tcp://*:5557": want tcp://HOST:PORT, where a kvindex serve --listen binds (e.g. tcp://127.0.0.1:5557)`},
		{[]string{"--connect", "ipc:///tmp/x"}, `--connect "ipc:///tmp/x": want tcp://HOST:PORT`},
		{[]string{"--connect", "127.0.0.1:5557", "--engines", "255"}, "--engines 255: bind mode runs engine i on 127.0.0.<i+1>, so at most 254"},
	} {
		_, err := parseSim(tc.args...)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%v: %v; want %q", tc.args, err, tc.want)
			continue
		}
		if _, ok := err.(usageError); !ok && !strings.HasPrefix(tc.want, "unknown --hash-algo") {
			t.Errorf("%v: %v is not a usage error", tc.args, err)
		}
	}
	// Through the CLI: one line, exit 2.
	_, errOut, code := runCLI(t, "sim", "--engines", "0")
	if code != exitUsage || errOut != "kvindex: --engines 0: want 1..256 (see 'kvindex sim --help')\n" {
		t.Errorf("exit %d, %q", code, errOut)
	}
	_, errOut, code = runCLI(t, "sim", "--port", "0")
	if code != exitUsage || !strings.HasPrefix(errOut, "kvindex: --port 0: 2 engine ranks need ports 0-1") {
		t.Errorf("exit %d, %q", code, errOut)
	}
	bad := writeFile(t, "tokenizer.json", `{"model":{"type":"Unigram"}}`)
	_, errOut, code = runCLI(t, "sim", "--tokenizer", bad, "--port", "1")
	if code != exitUsage || !strings.HasPrefix(errOut, "kvindex: --tokenizer "+bad+": ") {
		t.Errorf("bad tokenizer: exit %d, %q", code, errOut)
	}
}

// Every setting of sim's that its errors may name has its flag.
func TestSimFlagNames(t *testing.T) {
	var f simFlags
	fs := pflag.NewFlagSet("sim", pflag.ContinueOnError)
	f.register(fs)
	fields := reflect.TypeFor[sim.Options]()
	for i := range fields.NumField() {
		name := fields.Field(i).Name
		flag, ok := simFlagNames[configerr.Field(name)]
		switch {
		case name == "Hasher" || name == "Observe": // the hash flags' hasher; the printing
		case !ok:
			t.Errorf("sim.Options.%s has no flag in simFlagNames", name)
		case fs.Lookup(strings.TrimPrefix(flag, "--")) == nil:
			t.Errorf("sim.Options.%s is named %s, which kvindex sim does not have", name, flag)
		}
	}
}

// A sim that cannot start names the flag to change, and fails (exit 1):
// its flags were right, the machine is not.
func TestSimStartFailures(t *testing.T) {
	dir := t.TempDir()
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	port := strconv.Itoa(held.Addr().(*net.TCPAddr).Port)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"event port held", []string{"--port", port, "--engines", "1", "--replay-port", strconv.Itoa(testutil.FreePortsOn(t, []string{"127.0.0.1"}, 1))},
			"kvindex: pod-0: zmqtransport: "},
		{"HTTP port held", []string{"--port", strconv.Itoa(testutil.FreePortsOn(t, []string{"127.0.0.1"}, 2)), "--engines", "1", "--http-port", port},
			"kvindex: pod-0: HTTP: listen tcp 127.0.0.1:" + port + ": bind: address already in use (another program holds the port? choose another --http-port)\n"},
		{"prompt log unwritable", []string{"--log-prompts", filepath.Join(dir, "none", "prompts.txt")},
			"kvindex: --log-prompts " + filepath.Join(dir, "none", "prompts.txt") + ": no such file or directory\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := runCLI(t, append([]string{"sim"}, tc.args...)...)
			if code != exitRuntime || !strings.HasPrefix(errOut, tc.want) || out != "" {
				t.Errorf("exit %d, %q; want %d, %q", code, errOut, exitRuntime, tc.want)
			}
			if strings.HasPrefix(tc.name, "event port") && !strings.HasSuffix(errOut, " in use (another program holds the port? choose others with --port and --replay-port)\n") {
				t.Errorf("%q does not say which flags to change", errOut)
			}
		})
	}
}

// simHarness runs kvindex sim in-process.
type simHarness struct {
	t    *testing.T
	run  *sim.Sim
	out  *testutil.SyncBuffer
	done chan error
	stop context.CancelFunc
}

// startSim runs kvindex sim with args, adding --port (connect mode) or
// --replay-port (bind mode) at free ports; a port taken meanwhile is
// retried elsewhere.
func startSim(t *testing.T, args ...string) *simHarness {
	t.Helper()
	p, err := parseSim(args...)
	if err != nil {
		t.Fatal(err)
	}
	o := p.Options()
	connectMode := o.Connect == ""
	flag, hosts, n := "--port", []string{"127.0.0.1"}, o.Engines*o.Ranks*2
	if !connectMode {
		flag, hosts, n = "--replay-port", p.Pods(), o.Ranks
	}
	for attempt := 0; ; attempt++ {
		base := testutil.FreePortsOn(t, hosts, n)
		moved := append(slices.Clone(args), flag, strconv.Itoa(base))
		if o.HTTPPort != 0 {
			// The HTTP fronts move too, clear of the ports above.
			hhosts, hn := []string{"127.0.0.1"}, o.Engines
			if !connectMode {
				hhosts, hn = p.Pods(), 1
			}
			hport := testutil.FreePortsOn(t, hhosts, hn)
			for connectMode && hport < base+n && base < hport+hn {
				hport = testutil.FreePortsOn(t, hhosts, hn)
			}
			moved = append(moved, "--http-port", strconv.Itoa(hport))
		}
		h, err := tryStartSim(t, moved...)
		if err == nil {
			return h
		}
		if attempt == 4 || !strings.Contains(err.Error(), "in use") {
			t.Fatal(err)
		}
	}
}

func tryStartSim(t *testing.T, args ...string) (*simHarness, error) {
	started := make(chan *sim.Sim, 1)
	simStarted = func(s *sim.Sim) { started <- s }
	t.Cleanup(func() { simStarted = nil })
	h := &simHarness{t: t, out: &testutil.SyncBuffer{}, done: make(chan error, 1)}
	root := newRootCmd()
	root.SetArgs(append([]string{"sim"}, args...))
	root.SetOut(h.out)
	root.SetErr(h.out)
	ctx, cancel := context.WithCancel(context.Background())
	h.stop = cancel
	go func() { h.done <- root.ExecuteContext(ctx) }()
	select {
	case h.run = <-started:
	case err := <-h.done:
		cancel()
		return nil, err
	case <-time.After(e2eDeadline):
		t.Fatal("kvindex sim did not start")
	}
	t.Cleanup(func() {
		if err := h.close(); err != nil {
			t.Errorf("kvindex sim ended with %v", err)
		}
	})
	return h, nil
}

// close stops the sim as Ctrl-C does and returns how it ended.
func (h *simHarness) close() error {
	h.stop()
	if h.done == nil {
		return nil
	}
	err := <-h.done
	h.done = nil
	if err == nil && !strings.Contains(h.out.String(), "stopped after ") {
		err = fmt.Errorf("no closing line in its output:\n%s", h.out.String())
	}
	return err
}

// serveLine returns the kvindex serve command line the sim printed.
func (h *simHarness) serveLine() string {
	for _, l := range strings.Split(h.out.String(), "\n") {
		if strings.HasPrefix(l, "kvindex serve ") {
			return l
		}
	}
	h.t.Fatalf("kvindex sim printed no serve line:\n%s", h.out.String())
	return ""
}

// shellWords splits a line as a shell would, for the lines sim prints:
// words, some in single quotes.
func shellWords(line string) []string {
	var out []string
	var cur strings.Builder
	in, quoted := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\'':
			quoted, in = !quoted, true
		case c == ' ' && !quoted:
			if in {
				out = append(out, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteByte(c)
			in = true
		}
	}
	if in {
		out = append(out, cur.String())
	}
	return out
}

// awaitCaughtUp waits until the sim has made at least n requests, then
// pauses its workload (the caller must resume it) and waits until kvindex
// has applied every batch of every engine.
func awaitCaughtUp(t *testing.T, c *client.Client, r *sim.Sim, n int) {
	t.Helper()
	// Every stream must have had a live batch: kvindex learns of the
	// batches sent before it subscribed from the first one it sees, and
	// replays them.
	deadline := time.Now().Add(e2eDeadline)
	for r.Sent() < n || !allStreams(t, c, r, func(e *simEngine, p *podState) bool { return p != nil && p.batches > 0 }) {
		if time.Now().After(deadline) {
			t.Fatal("some engine's batches never reached kvindex")
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.Pause()
	for !allStreams(t, c, r, func(e *simEngine, p *podState) bool { return p.lastSeq == e.Seq()-1 }) {
		if time.Now().After(deadline) {
			r.Resume()
			t.Fatal("kvindex did not catch up with the engines")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type podState struct{ batches, lastSeq uint64 }

func allStreams(t *testing.T, c *client.Client, r *sim.Sim, ok func(*simEngine, *podState) bool) bool {
	t.Helper()
	pods, err := c.ListPods(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range r.Engines() {
		var st *podState
		for _, p := range pods {
			if p.GetPod() == e.Pod && int(p.GetDpRank()) == e.Rank {
				st = &podState{batches: p.GetBatches(), lastSeq: p.GetLastSeq()}
			}
		}
		if !ok(e, st) {
			return false
		}
	}
	return true
}

// holdings returns what each engine holds of the prompt: its leading
// cached blocks, by engine name.
func holdings(t *testing.T, r *sim.Sim, ids []uint64) map[string]uint32 {
	t.Helper()
	out := map[string]uint32{}
	for _, e := range r.Engines() {
		n, err := e.Lookup(ids, nil)
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = uint32(n)
	}
	return out
}

// lastLine returns the last line of a file.
func lastLine(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	return lines[len(lines)-1]
}

// kvindex sim's engines, followed by kvindex serve started from the line
// sim prints, in both modes and with data-parallel ranks: what kvindex
// answers for the last prompt sent is what the engines hold.
func TestSimFollowedByServe(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"connect mode, 2 ranks", []string{"--engines", "2", "--ranks", "2"}},
		{"bind mode, 2 ranks", []string{"--connect", "", "--engines", "2", "--ranks", "2"}},
		{"connect mode, other hashing", []string{"--engines", "3", "--hash-algo", "sha256_cbor", "--hash-seed", "0", "--block-size", "8"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(slices.Clone(tc.args), "--rate", "100", "--log-prompts", filepath.Join(t.TempDir(), "prompts.txt"))
			if i := slices.Index(args, "--connect"); i >= 0 {
				args[i+1] = "tcp://127.0.0.1:" + strconv.Itoa(testutil.FreePortsOn(t, []string{"127.0.0.1"}, 1))
			}
			sim := startSim(t, args...)
			c, o := followSim(t, sim)
			awaitCaughtUp(t, c, sim.run, 60)
			ids, err := client.ParseTokenList(lastLine(t, args[len(args)-1]))
			if err != nil {
				t.Fatal(err)
			}
			want := holdings(t, sim.run, ids)
			r, err := c.LongestPrefixTokens(context.Background(), "", ids, nil)
			sim.run.Resume()
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]uint32{}
			for _, p := range r.GetPods() {
				got[client.EngineName(p.GetPod(), p.GetDpRank())] = p.GetMatchedBlocks()
			}
			if !mapsEqual(got, want) {
				t.Errorf("kvindex answers %v for the last prompt; the engines hold %v", got, want)
			}
			best := uint32(0)
			for _, n := range want {
				best = max(best, n)
			}
			if bs := uint32(o.Index.Hasher.BlockSize()); best != uint32(len(ids))/bs {
				t.Errorf("no engine holds the whole last prompt (%d tokens): %v", len(ids), want)
			}
			if err := sim.close(); err != nil {
				t.Error(err)
			}
		})
	}
}

// followSim runs kvindex serve in-process from the line sim printed, with
// extra flags, and returns a client of it.
func followSim(t *testing.T, sim *simHarness, extra ...string) (*client.Client, *service.Options) {
	t.Helper()
	c, o, _ := followSimService(t, sim, extra...)
	return c, o
}

// followSimService is followSim that also returns the running service.
func followSimService(t *testing.T, sim *simHarness, extra ...string) (*client.Client, *service.Options, *service.Service) {
	t.Helper()
	words := shellWords(sim.serveLine())
	o, _, err := parseServe(t, append(append(words[2:], "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"), extra...)...)
	if err != nil {
		t.Fatalf("%s: %v", sim.serveLine(), err)
	}
	logs := &testutil.SyncBuffer{}
	log, _ := newLogger(logs, "debug", "text")
	ctx, cancel := context.WithCancel(context.Background())
	svc, err := startService(ctx, o, log)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	c, err := client.Dial(context.Background(), svc.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		cancel()
		svc.Wait()
		if t.Failed() {
			t.Logf("kvindex logs:\n%s\nsim output:\n%s", logs.String(), sim.out.String())
		}
	})
	return c, o, svc
}

// What kvindex sim prints, with a tokenizer and without: what runs where,
// how to ask kvindex about the last prompt logged, a line per request,
// and the end of the workload and of the run.
func TestSimPrinting(t *testing.T) {
	const tk = "../../tokenizer/testdata/qwen2.5/tokenizer.json.gz"
	for _, tc := range []struct {
		name  string
		args  []string
		query string // printed after "ask about the last one with:"; LOG is the log
	}{
		{"text", []string{"--tokenizer", tk}, `kvindex query --prompt "$(tail -n 1 LOG)"`},
		{"token ids", nil, "tail -n 1 LOG | kvindex query --tokens-file -"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := filepath.Join(t.TempDir(), "prompts.txt")
			sim := startSim(t, append(tc.args, "--engines", "1", "--log-prompts", log, "--rate", "200", "--requests", "5")...)
			deadline := time.Now().Add(e2eDeadline)
			for !strings.Contains(sim.out.String(), "sent 5 requests") {
				if time.Now().After(deadline) {
					t.Fatalf("sim did not finish 5 requests:\n%s", sim.out.String())
				}
				time.Sleep(10 * time.Millisecond)
			}
			if err := sim.close(); err != nil {
				t.Fatal(err)
			}
			out := sim.out.String()
			for _, want := range []string{
				"kvindex sim: 1 simulated vLLM engines of Qwen/Qwen2.5-7B-Instruct (4096 blocks of 16 tokens each, hash sha256 seed \"vllm-none-hash\")\n  pod-0 publishes on tcp://127.0.0.1:",
				"\nprompts go to " + log + ", one per line; ask about the last one with:\n  " + strings.ReplaceAll(tc.query, "LOG", log) + "\n",
				"\nsent 5 requests; the engines stay up (kvindex can still replay and query them) until Ctrl-C\nstopped after 5 requests\n",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("no %q in:\n%s", want, out)
				}
			}
			if tc.args != nil && !strings.Contains(sim.serveLine(), " --tokenizer "+tk+" ") {
				t.Errorf("the serve line does not name the tokenizer: %s", sim.serveLine())
			}
			if n := len(regexp.MustCompile(`(?m)^\d\d:\d\d:\d\d\.\d{3} req \d conv \d+ turn \d+ -> pod-0: \d+ tokens, \d+ cached \(\d+\.\d%\)$`).FindAllString(out, -1)); n != 5 {
				t.Errorf("%d request lines, want 5:\n%s", n, out)
			}
		})
	}
}

// kvindex sim's HTTP fronts on the whole path, with no workload: a
// conversation sent as chat requests to pod-1's front changes its cache
// and publishes events; kvindex serve, following the engines and
// tokenizing chat through pod-0's /tokenize, finds the conversation on
// pod-1 alone; and pod-1's next answer reports as cached what kvindex
// predicted, which its /metrics counts.
func TestSimHTTP(t *testing.T) {
	const tk = "../../tokenizer/testdata/qwen2.5/tokenizer.json.gz"
	sim := startSim(t, "--engines", "2", "--tokenizer", tk, "--rate", "0", "--http-port", "8000", "--prefill-per-token", "0")
	fronts := []string{"http://" + sim.run.Fronts()[0].Addr, "http://" + sim.run.Fronts()[1].Addr}
	for i, f := range fronts {
		if !strings.Contains(sim.out.String(), "\n  pod-"+strconv.Itoa(i)+" "+f+"\n") {
			t.Fatalf("sim does not print pod-%d's HTTP address %s:\n%s", i, f, sim.out.String())
		}
	}
	c, _ := followSim(t, sim, "--tokenize-url", fronts[0])

	// kvindex learns of a stream's earlier batches from the first it
	// sees, so send each engine small requests until one has arrived.
	warm := 0
	deadline := time.Now().Add(e2eDeadline)
	for !allStreams(t, c, sim.run, func(e *simEngine, p *podState) bool { return p != nil && p.batches > 0 }) {
		if time.Now().After(deadline) {
			t.Fatal("no engine's batches reached kvindex")
		}
		for _, f := range fronts {
			warm++
			simPost(t, f+"/v1/completions", fmt.Sprintf(`{"prompt":[%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d]}`,
				warm, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15))
		}
		time.Sleep(20 * time.Millisecond)
	}

	msgs := []*kvindexv1.ChatMessage{
		{Role: "system", Content: "You are a coding agent working in a large Go repository. Read before you write."},
		{Role: "user", Content: "Find where the subscriber replays lost batches and explain the backoff."},
	}
	body := func() string {
		b, _ := json.Marshal(map[string]any{"model": "Qwen/Qwen2.5-7B-Instruct", "messages": msgs, "max_tokens": 8})
		return string(b)
	}
	cached := 0
	for turn := range 2 {
		// Wait until kvindex has applied every batch of every engine.
		for !allStreams(t, c, sim.run, func(e *simEngine, p *podState) bool { return p.lastSeq == e.Seq()-1 }) {
			if time.Now().After(deadline) {
				t.Fatal("kvindex did not catch up with the engines")
			}
			time.Sleep(10 * time.Millisecond)
		}
		r, err := c.LongestPrefixMessages(context.Background(), "", msgs, nil)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]uint32{}
		for _, p := range r.GetPods() {
			got[p.GetPod()] = p.GetMatchedBlocks()
		}
		ids := simPost(t, fronts[1]+"/tokenize", body()).Tokens
		if want := holdings(t, sim.run, ids); !mapsEqual(got, want) || turn == 1 && got["pod-1"] == 0 {
			t.Errorf("turn %d: kvindex answers %v for the conversation; the engines hold %v", turn+1, got, want)
		}
		u := simPost(t, fronts[1]+"/v1/chat/completions", body()).Usage
		if u.PromptTokens != len(ids) || u.PromptTokensDetails.CachedTokens != int(got["pod-1"])*16 {
			t.Errorf("turn %d: usage %+v; kvindex predicted %d cached blocks of 16 tokens", turn+1, u, got["pod-1"])
		}
		cached += u.PromptTokensDetails.CachedTokens
		msgs = append(msgs, &kvindexv1.ChatMessage{Role: "assistant", Content: "It backs off exponentially up to a cap."},
			&kvindexv1.ChatMessage{Role: "user", Content: "Show me the constants."})
	}
	if !strings.Contains(sim.out.String(), " http /v1/chat/completions -> pod-1: ") {
		t.Errorf("sim printed no line for the chat requests:\n%s", sim.out.String())
	}
	if cached == 0 || !strings.Contains(simGet(t, fronts[1]+"/metrics"), `vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} `+strconv.Itoa(cached)+"\n") {
		t.Errorf("pod-1's /metrics does not count the %d cached tokens its answers reported:\n%s", cached, simGet(t, fronts[1]+"/metrics"))
	}
}

// simResponse is what TestSimHTTP reads of the fronts' answers.
type simResponse struct {
	Tokens []uint64 `json:"tokens"`
	Usage  struct {
		PromptTokens        int `json:"prompt_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func simPost(t *testing.T, url, body string) simResponse {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var r simResponse
	if resp.StatusCode != http.StatusOK || json.Unmarshal(data, &r) != nil {
		t.Fatalf("POST %s %s: %d %s", url, body, resp.StatusCode, data)
	}
	return r
}

func simGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return string(data)
}
