package snapstore

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/testutil"
)

// leaseTTL is the tests' lease TTL: short, so that expiry is awaited
// briefly; nothing is timed against it.
const leaseTTL = time.Second

// contenders opens n stores of one model, each on its own connection as
// n replicas would, and a lease of each.
func contenders(t *testing.T, n int) []*Lease {
	t.Helper()
	url := startServer(t)
	var ls []*Lease
	for i := range n {
		s, _ := openStore(t, url, Config{Model: "m", LeaseTTL: leaseTTL})
		ls = append(ls, s.Lease(fmt.Sprintf("replica-%d", i)))
	}
	return ls
}

// tryAll tries every lease at once and returns which hold it.
func tryAll(t *testing.T, ls []*Lease) []int {
	t.Helper()
	got := make([]bool, len(ls))
	var wg sync.WaitGroup
	for i, l := range ls {
		wg.Go(func() {
			ok, err := l.TryAcquire(t.Context())
			if err != nil {
				t.Error(err)
			}
			got[i] = ok
		})
	}
	wg.Wait()
	var held []int
	for i, ok := range got {
		if ok != ls[i].Held() {
			t.Errorf("lease %d: TryAcquire said %v, Held %v", i, ok, ls[i].Held())
		}
		if ok {
			held = append(held, i)
		}
	}
	return held
}

func TestLeaseContention(t *testing.T) {
	ls := contenders(t, 3)
	held := tryAll(t, ls)
	if len(held) != 1 {
		t.Fatalf("held by %v, want exactly one", held)
	}
	// Renewals keep it where it is, however often everyone tries.
	for range 5 {
		if again := tryAll(t, ls); len(again) != 1 || again[0] != held[0] {
			t.Fatalf("held by %v after renewals, want only %d", again, held[0])
		}
	}
	if v := value(t, ls[held[0]].s.leaseHeld); v != 1 {
		t.Errorf("the holder's lease_held gauge is %v", v)
	}
}

// TestLeaseExpiry: a holder that stops renewing loses the lease to
// another once the bucket's TTL removes it; its own next renewal then
// fails, and it knows it no longer holds the lease.
func TestLeaseExpiry(t *testing.T) {
	ls := contenders(t, 2)
	a, b := ls[0], ls[1]
	if ok, err := a.TryAcquire(t.Context()); !ok || err != nil {
		t.Fatalf("first TryAcquire: %v, %v", ok, err)
	}
	if ok, _ := b.TryAcquire(t.Context()); ok {
		t.Fatal("acquired a lease held by another")
	}
	// a stops renewing.
	testutil.Await(t, awaitBound, "the other acquires the abandoned lease", func() bool {
		ok, err := b.TryAcquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return ok
	})
	testutil.Await(t, awaitBound, "the old holder sees its lease run out", func() bool { return !a.Held() })
	if ok, err := a.TryAcquire(t.Context()); ok || err != nil {
		t.Errorf("the old holder's renewal: %v, %v; want false, nil", ok, err)
	}
	if a.Held() || !b.Held() {
		t.Errorf("held: old %v, new %v", a.Held(), b.Held())
	}
}

// TestLeaseRelease: a released lease is acquired by another at once.
func TestLeaseRelease(t *testing.T) {
	ls := contenders(t, 2)
	a, b := ls[0], ls[1]
	if ok, err := a.TryAcquire(t.Context()); !ok || err != nil {
		t.Fatalf("TryAcquire: %v, %v", ok, err)
	}
	if err := a.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if a.Held() {
		t.Error("held after Release")
	}
	if ok, err := b.TryAcquire(t.Context()); !ok || err != nil {
		t.Errorf("TryAcquire after the holder released: %v, %v", ok, err)
	}
	// Releasing a lease not held changes nothing.
	if err := a.Release(t.Context()); err != nil {
		t.Error(err)
	}
	if ok, _ := b.TryAcquire(t.Context()); !ok {
		t.Error("the new holder lost the lease to a Release of a lease not held")
	}
}

// counterIndex stands for serve's index and consumer: a stream sequence
// that moves as messages are applied, and a snapshot of it.
type counterIndex struct {
	ix  *indexer.Index
	seq atomic.Uint64
}

func (c *counterIndex) take(_ context.Context, put PutFunc) error {
	return put(header("KVEVENTS", c.seq.Load()), c.ix.Snapshot)
}

