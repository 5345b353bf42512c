package snapstore

import (
	"bufio"
	"cmp"
	"context"
	"crypto/hmac"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/internal/statefile"
	"github.com/kvindex/kvindex/kvevents/natstransport"
)

// ErrNoSnapshot is Latest's and Load's error when the model has no usable
// snapshot: a replica then starts empty and replays the whole stream. It
// satisfies errors.Is(err, fs.ErrNotExist), as statefile.Open's missing
// file does.
var ErrNoSnapshot = fmt.Errorf("snapstore: no snapshot: %w", fs.ErrNotExist)

// ErrSuperseded is Put's error when the model's pointer already names a
// snapshot of the same stream at the same or a later sequence: the new
// one would not be newer, so it is not kept.
var ErrSuperseded = errors.New("snapstore: a snapshot at the same or a later stream sequence exists")

// chunkSize is the object store chunk: JetStream messages well under the
// default 1 MiB max payload.
const chunkSize = 128 << 10

// pointerRetries bounds the revision-checked pointer update's retries
// when other writers move it at the same time.
const pointerRetries = 8

// Info describes one stored snapshot; it is also the pointer's JSON.
type Info struct {
	// Object is the snapshot's object name in the bucket.
	Object string `json:"object"`
	// Stream and StreamSeq are the header's: the index holds the stream's
	// messages through StreamSeq.
	Stream    string `json:"stream,omitempty"`
	StreamSeq uint64 `json:"stream_seq"`
	// Created is when the snapshot was stored.
	Created time.Time `json:"created"`
	// Size is the state file's size in bytes.
	Size uint64 `json:"size"`
	// Digest is the object store's SHA-256 of the object.
	Digest string `json:"digest,omitempty"`
}

// Store keeps one model's snapshots in a JetStream Object Store bucket,
// with its pointer and writer leases in KV buckets. Its methods are safe
// for concurrent use.
type Store struct {
	cfg      Config
	log      *slog.Logger
	obs      jetstream.ObjectStore
	meta     jetstream.KeyValue // pointers
	leases   jetstream.KeyValue // writer leases, bucket TTL
	leaseTTL time.Duration      // the lease bucket's TTL
	model    string             // escaped model: names its objects and keys

	writes *prometheus.CounterVec
	// forgedPointers counts pointers ignored for their code (Config.Auth).
	forgedPointers prometheus.Counter
	lastBytes      prometheus.Gauge
	lastDuration   prometheus.Gauge
	lastSeq        prometheus.Gauge
	lastSuccess    prometheus.Gauge
	restores       *prometheus.CounterVec
	leaseHeld      prometheus.Gauge
}

// Open creates or opens the snapshot buckets of cfg (whoever comes first
// creates them; a lease bucket created with another TTL keeps it, and is
// logged).
func Open(ctx context.Context, js jetstream.JetStream, cfg Config, log *slog.Logger) (*Store, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Store{cfg: cfg, log: log.With("bucket", cfg.Bucket, "model", cfg.Model), model: natstransport.EscapeToken(cfg.Model)}
	s.obs, err = ensure(ctx,
		func() (jetstream.ObjectStore, error) { return js.ObjectStore(ctx, cfg.Bucket) },
		func() (jetstream.ObjectStore, error) {
			return js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: cfg.Bucket,
				Description: "kvindex index snapshots", Storage: jetstream.FileStorage, Replicas: cfg.Replicas})
		})
	if err != nil {
		return nil, fmt.Errorf("snapstore: object store %s: %w", cfg.Bucket, err)
	}
	s.meta, err = ensureKV(ctx, js, jetstream.KeyValueConfig{Bucket: cfg.Bucket + metaSuffix,
		Description: "kvindex snapshot pointers", History: 1, Storage: jetstream.FileStorage, Replicas: cfg.Replicas})
	if err != nil {
		return nil, err
	}
	s.leases, err = ensureKV(ctx, js, jetstream.KeyValueConfig{Bucket: cfg.Bucket + leaseSuffix,
		Description: "kvindex snapshot writer leases", History: 1, TTL: cfg.LeaseTTL,
		Storage: jetstream.FileStorage, Replicas: cfg.Replicas})
	if err != nil {
		return nil, err
	}
	st, err := s.leases.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("snapstore: lease bucket: %w", err)
	}
	s.leaseTTL = st.TTL()
	if s.leaseTTL != cfg.LeaseTTL {
		s.log.Warn("snapstore: the lease bucket exists with another TTL; using it", "ttl", s.leaseTTL.String(), "configured", cfg.LeaseTTL.String())
	}
	if s.leaseTTL < minLeaseTTL {
		return nil, fmt.Errorf("snapstore: lease bucket %s has TTL %v: at least %v needed", cfg.Bucket+leaseSuffix, s.leaseTTL, minLeaseTTL)
	}
	s.initMetrics()
	return s, nil
}

