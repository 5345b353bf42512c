package service

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/buildinfo"
	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/internal/lifecycle"
	"github.com/kvindex/kvindex/internal/statefile"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// stateDir is serve's --state-dir: it restores the index and the engine
// streams' positions when serve starts, and writes them every
// --snapshot-interval and when serve stops. A restored engine is reported
// restored until its engine confirms the position (kvevents.HealthRestored).
type stateDir struct {
	dir      string
	interval time.Duration
	hashing  statefile.Hashing
	log      *slog.Logger
	index    *indexer.Index
	sub      *zmqtransport.Subscriber // set once the subscriber exists

	mu      sync.Mutex // one write at a time
	stopped bool       // the shutdown snapshot is written; no more after it

	writes       *prometheus.CounterVec
	lastBytes    prometheus.Gauge
	lastPause    prometheus.Gauge
	lastDuration prometheus.Gauge
	lastSuccess  prometheus.Gauge
	restored     prometheus.Gauge
}

// newStateDir prepares dir (created if missing, leftovers of a crashed
// write removed) and checks that kvindex can write there.
func newStateDir(o *Options, ix *indexer.Index, log *slog.Logger) (*stateDir, error) {
	field := configerr.Field("StateDir")
	if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
		return nil, configerr.Failed(field, "%v: %w", field, err)
	}
	if err := statefile.Clean(o.StateDir); err != nil {
		return nil, configerr.Failed(field, "%v: removing unfinished snapshots: %w", field, err)
	}
	w, err := statefile.Begin(o.StateDir)
	if err != nil {
		return nil, configerr.Failed(field, "%v: not writable: %w", field, err)
	}
	w.Abort()
	return &stateDir{
		dir: o.StateDir, interval: o.SnapshotInterval, log: log, index: ix,
		hashing: hashingOf(o.Index.Hasher.Config()),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_state_snapshots_total",
			Help: "State snapshots written to --state-dir, by result (ok, error).",
		}, []string{"result"}),
		lastBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvindex_state_snapshot_bytes", Help: "Size of the last state snapshot written.",
		}),
		lastPause: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvindex_state_snapshot_ingest_pause_seconds",
			Help: "How long the last state snapshot held event ingest still (queries go on).",
		}),
		lastDuration: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvindex_state_snapshot_duration_seconds",
			Help: "How long the last state snapshot took, fsync and rename included.",
		}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvindex_state_snapshot_last_success_timestamp_seconds",
			Help: "When the last state snapshot was written (Unix time); 0 before the first.",
		}),
		restored: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvindex_state_restored_engines",
			Help: "Engine streams restored from the state directory when kvindex started.",
		}),
	}, nil
}

// collectors are the state directory's metrics.
func (d *stateDir) collectors() []prometheus.Collector {
	d.writes.WithLabelValues("ok")
	d.writes.WithLabelValues("error")
	return []prometheus.Collector{d.writes, d.lastBytes, d.lastPause, d.lastDuration, d.lastSuccess, d.restored}
}

// restore loads the state file into the index and returns the positions to
// resume. Whatever it cannot use (no file, another hash configuration, a
// corrupted file) leaves the index empty and is logged: kvindex then starts
// as without a state directory. A corrupted file is kept as
// kvindex.state.bad for inspection.
func (d *stateDir) restore(o *Options) []kvevents.Position {
	start := time.Now()
	h, r, c, err := statefile.Open(d.dir)
	if errors.Is(err, fs.ErrNotExist) {
		d.log.Info("state dir holds no state yet; starting empty", "dir", d.dir)
		return nil
	}
	if err == nil {
		defer c.Close()
	}
	var pos []kvevents.Position
	switch {
	case err != nil:
	case h.Hashing != d.hashing:
		d.log.Warn("state dir: the saved index was hashed otherwise; starting empty (the next snapshot replaces it)",
			"dir", d.dir, "saved", fmt.Sprintf("%+v", h.Hashing), "now", fmt.Sprintf("%+v", d.hashing))
		return nil
	default:
		if pos, err = h.KVPositions(); err == nil {
			err = d.index.Restore(r)
		}
	}
	if err != nil {
		bad := filepath.Join(d.dir, statefile.Name+".bad")
		rerr := os.Rename(filepath.Join(d.dir, statefile.Name), bad)
		d.log.Error("state dir: state file refused; starting empty", "dir", d.dir, "err", err, "kept_as", bad, "rename_err", rerr)
		return nil
	}
	pos, dropped := keepConfigured(o, pos)
	kept := make(map[kvevents.EngineID]bool, len(pos))
	for _, p := range pos {
		kept[p.Engine] = true
	}
	for _, e := range d.index.Engines() {
		if !kept[e.Engine] {
			// Entries of an engine kvindex no longer follows, or without a
			// position: nothing would ever confirm or clear them.
			d.index.RemoveEngine(e.Engine)
		}
	}
	d.restored.Set(float64(len(pos)))
	st := d.index.Stats()
	d.log.Info("state restored; each engine is reported restored until it confirms its position",
		"dir", d.dir, "written", h.Written.Format(time.RFC3339), "age", time.Since(h.Written).Round(time.Second).String(),
		"engines", len(pos), "dropped_engines", dropped, "holder_blocks", st.HolderBlocks,
		"took", time.Since(start).Round(time.Millisecond).String())
	return pos
}

