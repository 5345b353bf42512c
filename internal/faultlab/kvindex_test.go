package faultlab

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/internal/kvindexbin"
	"github.com/kvindex/kvindex/internal/testutil"
)

var tableFlag = flag.Bool("faults.table", false, "print the fault table (make faults)")

// kvindexBin is the binary under test, built once by TestMain.
var kvindexBin string

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "faultlab")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		if !testing.Short() {
			bin, err := buildKvindex(dir)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			kvindexBin = bin
		}
		code := m.Run()
		if *tableFlag {
			printTable(os.Stdout)
		}
		return code
	}()
	os.Exit(code)
}

// buildKvindex builds cmd/kvindex into dir.
func buildKvindex(dir string) (string, error) {
	bin, err := kvindexbin.Build(dir)
	if err != nil {
		return "", fmt.Errorf("faultlab: %w", err)
	}
	return bin, nil
}

// serveSupports reports whether kvindex serve has the flag, from its help.
func serveSupports(t *testing.T, flagName string) bool {
	t.Helper()
	out, err := exec.Command(kvindexBin, "serve", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("kvindex serve --help: %v\n%s", err, out)
	}
	return strings.Contains(string(out), "--"+flagName+" ")
}

// kvindexProc is one kvindex serve process.
type kvindexProc struct {
	extra    []string // the flags given to startKvindex
	cmd      *exec.Cmd
	logs     *testutil.SyncBuffer
	done     chan struct{}
	waitErr  error
	grpcAddr string
	httpAddr string
	c        *client.Client
	peakRSS  int64 // VmHWM read just before the process was stopped, bytes
}

var servingLine = regexp.MustCompile(`msg=serving grpc=(\S+) http=(\S+)`)

// startKvindex starts kvindex serve with the suite's hash settings and
// free ports, plus args, and connects a client to it. The process is
// killed when the test ends; its log is shown if the test failed.
func startKvindex(t *testing.T, args ...string) *kvindexProc {
	t.Helper()
	full := append([]string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--model", model, "--hash-algo", "sha256_cbor", "--hash-seed", "0", "--block-size", strconv.Itoa(blockSize),
		"--ready-grace", "1s"}, args...)
	k, m := startProc(t, full, servingLine)
	k.extra, k.grpcAddr, k.httpAddr = args, m[1], m[2]
	ctx, cancel := context.WithTimeout(context.Background(), awaitBound)
	defer cancel()
	c, err := client.Dial(ctx, k.grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	k.c = c
	t.Cleanup(func() { c.Close() })
	return k
}

// startProc runs the kvindex binary with args until its log matches
// ready, and returns the process and the match. The process is killed
// when the test ends; its log is shown if the test failed.
func startProc(t *testing.T, args []string, ready *regexp.Regexp) (*kvindexProc, []string) {
	t.Helper()
	if kvindexBin == "" {
		t.Skip("-short: the fault suite needs the kvindex binary")
	}
	k := &kvindexProc{logs: &testutil.SyncBuffer{}, done: make(chan struct{})}
	k.cmd = exec.Command(kvindexBin, args...)
	k.cmd.Stdout, k.cmd.Stderr = k.logs, k.logs
	if err := k.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		k.waitErr = k.cmd.Wait()
		close(k.done)
	}()
	t.Cleanup(func() {
		k.kill()
		if t.Failed() && !*tableFlag {
			logs := k.logs.String()
			if len(logs) > 8000 {
				logs = "...\n" + logs[len(logs)-8000:]
			}
			t.Logf("kvindex %s:\n%s", strings.Join(args, " "), logs)
		}
	})
	deadline := time.Now().Add(awaitBound)
	for {
		if m := ready.FindStringSubmatch(k.logs.String()); m != nil {
			return k, m
		}
		select {
		case <-k.done:
			t.Fatalf("kvindex exited before serving: %v\n%s", k.waitErr, k.logs.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("kvindex did not start serving:\n%s", k.logs.String())
		}
	}
}

// readPeakRSS reads the process's peak resident set size (VmHWM).
func (k *kvindexProc) readPeakRSS() int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", k.cmd.Process.Pid))
	if err != nil {
		return k.peakRSS
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(rest)
			if len(f) == 2 && f[1] == "kB" {
				if n, err := strconv.ParseInt(f[0], 10, 64); err == nil {
					k.peakRSS = max(k.peakRSS, n<<10)
				}
			}
		}
	}
	return k.peakRSS
}

// exited reports whether the process has ended.
func (k *kvindexProc) exited() bool {
	select {
	case <-k.done:
		return true
	default:
		return false
	}
}

// kill ends the process with SIGKILL (no shutdown work at all) and waits.
func (k *kvindexProc) kill() {
	if k.exited() {
		return
	}
	k.readPeakRSS()
	k.cmd.Process.Signal(syscall.SIGKILL)
	<-k.done
}