// ensure opens a bucket, creating it when missing; another process
// creating it at the same moment is fine.
func ensure[T any](ctx context.Context, open, create func() (T, error)) (T, error) {
	b, err := open()
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return b, err
	}
	b, err = create()
	if errors.Is(err, jetstream.ErrBucketExists) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return open()
	}
	return b, err
}

func ensureKV(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := ensure(ctx,
		func() (jetstream.KeyValue, error) { return js.KeyValue(ctx, cfg.Bucket) },
		func() (jetstream.KeyValue, error) { return js.CreateKeyValue(ctx, cfg) })
	if err != nil {
		return nil, fmt.Errorf("snapstore: KV bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

func (s *Store) initMetrics() {
	s.writes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvindex_snapshot_writes_total",
		Help: "Snapshots written to the NATS object store, by result (ok, error, superseded: a newer one was already there).",
	}, []string{"result"})
	s.lastBytes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvindex_snapshot_bytes", Help: "Size of the last snapshot written to the NATS object store.",
	})
	s.lastDuration = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvindex_snapshot_duration_seconds",
		Help: "How long the last snapshot written to the NATS object store took, upload and pointer update included.",
	})
	s.lastSeq = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvindex_snapshot_stream_seq", Help: "Stream sequence of the last snapshot written to the NATS object store.",
	})
	s.lastSuccess = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvindex_snapshot_last_success_timestamp_seconds",
		Help: "When the last snapshot was written to the NATS object store (Unix time); 0 before the first.",
	})
	s.restores = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvindex_snapshot_restores_total",
		Help: "Snapshots read from the NATS object store, by result (latest, fallback: an older one because the newer were unusable, none).",
	}, []string{"result"})
	s.forgedPointers = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvindex_snapshot_pointers_refused_total",
		Help: "Reads of the snapshot pointer that found it not signed with kvindex's key (--nats-auth-key) and ignored it.",
	})
	s.leaseHeld = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvindex_snapshot_lease_held", Help: "1 while this process holds the snapshot writer lease.",
	})
	for _, r := range []string{"ok", "error", "superseded"} {
		s.writes.WithLabelValues(r)
	}
	for _, r := range []string{"latest", "fallback", "none"} {
		s.restores.WithLabelValues(r)
	}
}

// Collectors are the store's kvindex_snapshot_* metrics.
func (s *Store) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.writes, s.lastBytes, s.lastDuration, s.lastSeq, s.lastSuccess, s.restores, s.forgedPointers, s.leaseHeld}
}

// LeaseTTL is the lease bucket's TTL: how long a lease outlives its
// holder's last renewal.
func (s *Store) LeaseTTL() time.Duration { return s.leaseTTL }

// pointerKey is the model's pointer in the meta bucket.
func (s *Store) pointerKey() string { return s.model + ".latest" }

// objectName names a snapshot object so that names sort as the
// snapshots' age: model, stream sequence, creation time.
func (s *Store) objectName(seq uint64, created time.Time) string {
	return fmt.Sprintf("%s.%020d.%019d", s.model, seq, created.UnixNano())
}

// newer reports whether a snapshot of stream at seq replaces the pointer
// p. A snapshot of another stream does: the stream was replaced, and the
// old one's sequences mean nothing to the new one.
func newer(stream string, seq uint64, p *Info) bool {
	return p == nil || stream != p.Stream || seq > p.StreamSeq
}

