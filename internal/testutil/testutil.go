package testutil

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"
)

// PollInterval is how often Await checks its condition.
const PollInterval = 5 * time.Millisecond

// Await polls cond every PollInterval until it holds, and fails the test
// naming what if it still does not after timeout.
func Await(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(PollInterval)
	}
}

// SyncBuffer is a bytes.Buffer safe for concurrent writers, such as a
// logger or a process's output, that a test reads while they write.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// FreePorts finds n consecutive ports free on 127.0.0.1 and returns the
// first (engines lay their data-parallel ranks' ports out consecutively).
// They are free when it returns, not reserved.
func FreePorts(t testing.TB, n int) int {
	t.Helper()
	return FreePortsOn(t, []string{"127.0.0.1"}, n)
}

// FreePortsOn is FreePorts on every one of hosts (loopback addresses:
// simulated engines on 127.0.0.x share their port layout).
func FreePortsOn(t testing.TB, hosts []string, n int) int {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", net.JoinHostPort(hosts[0], "0"))
		if err != nil {
			t.Fatal(err)
		}
		first := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if first+n-1 > 65535 {
			continue
		}
		var ls []net.Listener
		ok := true
		for _, h := range hosts {
			for i := range n {
				l, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(first+i)))
				if err != nil {
					ok = false
					break
				}
				ls = append(ls, l)
			}
		}
		for _, l := range ls {
			l.Close()
		}
		if ok {
			return first
		}
	}
	t.Fatalf("no %d consecutive free ports on %v", n, hosts)
	return 0
}

// FreeAddr returns a loopback host:port nothing listens on.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return "127.0.0.1:" + strconv.Itoa(FreePorts(t, 1))
}

// Seq returns the n consecutive values from, from+1, ...: token ids or
// keys.
func Seq(from, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(from + i)
	}
	return out
}

// GetJSON GETs url and decodes its 200 answer's JSON body into v,
// failing the test otherwise.
func GetJSON(t testing.TB, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}
