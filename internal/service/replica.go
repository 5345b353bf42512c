package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/buildinfo"
	"github.com/kvindex/kvindex/internal/lifecycle"
	"github.com/kvindex/kvindex/internal/snapstore"
	"github.com/kvindex/kvindex/internal/statefile"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/natstransport"
)

// finalSnapshotTimeout bounds the snapshot a stopping lease holder
// writes: a stop must not hang on an unreachable NATS.
const finalSnapshotTimeout = 20 * time.Second

// natsReplica is serve's event source in NATS mode: it starts from the
// newest snapshot in JetStream, consumes the event stream from the
// sequence after it, and, while it holds the writer lease, writes the
// snapshots the next replicas start from. Everything that needs NATS runs
// in the background, so serve answers /healthz (and reports not ready)
// while NATS is away.
type natsReplica struct {
	o       *NATSOptions
	model   string
	log     *slog.Logger // component=nats
	parent  *slog.Logger // for the components it starts (consumer, snapshots)
	index   *indexer.Index
	sink    kvevents.Sink
	hashing statefile.Hashing
	id      string // this replica's name in the lease
	host    string

	nc   *nats.Conn
	auth *natstransport.Auth // nil: insecure
	js   jetstream.JetStream

	consumer atomic.Pointer[natstransport.Consumer]
	caughtUp chan struct{} // closed once the consumer has caught up

	final       atomic.Pointer[finalSnapshot] // set once snapshots are written
	restoredSeq prometheus.Gauge
	// reg takes the metrics of the parts made once NATS answers (the
	// snapshot store's).
	reg prometheus.Registerer
}

func newNATSReplica(o *NATSOptions, auth *natstransport.Auth, model string, hc blockhash.Config, ix *indexer.Index, sink kvevents.Sink, log *slog.Logger) *natsReplica {
	host, _ := os.Hostname()
	return &natsReplica{
		o: o, auth: auth, model: model, log: log.With("component", "nats"), parent: log, index: ix, sink: sink, host: host,
		hashing: hashingOf(hc),
		// Unique per replica even when several share a host and process
		// (tests): the lease tells holders apart by it.
		id:       fmt.Sprintf("%s-%d-%08x", host, os.Getpid(), rand.Uint32()),
		caughtUp: make(chan struct{}),
		restoredSeq: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvindex_nats_snapshot_restored_stream_sequence",
			Help: "Stream sequence of the snapshot this replica started from (0: none; it read the stream from its start).",
		}),
	}
}

// hashingOf is how a snapshot records the hashing its keys were made
// with.
func hashingOf(hc blockhash.Config) statefile.Hashing {
	return statefile.Hashing{Algo: string(hc.Algo), Seed: hc.Seed, BlockSize: hc.BlockSize}
}

// parts are the replica's: the connection (closed last), then the
// bootstrap (stream, snapshot, consumer) and snapshot writer, which
// writes a final snapshot when it stops.
func (r *natsReplica) parts() []lifecycle.Part {
	return []lifecycle.Part{{
		Name: "NATS connection",
		Start: func(context.Context) error {
			if r.auth == nil {
				r.log.Warn(insecureWarning)
			}
			nc, js, err := r.o.Conn.connect(RoleReplica, "kvindex serve "+r.host, r.log)
			if err != nil {
				return err
			}
			r.nc, r.js = nc, js
			r.log.Info("NATS mode: connecting", "nats", r.o.Conn.Redacted(), "stream", r.o.Stream.Name, "snapshot_bucket", r.o.Snapshot.Bucket)
			return nil
		},
		Stop: func(context.Context) error {
			var err error
			if c := r.consumer.Load(); c != nil {
				err = c.Close()
			}
			r.nc.Close()
			return err
		},
	}, {
		Name: "NATS replica",
		Run: func(ctx context.Context) error {
			if err := r.bootstrap(ctx); err != nil && ctx.Err() == nil {
				r.log.Error("NATS mode: bootstrap failed", "err", err)
			}
			return nil
		},
		// Before the bootstrap's context ends: the snapshot needs the
		// consumer running.
		Stop: func(context.Context) error { r.writeFinal(); return nil },
	}}
}