// pointer reads the model's pointer; nil without one.
func (s *Store) pointer(ctx context.Context) (*Info, uint64, error) {
	e, err := s.meta.Get(ctx, s.pointerKey())
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("snapstore: reading the pointer: %w", err)
	}
	var p signedPointer
	if err := json.Unmarshal(e.Value(), &p); err != nil || p.Object == "" {
		// A pointer that does not parse is replaced by the next snapshot;
		// readers fall back to the listed objects.
		s.log.Warn("snapstore: the pointer does not parse; ignoring it", "key", s.pointerKey(), "err", err)
		return nil, e.Revision(), nil
	}
	if s.cfg.Auth != nil {
		want, err := hex.DecodeString(p.MAC)
		if err != nil || !hmac.Equal(s.pointerMAC(p.Info), want) {
			// A forged pointer would otherwise hold the real snapshots
			// off (each superseded by its sequence) for good: it is
			// treated as none, so readers fall back to the listed (and
			// each verified) objects and the next snapshot replaces it.
			s.forgedPointers.Inc()
			s.log.Warn("snapstore: the pointer is not signed with kvindex's key; ignoring it (the next snapshot replaces it)",
				"key", s.pointerKey(), "object", p.Object, "stream_seq", p.StreamSeq)
			return nil, e.Revision(), nil
		}
	}
	return &p.Info, e.Revision(), nil
}

// signedPointer is the pointer's value: the snapshot's Info and, with
// Config.Auth, its code (pointerMAC).
type signedPointer struct {
	Info
	MAC string `json:"mac,omitempty"`
}

// pointerMAC is the code of a pointer naming info, bound to the
// pointer's key, so that a pointer cannot be copied to another model.
func (s *Store) pointerMAC(info Info) []byte {
	b, _ := json.Marshal(info) // an Info always marshals
	h := s.cfg.Auth.NewHash(pointerDomain)
	h.Write([]byte(s.pointerKey()))
	h.Write([]byte{0})
	h.Write(b)
	return h.Sum(nil)
}

// Put stores a state file of h and the index snapshot that snapshot
// streams (e.g. indexer.Index.Snapshot), moves the model's pointer to it,
// and prunes the model's snapshots beyond Keep. The file is streamed to
// the object store as it is encoded, never held whole in memory. If the
// pointer already names a snapshot of h.Stream at h.StreamSeq or later,
// nothing is kept and the error is ErrSuperseded.
func (s *Store) Put(ctx context.Context, h *statefile.Header, snapshot func(io.Writer) error) (Info, error) {
	start := time.Now()
	info, err := s.put(ctx, h, snapshot)
	switch {
	case errors.Is(err, ErrSuperseded):
		s.writes.WithLabelValues("superseded").Inc()
		s.log.Info("snapstore: snapshot not kept: a newer one exists", "stream", h.Stream, "stream_seq", h.StreamSeq, "err", err)
		return info, err
	case err != nil:
		s.writes.WithLabelValues("error").Inc()
		s.log.Warn("snapstore: snapshot failed; the previous one stays", "err", err)
		return info, err
	}
	took := time.Since(start)
	s.writes.WithLabelValues("ok").Inc()
	s.lastBytes.Set(float64(info.Size))
	s.lastDuration.Set(took.Seconds())
	s.lastSeq.Set(float64(info.StreamSeq))
	s.lastSuccess.Set(float64(time.Now().UnixNano()) / 1e9)
	s.log.Debug("snapstore: snapshot written", "object", info.Object, "stream", info.Stream, "stream_seq", info.StreamSeq,
		"bytes", info.Size, "took", took.Round(time.Millisecond).String())
	if err := s.prune(ctx, info.Object); err != nil {
		s.log.Warn("snapstore: pruning older snapshots failed; the next snapshot retries", "err", err)
	}
	return info, nil
}

