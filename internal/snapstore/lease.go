package snapstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Lease is one process's claim to be the model's snapshot writer: a key
// in the lease bucket, created when absent and renewed by
// revision-checked updates while held. The bucket's TTL removes a lease
// its holder stopped renewing, so another process acquires it then.
// Renew it (TryAcquire) more often than a third of LeaseTTL. Its methods
// are safe for concurrent use.
type Lease struct {
	s  *Store
	id string

	mu      sync.Mutex
	rev     uint64    // the lease key's revision we wrote last; 0 when not held
	renewed time.Time // when that write was acknowledged
}

// leaseValue is the lease key's value: who holds it, for people reading
// the bucket (the revision, not the value, decides).
type leaseValue struct {
	Holder  string    `json:"holder"`
	Renewed time.Time `json:"renewed"`
}

// Lease returns the model's writer lease for holder id, which must be
// unique among the processes contending (e.g. the pod name). It is not
// acquired yet.
func (s *Store) Lease(id string) *Lease { return &Lease{s: s, id: id} }

func (l *Lease) key() string { return l.s.model + ".lease" }

// TryAcquire acquires the lease if nobody holds it, or renews it if this
// Lease holds it. It reports whether it is held now: false, nil when
// another holder has it (a lease this Lease held and lost, by expiry or
// to another holder, is logged). An error (NATS unreachable) leaves the
// lease not held here; a later call renews it if nobody took it.
func (l *Lease) TryAcquire(ctx context.Context) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	val, err := json.Marshal(leaseValue{Holder: l.id, Renewed: time.Now().UTC()})
	if err != nil {
		return false, err
	}
	sent := time.Now()
	if l.rev != 0 {
		rev, err := l.s.leases.Update(ctx, l.key(), val, l.rev)
		if err == nil {
			l.held(rev, sent)
			return true, nil
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			// Unknown whether the renewal landed: not held until one does.
			l.renewed = time.Time{}
			l.s.leaseHeld.Set(0)
			return false, fmt.Errorf("snapstore: renewing the lease: %w", err)
		}
		// It expired, was released or was taken: acquire it afresh below.
		l.lost("the lease key changed (expired or taken)")
	}
	rev, err := l.s.leases.Create(ctx, l.key(), val)
	if err == nil {
		l.held(rev, sent)
		l.s.log.Info("snapstore: writer lease acquired", "holder", l.id, "ttl", l.s.leaseTTL.String())
		return true, nil
	}
	if errors.Is(err, jetstream.ErrKeyExists) {
		return false, nil
	}
	return false, fmt.Errorf("snapstore: acquiring the lease: %w", err)
}

func (l *Lease) held(rev uint64, sent time.Time) {
	l.rev, l.renewed = rev, sent
	l.s.leaseHeld.Set(1)
}

func (l *Lease) lost(why string) {
	l.s.log.Warn("snapstore: writer lease lost", "holder", l.id, "why", why)
	l.rev, l.renewed = 0, time.Time{}
	l.s.leaseHeld.Set(0)
}

// Held reports whether this Lease holds the lease: its last acquisition
// or renewal succeeded and, counted from before it was sent, the TTL has
// not run out since (the bucket may have removed it by then).
func (l *Lease) Held() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rev != 0 && !l.renewed.IsZero() && time.Since(l.renewed) < l.s.leaseTTL
}

// Release gives the lease up if this Lease holds it, so another process
// acquires it at once instead of after the TTL.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.rev == 0 {
		return nil
	}
	rev := l.rev
	l.rev, l.renewed = 0, time.Time{}
	l.s.leaseHeld.Set(0)
	err := l.s.leases.Delete(ctx, l.key(), jetstream.LastRevision(rev))
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		return nil // no longer ours anyway
	}
	if err != nil {
		return fmt.Errorf("snapstore: releasing the lease: %w", err)
	}
	l.s.log.Info("snapstore: writer lease released", "holder", l.id)
	return nil
}
