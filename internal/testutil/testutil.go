package testutil

import (
	"bytes"
	"net"
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
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		first := l.Addr().(*net.TCPAddr).Port
		ls := []net.Listener{l}
		for i := 1; i < n; i++ {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(first+i))
			if err != nil {
				break
			}
			ls = append(ls, l)
		}
		for _, l := range ls {
			l.Close()
		}
		if len(ls) == n {
			return first
		}
	}
	t.Fatalf("no %d consecutive free ports", n)
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