func (s *Store) put(ctx context.Context, h *statefile.Header, snapshot func(io.Writer) error) (Info, error) {
	if h == nil {
		return Info{}, errors.New("snapstore: no header")
	}
	// Checked first so an upload nobody would read is not made; checked
	// again (revision-checked) when the pointer moves.
	if p, _, err := s.pointer(ctx); err != nil {
		return Info{}, err
	} else if !newer(h.Stream, h.StreamSeq, p) {
		return Info{}, fmt.Errorf("%w: %s at %d (have %d)", ErrSuperseded, p.Object, p.StreamSeq, h.StreamSeq)
	}
	created := time.Now().UTC()
	name := s.objectName(h.StreamSeq, created)
	oi, err := s.upload(ctx, name, h, snapshot)
	if err != nil {
		return Info{}, err
	}
	info := Info{Object: name, Stream: h.Stream, StreamSeq: h.StreamSeq, Created: created, Size: oi.Size, Digest: oi.Digest}
	if err := s.movePointer(ctx, info); err != nil {
		// The object nobody points to goes; a failed delete is pruned later.
		if derr := s.obs.Delete(context.WithoutCancel(ctx), name); derr != nil {
			s.log.Warn("snapstore: removing an unused snapshot failed", "object", name, "err", derr)
		}
		return Info{}, err
	}
	return info, nil
}

// upload streams the state file into the object store through a pipe:
// the encoder writes chunk-sized pieces as the object store reads them.
func (s *Store) upload(ctx context.Context, name string, h *statefile.Header, snapshot func(io.Writer) error) (*jetstream.ObjectInfo, error) {
	pr, pw := io.Pipe()
	encErr := make(chan error, 1)
	var out io.Writer = pw
	var mac hash.Hash
	if s.cfg.Auth != nil {
		mac = s.cfg.Auth.NewHash(macDomain)
		out = io.MultiWriter(pw, mac)
	}
	go func() {
		bw := bufio.NewWriterSize(out, chunkSize)
		err := statefile.Encode(bw, h, snapshot)
		if err == nil {
			err = bw.Flush()
		}
		// A failed encoding reaches the object store as a read error,
		// which abandons the upload and purges its chunks.
		pw.CloseWithError(cmp.Or(err, io.EOF))
		encErr <- err
	}()
	oi, err := s.obs.Put(ctx, jetstream.ObjectMeta{
		Name:     name,
		Metadata: map[string]string{"stream": h.Stream, "stream_seq": strconv.FormatUint(h.StreamSeq, 10)},
		Opts:     &jetstream.ObjectMetaOptions{ChunkSize: chunkSize},
	}, pr)
	// Unblocks the encoder if the object store stopped reading early.
	pr.CloseWithError(cmp.Or(err, errors.New("snapstore: upload finished")))
	if eerr := <-encErr; eerr != nil {
		return nil, fmt.Errorf("snapstore: encoding the snapshot: %w", eerr)
	}
	if err != nil {
		return nil, fmt.Errorf("snapstore: uploading %s: %w", name, err)
	}
	if mac != nil {
		meta := oi.ObjectMeta
		meta.Metadata = maps.Clone(meta.Metadata)
		meta.Metadata[metaMAC] = hex.EncodeToString(mac.Sum(nil))
		if err := s.obs.UpdateMeta(ctx, name, meta); err != nil {
			return nil, fmt.Errorf("snapstore: signing %s: %w", name, err)
		}
	}
	return oi, nil
}

// The snapshot's code in its object's metadata (Config.Auth), and the
// domain of the key it is made with.
const (
	metaMAC   = "kvindex-mac"
	macDomain = "snapshot"
	// pointerDomain: the domain of the pointer's code (signedPointer).
	pointerDomain = "snapshot-pointer"
)

// ErrUnsigned: with Config.Auth, a snapshot without a code, or whose
// bytes do not match it.
var ErrUnsigned = errors.New("snapstore: snapshot not signed with kvindex's key")

// Verifier returns the check a restore must pass once it has read a body
// Load handed it, before it uses what it read (indexer.Index.RestoreChecked):
// it reads the rest of the object and compares the code of all of it with
// the object's. Without Config.Auth it returns nil.
func Verifier(body io.Reader) func() error {
	if b, ok := body.(*objectBody); ok {
		return b.verify
	}
	return nil
}