// bootstrap ensures the stream, restores the newest usable snapshot,
// starts the consumer after it, and runs the snapshot writer.
func (r *natsReplica) bootstrap(ctx context.Context) error {
	if err := ensureStream(ctx, r.js, r.o.Stream, r.log); err != nil {
		return err
	}
	store, err := r.openStore(ctx)
	if err != nil {
		return err
	}
	for _, c := range store.Collectors() {
		if err := r.reg.Register(c); err != nil {
			r.log.Warn("snapshot metrics not registered", "err", err)
		}
	}
	start, resume := r.restore(ctx, store)
	c, err := natstransport.NewConsumer(r.js, natstransport.ConsumerConfig{
		Stream: r.o.Stream.Name, Model: r.model, StartSeq: start, Resume: resume, Auth: r.auth,
	}, r.sink, r.parent.With("component", "consumer"))
	if err != nil {
		return err
	}
	if err := c.Start(ctx); err != nil {
		return err
	}
	r.consumer.Store(c)
	begin := time.Now()
	select {
	case <-c.CaughtUp():
		close(r.caughtUp)
		r.log.Info("caught up with the event stream", "stream_seq", c.AppliedSeq(),
			"took", time.Since(begin).Round(time.Millisecond).String())
	case <-ctx.Done():
		return nil
	}
	r.writeSnapshots(ctx, store, c)
	return nil
}

// openStore opens the snapshot buckets, retrying while NATS is away.
func (r *natsReplica) openStore(ctx context.Context) (*snapstore.Store, error) {
	var store *snapstore.Store
	err := retryNATS(ctx, r.log, "snapshot store not ready; retrying", []any{"bucket", r.o.Snapshot.Bucket}, func(ctx context.Context) error {
		var err error
		cfg := r.o.Snapshot
		cfg.Auth = r.auth
		store, err = snapstore.Open(ctx, r.js, cfg, r.parent.With("component", "snapshots"))
		return err
	})
	return store, err
}

// restore loads the newest usable snapshot into the index (an older kept
// one when the newest cannot be read or restored) and returns the stream
// sequence to consume from and the engines' positions. Without one the
// replica reads the stream from its start.
func (r *natsReplica) restore(ctx context.Context, store *snapstore.Store) (uint64, []kvevents.Position) {
	begin := time.Now()
	var pos []kvevents.Position
	h, err := store.Load(ctx, func(h *statefile.Header, body io.Reader) error {
		if h.Hashing != r.hashing {
			return fmt.Errorf("hashed otherwise: saved %+v, now %+v", h.Hashing, r.hashing)
		}
		p, err := h.KVPositions()
		if err != nil {
			return err
		}
		if err := r.index.RestoreChecked(body, snapstore.Verifier(body)); err != nil {
			return err
		}
		pos = p
		return nil
	})
	switch {
	case errors.Is(err, snapstore.ErrNoSnapshot):
		r.log.Info("no usable snapshot; reading the event stream from its start", "bucket", r.o.Snapshot.Bucket, "why", err)
		return 0, nil
	case err != nil:
		r.log.Warn("snapshot unusable; reading the event stream from its start", "err", err)
		return 0, nil
	}
	r.restoredSeq.Set(float64(h.StreamSeq))
	st := r.index.Stats()
	r.log.Info("snapshot restored", "stream_seq", h.StreamSeq, "written", h.Written.Format(time.RFC3339),
		"engines", len(pos), "holder_blocks", st.HolderBlocks, "took", time.Since(begin).Round(time.Millisecond).String())
	return h.StreamSeq + 1, pos
}

// writeSnapshots runs the snapshot writer: one replica at a time (the
// holder of the lease) writes a snapshot every interval; the others take
// over when its lease is released or expires.
func (r *natsReplica) writeSnapshots(ctx context.Context, store *snapstore.Store, c *natstransport.Consumer) {
	sn, err := snapstore.NewSnapshotter(store, snapstore.SnapshotterConfig{ID: r.id, Interval: r.o.Interval})
	if err != nil {
		r.log.Error("snapshots disabled", "err", err)
		return
	}
	take := func(_ context.Context, put snapstore.PutFunc) error {
		return c.Checkpoint(func(seq uint64, pos []kvevents.Position) error {
			return put(&statefile.Header{Written: time.Now().UTC(), Version: buildinfo.Read().Version,
				Hashing: r.hashing, Positions: statefile.FromPositions(pos), Stream: r.o.Stream.Name, StreamSeq: seq}, r.index.Snapshot)
		})
	}
	r.final.Store(&finalSnapshot{sn: sn, take: take})
	sn.Run(ctx, take)
}

