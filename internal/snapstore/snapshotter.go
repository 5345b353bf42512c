package snapstore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/kvindex/kvindex/internal/statefile"
)

// PutFunc stores one snapshot: h, then the index snapshot that snapshot
// streams. A TakeFunc calls it while ingest is parked.
type PutFunc func(h *statefile.Header, snapshot func(io.Writer) error) error

// TakeFunc takes one snapshot: it parks ingest, builds the header from
// what the index holds (the stream and its last applied sequence, the
// engines' positions) and calls put with it and the index's Snapshot,
// returning put's error. For serve with a NATS consumer:
//
//	func(ctx context.Context, put snapstore.PutFunc) error {
//		return consumer.Checkpoint(func(seq uint64, pos []kvevents.Position) error {
//			return put(&statefile.Header{Written: time.Now().UTC(), Hashing: hashing,
//				Positions: statefile.FromPositions(pos), Stream: stream, StreamSeq: seq}, index.Snapshot)
//		})
//	}
//
// Without SnapshotterConfig.SpoolDir, ingest stays parked while the
// snapshot uploads (it streams to the object store as it is encoded);
// with it, only while it is written to a local file. Queries go on.
type TakeFunc func(ctx context.Context, put PutFunc) error

// SnapshotterConfig configures a Snapshotter.
type SnapshotterConfig struct {
	// ID names this process as the lease holder: unique among the
	// replicas (e.g. the pod name).
	ID string
	// Interval is the time between two snapshots.
	Interval time.Duration
	// SpoolDir, when set, is a directory where a snapshot is written
	// while ingest is parked, then uploaded from after ingest resumes: the
	// pause is a local write instead of an upload. The file is unlinked
	// as soon as it is created, so nothing is left behind, even by a
	// crash.
	SpoolDir string
}

// Snapshotter writes the model's snapshots from the one process that holds
// the writer lease: Run keeps trying to acquire (and renewing) the lease
// and, while it holds it, takes a snapshot every interval.
type Snapshotter struct {
	store *Store
	lease *Lease
	cfg   SnapshotterConfig

	mu   sync.Mutex // one snapshot at a time
	last Info       // the last snapshot this process stored
}

// NewSnapshotter returns a Snapshotter of s.
func NewSnapshotter(s *Store, cfg SnapshotterConfig) (*Snapshotter, error) {
	if cfg.ID == "" {
		return nil, errors.New("snapstore: snapshotter: no holder id")
	}
	if cfg.Interval <= 0 {
		return nil, fmt.Errorf("snapstore: snapshotter: interval %v", cfg.Interval)
	}
	return &Snapshotter{store: s, lease: s.Lease(cfg.ID), cfg: cfg}, nil
}

// Lease is the Snapshotter's writer lease (Held says whether this process
// is the writer).
func (sn *Snapshotter) Lease() *Lease { return sn.lease }

// renewEvery is how often the lease is renewed: four times per TTL, so a
// renewal or two can fail without the lease expiring.
func (sn *Snapshotter) renewEvery() time.Duration { return sn.store.leaseTTL / 4 }

// Run holds the lease when it can and snapshots every interval while it
// does, until ctx ends; then it releases the lease, so another replica
// takes over at once. The lease is renewed on its own schedule (a quarter
// of the TTL), not delayed by a snapshot in progress. Failures are
// counted and logged by the Store; Run goes on.
func (sn *Snapshotter) Run(ctx context.Context, take TakeFunc) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sn.holdLease(ctx)
	}()
	t := time.NewTicker(sn.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sn.renewEvery())
			defer cancel()
			if err := sn.lease.Release(rctx); err != nil {
				sn.store.log.Warn("snapstore: releasing the writer lease failed; it expires by itself", "err", err)
			}
			return
		case <-t.C:
			if sn.lease.Held() {
				_, _, _ = sn.Snapshot(ctx, take)
			}
		}
	}
}

// holdLease tries to acquire or renew the lease at once and then every
// renewEvery until ctx ends.
func (sn *Snapshotter) holdLease(ctx context.Context) {
	t := time.NewTicker(sn.renewEvery())
	defer t.Stop()
	for {
		tctx, cancel := context.WithTimeout(ctx, sn.renewEvery())
		if _, err := sn.lease.TryAcquire(tctx); err != nil && ctx.Err() == nil {
			sn.store.log.Warn("snapstore: writer lease", "err", err)
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Snapshot takes and stores one snapshot now if this process holds the
// lease (e.g. at shutdown, before Run's context ends). It reports whether
// one was stored: not when the lease is not held, nor when the index has
// applied nothing since the last one (same stream and sequence), nor when
// another writer stored a newer one meanwhile (a lease handover).
func (sn *Snapshotter) Snapshot(ctx context.Context, take TakeFunc) (Info, bool, error) {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	if !sn.lease.Held() {
		return Info{}, false, nil
	}
	var info Info
	var stored bool
	var spool *os.File
	var spoolHeader *statefile.Header
	err := take(ctx, func(h *statefile.Header, snapshot func(io.Writer) error) error {
		if h.StreamSeq != 0 && h.Stream == sn.last.Stream && h.StreamSeq == sn.last.StreamSeq {
			return nil // nothing new
		}
		if sn.cfg.SpoolDir != "" {
			f, err := spoolSnapshot(sn.cfg.SpoolDir, snapshot)
			spool, spoolHeader = f, h
			return err
		}
		var err error
		info, err = sn.store.Put(ctx, h, snapshot)
		stored = err == nil
		return err
	})
	if spool != nil {
		defer spool.Close()
		if err == nil {
			info, err = sn.store.Put(ctx, spoolHeader, func(w io.Writer) error {
				if _, err := spool.Seek(0, io.SeekStart); err != nil {
					return err
				}
				_, err := io.Copy(w, bufio.NewReaderSize(spool, 1<<20))
				return err
			})
			stored = err == nil
		}
	}
	if errors.Is(err, ErrSuperseded) {
		return Info{}, false, nil
	}
	if err != nil {
		return Info{}, false, err
	}
	if stored {
		sn.last = info
	}
	return info, stored, nil
}

// spoolSnapshot writes the index snapshot to an unlinked temporary file
// in dir, for the upload to read once ingest resumes.
func spoolSnapshot(dir string, snapshot func(io.Writer) error) (*os.File, error) {
	f, err := os.CreateTemp(dir, "kvindex-snapshot-*")
	if err != nil {
		return nil, fmt.Errorf("snapstore: spool: %w", err)
	}
	// Unlinked at once: the open file is all there is, gone when closed.
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, fmt.Errorf("snapstore: spool: %w", err)
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	err = snapshot(bw)
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("snapstore: spool: %w", err)
	}
	return f, nil
}