// movePointer points the model's pointer at info, unless it already
// names a snapshot at least as new: a revision-checked create or update,
// retried when another writer moved it in between.
func (s *Store) movePointer(ctx context.Context, info Info) error {
	sp := signedPointer{Info: info}
	if s.cfg.Auth != nil {
		sp.MAC = hex.EncodeToString(s.pointerMAC(info))
	}
	val, err := json.Marshal(sp)
	if err != nil {
		return err
	}
	for range pointerRetries {
		p, rev, err := s.pointer(ctx)
		if err != nil {
			return err
		}
		if !newer(info.Stream, info.StreamSeq, p) {
			return fmt.Errorf("%w: %s at %d (have %d)", ErrSuperseded, p.Object, p.StreamSeq, info.StreamSeq)
		}
		if rev == 0 {
			_, err = s.meta.Create(ctx, s.pointerKey(), val)
		} else {
			_, err = s.meta.Update(ctx, s.pointerKey(), val, rev)
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return fmt.Errorf("snapstore: moving the pointer: %w", err)
		}
	}
	return fmt.Errorf("snapstore: moving the pointer: it kept changing (%d tries)", pointerRetries)
}

// stored is one of the model's snapshot objects, from the bucket's list.
type stored struct {
	name    string
	seq     uint64
	created int64
}

// list returns the model's snapshot objects, newest first.
func (s *Store) list(ctx context.Context) ([]stored, error) {
	infos, err := s.obs.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("snapstore: listing snapshots: %w", err)
	}
	var out []stored
	for _, oi := range infos {
		rest, ok := strings.CutPrefix(oi.Name, s.model+".")
		if !ok || oi.Deleted {
			continue
		}
		seqS, createdS, ok := strings.Cut(rest, ".")
		seq, err1 := strconv.ParseUint(seqS, 10, 64)
		created, err2 := strconv.ParseInt(createdS, 10, 64)
		if !ok || err1 != nil || err2 != nil {
			continue // not one of ours
		}
		out = append(out, stored{name: oi.Name, seq: seq, created: created})
	}
	slices.SortFunc(out, func(a, b stored) int {
		return cmp.Or(cmp.Compare(b.seq, a.seq), cmp.Compare(b.created, a.created))
	})
	return out, nil
}

// prune deletes the model's snapshots beyond the newest Keep, never the
// one the pointer names (current).
func (s *Store) prune(ctx context.Context, current string) error {
	objs, err := s.list(ctx)
	if err != nil {
		return err
	}
	kept := 1 // current
	var errs []error
	for _, o := range objs {
		if o.name == current {
			continue
		}
		if kept < s.cfg.Keep {
			kept++
			continue
		}
		if err := s.obs.Delete(ctx, o.name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			errs = append(errs, fmt.Errorf("%s: %w", o.name, err))
		}
	}
	return errors.Join(errs...)
}

// candidates are the snapshots to try, newest first: the pointer's, then
// the others kept. The pointer is nil when there is none.
func (s *Store) candidates(ctx context.Context) (*Info, []string, error) {
	p, _, err := s.pointer(ctx)
	if err != nil {
		return nil, nil, err
	}
	objs, err := s.list(ctx)
	if err != nil {
		return nil, nil, err
	}
	var names []string
	if p != nil {
		names = append(names, p.Object)
	}
	for _, o := range objs {
		if p == nil || o.name != p.Object {
			names = append(names, o.name)
		}
	}
	return p, names, nil
}

// objectBody is a snapshot's index snapshot, after its header.
type objectBody struct {
	*bufio.Reader
	obj    jetstream.ObjectResult
	verify func() error // nil without Config.Auth
}

func (b *objectBody) Close() error { return b.obj.Close() }

