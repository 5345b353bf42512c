package testutil

import (
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// NATSServer runs Debian's nats-server (the binary, not the embedded
// server: the tests that use it check kvindex against the server users
// run) with JetStream on a free port of 127.0.0.1 until the test ends, and
// returns its URL and its output. Without the binary it calls missing
// (t.Skip or t.Fatal, as the test decides) naming the package to install.
func NATSServer(t testing.TB, missing func(args ...any)) (string, *SyncBuffer) {
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		missing("nats-server is not installed (Debian: apt-get install nats-server; make test-deps installs it)")
		return "", nil
	}
	port := FreePorts(t, 1)
	out := &SyncBuffer{}
	cmd := exec.Command(bin, "-js", "-sd", t.TempDir(), "-a", "127.0.0.1", "-p", strconv.Itoa(port))
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	Await(t, 30*time.Second, "nats-server listening on "+addr, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return "nats://" + addr, out
}