// TestSnapshotter: of two replicas running the loop, one holds the lease
// and writes snapshots; when it stops, it releases the lease and the other
// takes over and writes the next ones.
func TestSnapshotter(t *testing.T) {
	url := startServer(t)
	src := counterIndex{ix: filledIndex(t, 0, 2)}
	src.seq.Store(1)
	var sns []*Snapshotter
	cancels := make([]context.CancelFunc, 2)
	done := make([]chan struct{}, 2)
	for i := range 2 {
		s, _ := openStore(t, url, Config{Model: "m", LeaseTTL: leaseTTL})
		sn, err := NewSnapshotter(s, SnapshotterConfig{ID: fmt.Sprintf("replica-%d", i), Interval: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		sns = append(sns, sn)
		ctx, cancel := context.WithCancel(t.Context())
		cancels[i], done[i] = cancel, make(chan struct{})
		go func() {
			defer close(done[i])
			sn.Run(ctx, src.take)
		}()
	}
	t.Cleanup(func() {
		for i := range cancels {
			cancels[i]()
			<-done[i]
		}
	})
	reader, _ := openStore(t, url, Config{Model: "m", LeaseTTL: leaseTTL})
	latestSeq := func() uint64 {
		h, body, err := reader.Latest(t.Context())
		if err != nil {
			return 0
		}
		body.Close()
		return h.StreamSeq
	}
	testutil.Await(t, awaitBound, "a snapshot at 1", func() bool { return latestSeq() == 1 })
	holder := -1
	testutil.Await(t, awaitBound, "one writer", func() bool {
		holder = -1
		for i, sn := range sns {
			if sn.Lease().Held() {
				holder = i
			}
		}
		return holder >= 0
	})
	if sns[1-holder].Lease().Held() {
		t.Fatal("both replicas hold the lease")
	}
	src.seq.Store(2)
	testutil.Await(t, awaitBound, "a snapshot at 2", func() bool { return latestSeq() == 2 })

	cancels[holder]()
	<-done[holder]
	other := sns[1-holder]
	testutil.Await(t, awaitBound, "the other replica takes over", other.Lease().Held)
	src.seq.Store(3)
	testutil.Await(t, awaitBound, "a snapshot at 3 by the new writer", func() bool { return latestSeq() == 3 })
	if n := value(t, other.store.writes.WithLabelValues("ok")); n < 1 {
		t.Errorf("the new writer wrote %v snapshots", n)
	}
}

// TestSnapshotSkipsUnchanged: Snapshot stores nothing without the lease,
// nor when nothing was applied since the last snapshot.
func TestSnapshotSkipsUnchanged(t *testing.T) {
	url := startServer(t)
	s, _ := openStore(t, url, Config{Model: "m", LeaseTTL: leaseTTL})
	sn, err := NewSnapshotter(s, SnapshotterConfig{ID: "replica", Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	src := counterIndex{ix: filledIndex(t, 0, 2)}
	for _, step := range []struct {
		name    string
		acquire bool
		seq     uint64
		stored  bool
	}{
		{"without the lease", false, 5, false},
		{"first", true, 5, true},
		{"nothing new", true, 5, false},
		{"newer", true, 6, true},
	} {
		if step.acquire {
			if ok, err := sn.Lease().TryAcquire(t.Context()); !ok || err != nil {
				t.Fatalf("%s: TryAcquire %v, %v", step.name, ok, err)
			}
		}
		src.seq.Store(step.seq)
		info, stored, err := sn.Snapshot(t.Context(), src.take)
		if err != nil || stored != step.stored || (stored && info.StreamSeq != step.seq) {
			t.Errorf("%s: %+v, %v, %v; want stored %v", step.name, info, stored, err, step.stored)
		}
	}
}

// TestSnapshotSpool: with a spool directory the upload happens after the
// parked part (put) returns; without, within it. Either way the snapshot
// stored restores the index, and the spool directory is left empty.
func TestSnapshotSpool(t *testing.T) {
	for _, tc := range []struct {
		name             string
		spool            bool
		storedWhenParked bool
	}{
		{"streamed", false, true},
		{"spooled", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := startServer(t)
			s, _ := openStore(t, url, Config{Model: "m", LeaseTTL: leaseTTL})
			cfg := SnapshotterConfig{ID: "replica", Interval: time.Hour}
			if tc.spool {
				cfg.SpoolDir = t.TempDir()
			}
			sn, err := NewSnapshotter(s, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := sn.Lease().TryAcquire(t.Context()); !ok || err != nil {
				t.Fatalf("TryAcquire %v, %v", ok, err)
			}
			ix := filledIndex(t, 0, 8)
			var storedWhenParked bool
			_, stored, err := sn.Snapshot(t.Context(), func(ctx context.Context, put PutFunc) error {
				// Ingest would be parked here.
				if err := put(header("KVEVENTS", 7), ix.Snapshot); err != nil {
					return err
				}
				_, body, err := s.Latest(ctx)
				if err == nil {
					body.Close()
				}
				storedWhenParked = err == nil
				return nil
			})
			if err != nil || !stored {
				t.Fatalf("Snapshot: %v, stored %v", err, stored)
			}
			if storedWhenParked != tc.storedWhenParked {
				t.Errorf("stored while parked: %v, want %v", storedWhenParked, tc.storedWhenParked)
			}
			if h, got := restoreLatest(t, s); h.StreamSeq != 7 || got.Digest() != ix.Digest() {
				t.Errorf("latest at %d (or another index), want the one at 7", h.StreamSeq)
			}
			if cfg.SpoolDir != "" {
				if ents, _ := os.ReadDir(cfg.SpoolDir); len(ents) != 0 {
					t.Errorf("spool dir holds %v", ents)
				}
			}
		})
	}
}

func TestNewSnapshotterRefuses(t *testing.T) {
	s, _ := openStore(t, startServer(t), Config{Model: "m"})
	for _, cfg := range []SnapshotterConfig{
		{Interval: time.Second},
		{ID: "a"},
		{ID: "a", Interval: -time.Second},
	} {
		if _, err := NewSnapshotter(s, cfg); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
}