// open opens one snapshot object and reads and checks its header.
func (s *Store) open(ctx context.Context, name string, p *Info) (*statefile.Header, io.ReadCloser, error) {
	obj, err := s.obs.Get(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	var in io.Reader = obj
	var verify func() error
	if s.cfg.Auth != nil {
		info, err := obj.Info()
		var want []byte
		if err == nil {
			want, err = hex.DecodeString(info.Metadata[metaMAC])
		}
		if err != nil || len(want) == 0 {
			obj.Close()
			return nil, nil, fmt.Errorf("%w: no code in its metadata", ErrUnsigned)
		}
		mac := s.cfg.Auth.NewHash(macDomain)
		in = io.TeeReader(obj, mac)
		verify = func() error {
			if _, err := io.Copy(io.Discard, in); err != nil {
				return fmt.Errorf("snapstore: reading %s to its end: %w", name, err)
			}
			if !hmac.Equal(mac.Sum(nil), want) {
				return fmt.Errorf("%w: its bytes do not match its code", ErrUnsigned)
			}
			return nil
		}
	}
	br := bufio.NewReaderSize(in, 1<<20)
	h, err := statefile.ReadHeader(br)
	if err == nil && p != nil && name == p.Object && (h.StreamSeq != p.StreamSeq || h.Stream != p.Stream) {
		err = fmt.Errorf("%w: header says %s at %d, the pointer %s at %d", statefile.ErrBadState, h.Stream, h.StreamSeq, p.Stream, p.StreamSeq)
	}
	if err != nil {
		obj.Close()
		return nil, nil, err
	}
	if verify != nil {
		// The header's bytes are read through br: the rest of the
		// object too.
		tail := verify
		verify = func() error {
			if _, err := io.Copy(io.Discard, br); err != nil {
				return err
			}
			return tail()
		}
	}
	return h, &objectBody{Reader: br, obj: obj, verify: verify}, nil
}

// Latest opens the model's newest usable snapshot: its checked header,
// and its index snapshot to pass to indexer.Index.Restore (which checks
// the snapshot's own checksums); the caller closes it. When the newest is
// missing or its header is refused, it falls back to the one before, and
// logs why. Without any usable snapshot the error wraps ErrNoSnapshot.
func (s *Store) Latest(ctx context.Context) (*statefile.Header, io.ReadCloser, error) {
	var h *statefile.Header
	var rc io.ReadCloser
	_, err := s.Load(ctx, func(hh *statefile.Header, r io.Reader) error {
		h, rc = hh, r.(io.ReadCloser)
		return errKeepOpen
	})
	if err != nil {
		return nil, nil, err
	}
	return h, rc, nil
}

// errKeepOpen tells load to hand the open body over instead of closing it.
var errKeepOpen = errors.New("keep open")

// Load restores the model's newest usable snapshot with restore, which
// gets its checked header and index snapshot (e.g. to check the hashing
// and call indexer.Index.Restore, which leaves the index as it was when
// the snapshot is refused). When the newest snapshot is missing, its
// header is refused or restore fails, Load tries the one before, and logs
// why. It returns the header restored; without any usable snapshot, an
// error wrapping ErrNoSnapshot (and the last failure).
func (s *Store) Load(ctx context.Context, restore func(h *statefile.Header, body io.Reader) error) (*statefile.Header, error) {
	p, names, err := s.candidates(ctx)
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		s.restores.WithLabelValues("none").Inc()
		return nil, ErrNoSnapshot
	}
	if p == nil {
		s.log.Warn("snapstore: no pointer; trying the snapshots listed", "snapshots", len(names))
	}
	var errs []error
	for i, name := range names {
		h, rc, err := s.open(ctx, name, p)
		if err == nil {
			err = restore(h, rc)
			if err == errKeepOpen {
				err = nil
			} else {
				rc.Close()
			}
		}
		if err != nil {
			s.log.Warn("snapstore: snapshot unusable; trying an older one", "object", name, "err", err, "left", len(names)-i-1)
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
		result := "latest"
		if i > 0 || p == nil {
			result = "fallback"
		}
		s.restores.WithLabelValues(result).Inc()
		s.log.Info("snapstore: snapshot opened", "object", name, "stream", h.Stream, "stream_seq", h.StreamSeq,
			"written", h.Written.Format(time.RFC3339), "fallback", result == "fallback")
		return h, nil
	}
	s.restores.WithLabelValues("none").Inc()
	return nil, fmt.Errorf("%w: none of %d usable: %w", ErrNoSnapshot, len(names), errors.Join(errs...))
}
