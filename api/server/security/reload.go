package security

import (
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultReloadCheck is how often, at most, the certificate and auth files
// are looked at for changes (Config.ReloadCheck).
const DefaultReloadCheck = 2 * time.Second

// fileStamp identifies a file's content cheaply: rewriting a file (or a
// Kubernetes Secret update swapping the ..data symlink) changes its
// modification time or size.
type fileStamp struct {
	mod  time.Time
	size int64
}

// Reloader holds a value loaded from files and loads it again when one of
// them changes. It is checked on use (a TLS handshake, a request), at most
// once per interval, so an idle server does no work and a busy one one
// stat per file per interval. A new version that fails to load keeps the
// old one: the failure is logged and counted, and the files are tried again
// when they change again (a certificate written before its key loads once
// both are written).
type Reloader[T any] struct {
	what   string // "tls" or "auth", for logs and kvindex_config_reloads_total
	paths  []string
	load   func() (*T, error)
	every  time.Duration
	now    func() time.Time
	log    *slog.Logger
	result func(ok bool)

	cur     atomic.Pointer[T]
	checked atomic.Int64 // unix nanos of the last check

	mu      sync.Mutex
	stamps  []fileStamp
	lastErr string // the last stat failure logged, so a missing file logs once
}

// NewReloader loads the value of paths with load, once; an error here
// stops the server from starting. what names the value in logs ("tls",
// "auth"); every is how often, at most, the files are looked at (Get);
// result is told of each reload, true when it succeeded, and of each
// changed file it could not read.
func NewReloader[T any](what string, paths []string, every time.Duration, now func() time.Time, log *slog.Logger, result func(ok bool), load func() (*T, error)) (*Reloader[T], error) {
	r := &Reloader[T]{what: what, paths: paths, load: load, every: every, now: now, log: log, result: result}
	stamps, err := r.stat()
	if err != nil {
		return nil, err
	}
	v, err := load()
	if err != nil {
		return nil, err
	}
	r.cur.Store(v)
	r.stamps = stamps
	r.checked.Store(now().UnixNano())
	return r, nil
}

func (r *Reloader[T]) stat() ([]fileStamp, error) {
	out := make([]fileStamp, len(r.paths))
	for i, p := range r.paths {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		out[i] = fileStamp{fi.ModTime(), fi.Size()}
	}
	return out, nil
}

// Get returns the current value, reloading it first if the check is due
// and a file changed. Concurrent callers never wait for a reload: they get
// the value in place.
func (r *Reloader[T]) Get() *T {
	now := r.now().UnixNano()
	if last := r.checked.Load(); now-last < int64(r.every) || !r.mu.TryLock() {
		return r.cur.Load()
	}
	defer r.mu.Unlock()
	r.checked.Store(now)
	stamps, err := r.stat()
	if err != nil {
		if msg := err.Error(); msg != r.lastErr {
			r.lastErr = msg
			r.result(false)
			r.log.Error("cannot read a changed file; keeping the loaded version", "what", r.what, "err", err)
		}
		return r.cur.Load()
	}
	r.lastErr = ""
	if slices.Equal(stamps, r.stamps) {
		return r.cur.Load()
	}
	r.stamps = stamps
	v, err := r.load()
	if err != nil {
		r.result(false)
		r.log.Error("reload failed; keeping the loaded version", "what", r.what, "err", err)
		return r.cur.Load()
	}
	r.cur.Store(v)
	r.result(true)
	r.log.Info("reloaded", "what", r.what, "files", r.paths)
	return v
}
