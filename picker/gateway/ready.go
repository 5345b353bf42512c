package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/kvindexv1"
)

// The remote index's reconnection: gRPC's backoff between connection
// attempts, capped far below its default 120 s so that a picker started
// before its index (a sidecar's usual order) uses the index within
// seconds of its coming up; and the retry of a warm-up the index refused
// (a connection up, its ListPods failing).
const (
	IndexReconnectMax = 5 * time.Second
	warmRetryMin      = 100 * time.Millisecond
	warmRetryMax      = IndexReconnectMax
)

// IndexDialOption is the dial option of a remote index's connection
// (Remote): reconnect with backoff up to IndexReconnectMax.
func IndexDialOption() grpc.DialOption {
	b := backoff.DefaultConfig
	b.MaxDelay = IndexReconnectMax
	return grpc.WithConnectParams(grpc.ConnectParams{Backoff: b, MinConnectTimeout: IndexReconnectMax})
}

// The index's state as the picker sees it (indexState.state).
const (
	idxUntracked  int32 = iota // never warmed (Warm not called): queries are asked and judged by their answers
	idxConnecting              // Warm called, the index not yet warm
	idxUp                      // warm: queries are asked
	idxDown                    // unreachable: queries are not asked, requests route by load and session
)

// indexState is whether the remote index answers, why not, and who
// hears when that changes.
type indexState struct {
	state atomic.Int32
	mu    sync.Mutex
	why   string
	hooks []func(ready bool)
}

// IndexReady reports whether the picker's index answers, and if not why:
// an index in the same process always does; a remote one once its
// connection is warm (Warm), and not while it is unreachable.
func (s *Service) IndexReady() (ready bool, reason string) {
	if _, remote := s.src.(Remote); !remote {
		return true, ""
	}
	if s.idx.state.Load() == idxUp {
		return true, ""
	}
	s.idx.mu.Lock()
	defer s.idx.mu.Unlock()
	if s.idx.why == "" {
		return false, "the index has not answered yet"
	}
	return false, s.idx.why
}

// OnIndexReady calls f with the index's readiness now and at each change
// (the gRPC health service follows it).
func (s *Service) OnIndexReady(f func(ready bool)) {
	s.idx.mu.Lock()
	defer s.idx.mu.Unlock() // held while f runs, so that no change overtakes it
	s.idx.hooks = append(s.idx.hooks, f)
	_, remote := s.src.(Remote)
	f(!remote || s.idx.state.Load() == idxUp)
}

// setIndex records that the index answers (up) or not and why, logging
// each change once: a picker whose index stays away logs it once, not
// once per attempt. args are logged with the change. It reports whether
// the state changed.
func (s *Service) setIndex(up bool, why string, args ...any) (changed bool) {
	s.idx.mu.Lock()
	defer s.idx.mu.Unlock()
	next := idxDown
	if up {
		next, why = idxUp, ""
	}
	s.idx.why = why
	if s.idx.state.Swap(next) == next {
		return false
	}
	if up {
		s.log.Info("picker: the index answers; requests are routed by prefix, load and session", args...)
	} else {
		s.log.Warn("picker: the index is unreachable; requests are routed by load and session until it answers", append(args, "reason", why)...)
	}
	for _, f := range s.idx.hooks {
		f(up)
	}
	return true
}

