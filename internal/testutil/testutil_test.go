package testutil_test

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testutil"
)

func TestAwait(t *testing.T) {
	var n atomic.Int32
	testutil.Await(t, 10*time.Second, "three polls", func() bool { return n.Add(1) == 3 })
	if got := n.Load(); got != 3 {
		t.Errorf("cond called %d times, want 3", got)
	}
}

func TestSyncBuffer(t *testing.T) {
	var b testutil.SyncBuffer
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for range 100 {
				fmt.Fprintf(&b, "%d\n", i)
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if got := strings.Count(b.String(), "\n"); got != 800 {
		t.Errorf("%d lines, want 800", got)
	}
}

func TestFreePorts(t *testing.T) {
	first := testutil.FreePorts(t, 3)
	for p := first; p < first+3; p++ {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("port %d of %d..%d: %v", p, first, first+2, err)
		}
		l.Close()
	}
	if _, err := net.Dial("tcp", testutil.FreeAddr(t)); err == nil {
		t.Error("something listens on FreeAddr's address")
	}
}

func TestSeq(t *testing.T) {
	if got, want := testutil.Seq(5, 3), []uint64{5, 6, 7}; !slices.Equal(got, want) {
		t.Errorf("Seq(5, 3) = %v, want %v", got, want)
	}
	if got := testutil.Seq(1, 0); len(got) != 0 {
		t.Errorf("Seq(1, 0) = %v", got)
	}
}