// finalSnapshot is what the stop needs to write the last snapshot.
type finalSnapshot struct {
	sn   *snapstore.Snapshotter
	take snapstore.TakeFunc
}

// writeFinal writes a last snapshot if this replica holds the writer
// lease, so that the next replica to start (a rolling update's) resumes
// from here rather than from the last periodic one.
func (r *natsReplica) writeFinal() {
	f := r.final.Load()
	if f == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), finalSnapshotTimeout)
	defer cancel()
	info, stored, err := f.sn.Snapshot(ctx, f.take)
	switch {
	case err != nil:
		r.log.Warn("final snapshot not written; the previous one stays", "err", err)
	case stored:
		r.log.Info("final snapshot written", "stream_seq", info.StreamSeq, "bytes", info.Size)
	}
}

// Streams implements server.StreamSource.
func (r *natsReplica) Streams() []kvevents.StreamStats {
	if c := r.consumer.Load(); c != nil {
		return c.Streams()
	}
	return nil
}

// IndexSeq is the stream sequence the index has applied through.
func (r *natsReplica) IndexSeq() uint64 {
	if c := r.consumer.Load(); c != nil {
		return c.AppliedSeq()
	}
	return 0
}

// CaughtUp is closed once the replica has applied the stream as it was
// when the consumer started: serve is ready then.
func (r *natsReplica) CaughtUp() <-chan struct{} { return r.caughtUp }

func (r *natsReplica) collectors() []prometheus.Collector {
	return []prometheus.Collector{r.restoredSeq, consumerCollector{r}}
}

// consumerCollector exports the consumer's counters (zero before it
// exists): what it read and what it refused.
type consumerCollector struct{ r *natsReplica }

var (
	descConsumerMessages = prometheus.NewDesc("kvindex_nats_consumer_messages_total",
		"Records read from the JetStream stream.", nil, nil)
	descConsumerDropped = prometheus.NewDesc("kvindex_nats_consumer_dropped_total",
		"Records and heartbeats dropped before any engine saw them, by reason: malformed (subject or headers), redelivered (already applied), forged (not signed with the --nats-auth-key).", []string{"reason"}, nil)
	descConsumerBadBeats = prometheus.NewDesc("kvindex_nats_consumer_bad_heartbeats_total",
		"Relay heartbeats that did not decode.", nil, nil)
	descConsumerSeq = prometheus.NewDesc("kvindex_nats_index_stream_sequence",
		"Stream sequence the index has applied through: the index_seq answers report.", nil, nil)
)

func (consumerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descConsumerMessages, descConsumerDropped, descConsumerBadBeats, descConsumerSeq} {
		ch <- d
	}
}

func (cc consumerCollector) Collect(ch chan<- prometheus.Metric) {
	var st natstransport.ConsumerStats
	if c := cc.r.consumer.Load(); c != nil {
		st = c.Stats()
	}
	ch <- prometheus.MustNewConstMetric(descConsumerMessages, prometheus.CounterValue, float64(st.Messages))
	ch <- prometheus.MustNewConstMetric(descConsumerDropped, prometheus.CounterValue, float64(st.Malformed), "malformed")
	ch <- prometheus.MustNewConstMetric(descConsumerDropped, prometheus.CounterValue, float64(st.Redelivery), "redelivered")
	ch <- prometheus.MustNewConstMetric(descConsumerDropped, prometheus.CounterValue, float64(st.Forged), "forged")
	ch <- prometheus.MustNewConstMetric(descConsumerBadBeats, prometheus.CounterValue, float64(st.BadBeats))
	ch <- prometheus.MustNewConstMetric(descConsumerSeq, prometheus.GaugeValue, float64(st.AppliedSeq))
}