// keepConfigured keeps the positions of engines this configuration
// follows: in connect mode the --engine ranks (by name, rank and model); in
// bind mode any engine, up to --max-engines. It returns how many it dropped.
func keepConfigured(o *Options, pos []kvevents.Position) ([]kvevents.Position, int) {
	configured := map[kvevents.EngineID]bool{}
	for _, e := range o.Engines {
		for r := range max(e.Ranks, 1) {
			configured[kvevents.EngineID{Model: e.Model, Pod: e.Name, DPRank: r}] = true
		}
	}
	var out []kvevents.Position
	bound := 0
	for _, p := range pos {
		switch {
		case configured[p.Engine]:
			out = append(out, p)
		case o.Listen != "" && bound < o.maxEngines():
			bound++
			out = append(out, p)
		}
	}
	return out, len(pos) - len(out)
}

// shutdownSnapshot is why the last snapshot is written.
const shutdownSnapshot = "shutdown"

// part is the state directory's part of the service: a snapshot every
// interval, and the last one when the service stops, after the servers
// and before the subscriber: what the engines sent up to now, so that a
// restart resumes from here.
func (d *stateDir) part() lifecycle.Part {
	return lifecycle.Part{
		Name: "state directory",
		Run: func(ctx context.Context) error {
			t := time.NewTicker(d.interval)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return nil
				case <-t.C:
					_ = d.write("periodic")
				}
			}
		},
		Stop: func(context.Context) error { return d.write(shutdownSnapshot) },
	}
}

// write takes a snapshot: ingest is parked while the index is streamed to
// a temporary file (queries go on), then the file is fsynced and renamed
// into place. A failure keeps the previous state file, and is counted and
// logged.
func (d *stateDir) write(why string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return nil
	}
	d.stopped = why == shutdownSnapshot
	start := time.Now()
	w, err := statefile.Begin(d.dir)
	var pause time.Duration
	var engines int
	if err == nil {
		err = d.sub.Checkpoint(func(pos []kvevents.Position) error {
			engines = len(pos)
			h := &statefile.Header{Written: time.Now().UTC(), Version: buildinfo.Read().Version,
				Hashing: d.hashing, Positions: statefile.FromPositions(pos)}
			err := w.Write(h, d.index.Snapshot)
			pause = time.Since(start)
			return err
		})
		if err == nil {
			err = w.Commit()
		} else {
			w.Abort()
		}
	}
	took := time.Since(start)
	if err != nil {
		d.writes.WithLabelValues("error").Inc()
		d.log.Warn("state snapshot failed; the previous one stays", "dir", d.dir, "why", why, "err", err)
		return err
	}
	d.writes.WithLabelValues("ok").Inc()
	d.lastBytes.Set(float64(w.Size()))
	d.lastPause.Set(pause.Seconds())
	d.lastDuration.Set(took.Seconds())
	d.lastSuccess.Set(float64(time.Now().UnixNano()) / 1e9)
	level := slog.LevelDebug
	if why == shutdownSnapshot {
		level = slog.LevelInfo
	}
	d.log.Log(context.Background(), level, "state snapshot written", "dir", d.dir, "why", why, "engines", engines,
		"bytes", w.Size(), "ingest_pause", pause.Round(time.Microsecond).String(), "took", took.Round(time.Microsecond).String())
	return nil
}

// DescribeState says what dir's state file holds.
func DescribeState(dir string) string {
	h, _, c, err := statefile.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return "no state yet"
	}
	if err != nil {
		return err.Error()
	}
	c.Close()
	return fmt.Sprintf("state of %s, %d engines", h.Written.Format(time.RFC3339), len(h.Positions))
}