// Warm warms a remote index's connection (Remote.Warm), so that the
// first requests are answered by the index rather than routed without
// it, and keeps it warm until ctx ends: re-warmed after each reconnect,
// reconnected when it goes idle, and, while the index is unreachable,
// tried again with backoff (IndexDialOption). Warm returns once the
// first warm-up ends, or fails, or timeout (DefaultWarmTimeout if 0)
// passes; the watch goes on. A failure is logged and counted and
// returned, but the picker still routes (by load and session: the
// fallback index_unreachable) and reports the index not ready
// (IndexReady) until it answers. A source in the same process needs no
// warming: Warm returns nil at once.
func (s *Service) Warm(ctx context.Context, timeout time.Duration) error {
	r, ok := s.src.(Remote)
	if !ok {
		if l, ok := s.src.(Local); ok {
			if hc, ok := l.Server.(hashConfigSource); ok {
				s.learnHashing(ctx, "in-process", func(ctx context.Context) (*kvindexv1.HashConfig, error) {
					return hc.GetHashConfig(ctx, &kvindexv1.GetHashConfigRequest{})
				})
			}
		}
		return nil
	}
	if timeout <= 0 {
		timeout = DefaultWarmTimeout
	}
	s.idx.state.CompareAndSwap(idxUntracked, idxConnecting)
	first := make(chan error, 1)
	go s.keepWarm(ctx, r, timeout, first)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case err := <-first:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		err := fmt.Errorf("warming the index connection: no answer from %s within %v", r.Client.Addr(), timeout)
		s.setIndex(false, err.Error())
		return err
	}
}

// errUnreachable is the first warm-up's failure when the connection
// fails before it is up.
var errUnreachable = errors.New("the index is unreachable")

// keepWarm follows the connection's state until ctx ends: it connects an
// idle connection, marks the index down when connecting fails, and warms
// each connection that comes up (then marks the index up). first hears
// the first warm-up's outcome.
func (s *Service) keepWarm(ctx context.Context, r Remote, timeout time.Duration, first chan<- error) {
	conn := r.Client.Conn()
	report := func(err error) {
		if first != nil {
			first <- err
			first = nil
		}
	}
	warmed, what, retry := false, "start", warmRetryMin
	conn.Connect()
	for {
		state := conn.GetState()
		switch state {
		case connectivity.Shutdown:
			return
		case connectivity.Idle:
			conn.Connect()
		case connectivity.TransientFailure:
			why := "no connection to the index at " + r.Client.Addr() + "; connecting again with backoff"
			s.setIndex(false, why)
			report(fmt.Errorf("warming the index connection: %w: %s", errUnreachable, why))
		case connectivity.Ready:
			if warmed {
				break
			}
			if err := s.warm(ctx, r, timeout, what); err != nil {
				report(err)
				// Up but refusing: try again after a while, or sooner if
				// the connection changes.
				wctx, cancel := context.WithTimeout(ctx, retry)
				conn.WaitForStateChange(wctx, state)
				cancel()
				if ctx.Err() != nil {
					return
				}
				retry = min(2*retry, warmRetryMax)
				continue
			}
			warmed, what, retry = true, "reconnect", warmRetryMin
			report(nil)
		}
		if state != connectivity.Ready {
			// The next connection may reach another index, hashing
			// otherwise: learnt again at its warm-up, token ids until then.
			warmed = false
			s.hash.Store(nil)
		}
		if !conn.WaitForStateChange(ctx, state) {
			return
		}
	}
}

// warm makes one warm-up call within timeout, counts it and records the
// index's state.
func (s *Service) warm(ctx context.Context, r Remote, timeout time.Duration, what string) error {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	err := r.Warm(wctx)
	took := time.Since(start).Round(time.Microsecond)
	if ctx.Err() != nil {
		return ctx.Err() // stopping
	}
	if err != nil {
		s.m.warmups.WithLabelValues("error").Inc()
		why := fmt.Sprintf("the index at %s did not answer the warm-up: %s", r.Client.Addr(), status.Convert(err).Message())
		s.log.Debug("picker: warming the index connection failed", "on", what, "took", took, "err", err)
		s.setIndex(false, why, "on", what)
		return fmt.Errorf("warming the index connection: %w", err)
	}
	s.m.warmups.WithLabelValues("ok").Inc()
	s.learnHashing(wctx, r.Client.Addr(), func(ctx context.Context) (*kvindexv1.HashConfig, error) {
		return r.Client.Index.GetHashConfig(ctx, &kvindexv1.GetHashConfigRequest{})
	})
	if !s.setIndex(true, "", "on", what, "took", took) {
		s.log.Info("picker: index connection warm", "on", what, "took", took)
	}
	return nil
}
