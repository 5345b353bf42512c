package snapstore

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/statefile"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/natstransport"
)

// startServer runs an embedded NATS server with JetStream for the test
// and returns its client URL.
func startServer(t testing.TB) string {
	t.Helper()
	s, err := server.NewServer(&server.Options{JetStream: true, StoreDir: t.TempDir(), Port: -1, Host: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	return s.ClientURL()
}

// connect opens a connection of its own (as another process would) and
// its JetStream context.
func connect(t testing.TB, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// openStore opens a store on its own connection; its log is returned.
func openStore(t testing.TB, url string, cfg Config) (*Store, *testutil.SyncBuffer) {
	t.Helper()
	var logs testutil.SyncBuffer
	s, err := Open(t.Context(), connect(t, url), cfg, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	return s, &logs
}

var hasher = blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 4})

// filledIndex is an index holding prompts of two engines; different
// first values give different contents.
func filledIndex(t testing.TB, first, prompts int) *indexer.Index {
	t.Helper()
	ix, err := indexer.New(indexer.Options{Hasher: hasher})
	if err != nil {
		t.Fatal(err)
	}
	for p := range prompts {
		toks := make([]uint64, 16)
		for i := range toks {
			toks[i] = uint64((first+p)*1000 + i)
		}
		hs, _ := hasher.Chain(nil, nil, 0, toks, nil)
		keys := make([]uint64, len(hs))
		for i, h := range hs {
			keys[i] = h.Key
		}
		id := kvevents.EngineID{Model: "m", Pod: []string{"pod-a", "pod-b"}[p%2]}
		ix.Apply(id, uint64(p), []kvevents.Event{{Kind: kvevents.BlockStored, Hashes: keys, TokenIDs: toks, BlockSize: 4}})
	}
	return ix
}

func header(stream string, seq uint64) *statefile.Header {
	return &statefile.Header{Written: time.Unix(1700000000, 0).UTC(), Version: "test",
		Hashing:   statefile.Hashing{Algo: "sha256_cbor", Seed: "0", BlockSize: 4},
		Positions: []statefile.Position{{Model: "m", Pod: "pod-a", Seq: seq, Health: "ok"}},
		Stream:    stream, StreamSeq: seq}
}

// restoreLatest restores the store's latest snapshot into a fresh index.
func restoreLatest(t testing.TB, s *Store) (*statefile.Header, *indexer.Index) {
	t.Helper()
	h, body, err := s.Latest(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer body.Close()
	ix, _ := indexer.New(indexer.Options{Hasher: hasher})
	if err := ix.Restore(body); err != nil {
		t.Fatal(err)
	}
	return h, ix
}

// objects lists the store's objects of its model, newest first.
func objects(t testing.TB, s *Store) []stored {
	t.Helper()
	objs, err := s.list(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func TestConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   Config
		want Config // zero: an error is wanted
	}{
		{"defaults", Config{Model: "m"}, Config{Bucket: DefaultBucket, Model: "m", Keep: DefaultKeep, LeaseTTL: DefaultLeaseTTL, Replicas: DefaultReplicas}},
		{"given", Config{Bucket: "b_1-x", Model: "m", Keep: 5, LeaseTTL: time.Minute, Replicas: 3}, Config{Bucket: "b_1-x", Model: "m", Keep: 5, LeaseTTL: time.Minute, Replicas: 3}},
		{"no model", Config{}, Config{}},
		{"bucket with a dot", Config{Model: "m", Bucket: "a.b"}, Config{}},
		{"negative keep", Config{Model: "m", Keep: -1}, Config{}},
		{"lease TTL too short", Config{Model: "m", LeaseTTL: time.Millisecond}, Config{}},
		{"too many replicas", Config{Model: "m", Replicas: 6}, Config{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.in.withDefaults()
			if tc.want == (Config{}) {
				if err == nil {
					t.Errorf("accepted: %+v", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestPutLatestRoundTrip(t *testing.T) {
	url := startServer(t)
	s, _ := openStore(t, url, Config{Model: "meta-llama/Llama-3.1-8B"})
	ix := filledIndex(t, 0, 20)
	h := header("KVEVENTS", 42)
	info, err := s.Put(t.Context(), h, ix.Snapshot)
	if err != nil {
		t.Fatal(err)
	}
	if info.StreamSeq != 42 || info.Stream != "KVEVENTS" || info.Size == 0 || info.Digest == "" ||
		!strings.HasPrefix(info.Object, "meta-llama_2FLlama-3_2E1-8B.") {
		t.Errorf("info %+v", info)
	}
	// Another process reads it.
	r, _ := openStore(t, url, Config{Model: "meta-llama/Llama-3.1-8B"})
	got, ix2 := restoreLatest(t, r)
	if got.Stream != "KVEVENTS" || got.StreamSeq != 42 || !slices.Equal(got.Positions, h.Positions) || got.Hashing != h.Hashing {
		t.Errorf("header %+v, want %+v", got, h)
	}
	if ix2.Digest() != ix.Digest() {
		t.Error("restored index differs from the one stored")
	}
	for _, m := range []struct {
		name string
		got  float64
		want float64
	}{
		{"writes ok", value(t, s.writes.WithLabelValues("ok")), 1},
		{"bytes", value(t, s.lastBytes), float64(info.Size)},
		{"stream seq", value(t, s.lastSeq), 42},
		{"restores latest", value(t, r.restores.WithLabelValues("latest")), 1},
	} {
		if m.got != m.want {
			t.Errorf("%s: %v, want %v", m.name, m.got, m.want)
		}
	}
}

func TestPruneKeepsKeep(t *testing.T) {
	for _, keep := range []int{1, 2, 3} {
		t.Run(fmt.Sprint(keep), func(t *testing.T) {
			url := startServer(t)
			s, _ := openStore(t, url, Config{Model: "m", Keep: keep})
			other, _ := openStore(t, url, Config{Model: "other", Keep: keep})
			if _, err := other.Put(t.Context(), header("KVEVENTS", 1), filledIndex(t, 0, 1).Snapshot); err != nil {
				t.Fatal(err)
			}
			for seq := uint64(1); seq <= 5; seq++ {
				if _, err := s.Put(t.Context(), header("KVEVENTS", seq), filledIndex(t, int(seq), 3).Snapshot); err != nil {
					t.Fatal(err)
				}
			}
			var seqs []uint64
			for _, o := range objects(t, s) {
				seqs = append(seqs, o.seq)
			}
			want := []uint64{5, 4, 3}[:keep]
			if !slices.Equal(seqs, want) {
				t.Errorf("kept sequences %v, want %v", seqs, want)
			}
			if n := len(objects(t, other)); n != 1 {
				t.Errorf("another model's snapshots: %d, want 1 (not pruned)", n)
			}
		})
	}
}

// TestPointerNeverMovesBack: a snapshot at an older or the same stream
// sequence never replaces the pointer, whether it is refused before its
// upload or (a slow writer) when it tries to move the pointer; one of
// another stream does.
func TestPointerNeverMovesBack(t *testing.T) {
	url := startServer(t)
	s, _ := openStore(t, url, Config{Model: "m", Keep: 3})
	newest := filledIndex(t, 0, 4)
	if _, err := s.Put(t.Context(), header("KVEVENTS", 10), newest.Snapshot); err != nil {
		t.Fatal(err)
	}
	for _, seq := range []uint64{5, 10} {
		if _, err := s.Put(t.Context(), header("KVEVENTS", seq), filledIndex(t, 7, 1).Snapshot); !errors.Is(err, ErrSuperseded) {
			t.Errorf("Put at %d after 10: %v, want ErrSuperseded", seq, err)
		}
		// A writer that passed the first check before the pointer moved.
		if err := s.movePointer(t.Context(), Info{Object: "m.slow", Stream: "KVEVENTS", StreamSeq: seq}); !errors.Is(err, ErrSuperseded) {
			t.Errorf("moving the pointer to %d after 10: %v, want ErrSuperseded", seq, err)
		}
	}
	if got := value(t, s.writes.WithLabelValues("superseded")); got != 2 {
		t.Errorf("superseded writes %v, want 2", got)
	}
	if n := len(objects(t, s)); n != 1 {
		t.Errorf("%d objects, want 1 (superseded ones not kept)", n)
	}
	h, ix := restoreLatest(t, s)
	if h.StreamSeq != 10 || ix.Digest() != newest.Digest() {
		t.Errorf("latest is at %d (or another index), want the one at 10", h.StreamSeq)
	}
	// A replaced stream starts its sequences again.
	if _, err := s.Put(t.Context(), header("KVEVENTS2", 3), filledIndex(t, 9, 1).Snapshot); err != nil {
		t.Errorf("Put of another stream: %v", err)
	}
	if h, _ := restoreLatest(t, s); h.Stream != "KVEVENTS2" || h.StreamSeq != 3 {
		t.Errorf("latest %s at %d, want KVEVENTS2 at 3", h.Stream, h.StreamSeq)
	}
}

// TestFallback: when the newest snapshot is missing or its header is
// refused, Latest opens the one before it, and logs so.
func TestFallback(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spoil func(t *testing.T, s *Store, name string)
	}{
		{"missing", func(t *testing.T, s *Store, name string) {
			if err := s.obs.Delete(t.Context(), name); err != nil {
				t.Fatal(err)
			}
		}},
		{"header flipped", func(t *testing.T, s *Store, name string) {
			b, err := s.obs.GetBytes(t.Context(), name)
			if err != nil {
				t.Fatal(err)
			}
			b[20] ^= 0x20
			if _, err := s.obs.PutBytes(t.Context(), name, b); err != nil {
				t.Fatal(err)
			}
		}},
		{"truncated", func(t *testing.T, s *Store, name string) {
			if _, err := s.obs.PutBytes(t.Context(), name, []byte("KVIXSTAT")); err != nil {
				t.Fatal(err)
			}
		}},
		{"another snapshot's header", func(t *testing.T, s *Store, name string) {
			var b bytes.Buffer
			if err := statefile.Encode(&b, header("KVEVENTS", 99), filledIndex(t, 0, 1).Snapshot); err != nil {
				t.Fatal(err)
			}
			if _, err := s.obs.PutBytes(t.Context(), name, b.Bytes()); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := startServer(t)
			s, logs := openStore(t, url, Config{Model: "m"})
			older := filledIndex(t, 0, 3)
			if _, err := s.Put(t.Context(), header("KVEVENTS", 1), older.Snapshot); err != nil {
				t.Fatal(err)
			}
			info, err := s.Put(t.Context(), header("KVEVENTS", 2), filledIndex(t, 5, 3).Snapshot)
			if err != nil {
				t.Fatal(err)
			}
			tc.spoil(t, s, info.Object)
			h, ix := restoreLatest(t, s)
			if h.StreamSeq != 1 || ix.Digest() != older.Digest() {
				t.Errorf("opened the snapshot at %d, want the older one at 1", h.StreamSeq)
			}
			if !strings.Contains(logs.String(), "trying an older one") {
				t.Errorf("the fallback is not logged:\n%s", logs)
			}
			if got := value(t, s.restores.WithLabelValues("fallback")); got != 1 {
				t.Errorf("fallback restores %v, want 1", got)
			}
		})
	}
}

// TestCorruptBody: a snapshot whose header is intact but whose index
// snapshot is not opens, and indexer Restore refuses it, leaving the
// index empty; Load then falls back to the snapshot before it.
func TestCorruptBody(t *testing.T) {
	url := startServer(t)
	s, _ := openStore(t, url, Config{Model: "m"})
	older := filledIndex(t, 0, 3)
	if _, err := s.Put(t.Context(), header("KVEVENTS", 1), older.Snapshot); err != nil {
		t.Fatal(err)
	}
	info, err := s.Put(t.Context(), header("KVEVENTS", 2), filledIndex(t, 5, 3).Snapshot)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.obs.GetBytes(t.Context(), info.Object)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-20] ^= 0x01
	if _, err := s.obs.PutBytes(t.Context(), info.Object, b); err != nil {
		t.Fatal(err)
	}

	h, body, err := s.Latest(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ix, _ := indexer.New(indexer.Options{Hasher: hasher})
	empty := ix.Digest()
	if err := ix.Restore(body); err == nil {
		t.Fatal("a corrupt snapshot body restored")
	}
	body.Close()
	if h.StreamSeq != 2 || ix.Digest() != empty {
		t.Errorf("header at %d, index changed by the refused restore: %v", h.StreamSeq, ix.Digest() != empty)
	}

	got, err := s.Load(t.Context(), func(_ *statefile.Header, r io.Reader) error { return ix.Restore(r) })
	if err != nil {
		t.Fatal(err)
	}
	if got.StreamSeq != 1 || ix.Digest() != older.Digest() {
		t.Errorf("Load restored the snapshot at %d, want the older one at 1", got.StreamSeq)
	}
}

func TestNoSnapshot(t *testing.T) {
	url := startServer(t)
	s, _ := openStore(t, url, Config{Model: "m"})
	other, _ := openStore(t, url, Config{Model: "other"})
	if _, err := other.Put(t.Context(), header("KVEVENTS", 1), filledIndex(t, 0, 1).Snapshot); err != nil {
		t.Fatal(err)
	}
	_, _, err := s.Latest(t.Context())
	if !errors.Is(err, ErrNoSnapshot) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Latest without a snapshot: %v, want ErrNoSnapshot", err)
	}
	// Every snapshot unusable is the same for a reader as none.
	info, err := s.Put(t.Context(), header("KVEVENTS", 1), filledIndex(t, 0, 1).Snapshot)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.obs.PutBytes(t.Context(), info.Object, []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Latest(t.Context()); !errors.Is(err, ErrNoSnapshot) || !errors.Is(err, statefile.ErrBadState) {
		t.Errorf("Latest with only a corrupt snapshot: %v, want ErrNoSnapshot and the reason", err)
	}
	if got := value(t, s.restores.WithLabelValues("none")); got != 2 {
		t.Errorf("restores none %v, want 2", got)
	}
}

// TestPutSnapshotError: a failing snapshot stores nothing and leaves the
// pointer where it was.
func TestPutSnapshotError(t *testing.T) {
	url := startServer(t)
	s, _ := openStore(t, url, Config{Model: "m"})
	ix := filledIndex(t, 0, 2)
	if _, err := s.Put(t.Context(), header("KVEVENTS", 1), ix.Snapshot); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("disk on fire")
	_, err := s.Put(t.Context(), header("KVEVENTS", 2), func(w io.Writer) error {
		if _, err := w.Write(make([]byte, 3*chunkSize)); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Errorf("Put: %v, want %v", err, boom)
	}
	if n := len(objects(t, s)); n != 1 {
		t.Errorf("%d objects, want 1", n)
	}
	if h, got := restoreLatest(t, s); h.StreamSeq != 1 || got.Digest() != ix.Digest() {
		t.Errorf("latest at %d, want the one at 1", h.StreamSeq)
	}
	if got := value(t, s.writes.WithLabelValues("error")); got != 1 {
		t.Errorf("failed writes %v, want 1", got)
	}
}

// value reads a counter's or gauge's value.
func value(t testing.TB, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

// awaitBound bounds every wait for a condition.
const awaitBound = 30 * time.Second

// TestOpenKeepsBuckets: a second Open uses the buckets the first created,
// and a lease bucket of another TTL keeps its TTL, which the Store then
// uses (and logs).
func TestOpenKeepsBuckets(t *testing.T) {
	url := startServer(t)
	first, _ := openStore(t, url, Config{Model: "m", LeaseTTL: 3 * time.Second})
	if _, err := first.Put(t.Context(), header("KVEVENTS", 1), filledIndex(t, 0, 1).Snapshot); err != nil {
		t.Fatal(err)
	}
	second, logs := openStore(t, url, Config{Model: "m", LeaseTTL: 5 * time.Second})
	if second.LeaseTTL() != 3*time.Second {
		t.Errorf("lease TTL %v, want the bucket's 3s", second.LeaseTTL())
	}
	if !strings.Contains(logs.String(), "another TTL") {
		t.Errorf("the TTL difference is not logged:\n%s", logs)
	}
	if h, _ := restoreLatest(t, second); h.StreamSeq != 1 {
		t.Errorf("latest at %d, want 1", h.StreamSeq)
	}
}

// TestBadPointer: a pointer that does not parse is logged and ignored by
// readers (they use the snapshots listed) and replaced by the next Put.
func TestBadPointer(t *testing.T) {
	url := startServer(t)
	s, logs := openStore(t, url, Config{Model: "m"})
	ix := filledIndex(t, 0, 2)
	if _, err := s.Put(t.Context(), header("KVEVENTS", 4), ix.Snapshot); err != nil {
		t.Fatal(err)
	}
	if _, err := s.meta.PutString(t.Context(), s.pointerKey(), "{not json"); err != nil {
		t.Fatal(err)
	}
	if h, got := restoreLatest(t, s); h.StreamSeq != 4 || got.Digest() != ix.Digest() {
		t.Errorf("latest at %d, want the listed one at 4", h.StreamSeq)
	}
	if !strings.Contains(logs.String(), "does not parse") {
		t.Errorf("the bad pointer is not logged:\n%s", logs)
	}
	if _, err := s.Put(t.Context(), header("KVEVENTS", 5), ix.Snapshot); err != nil {
		t.Fatal(err)
	}
	if p, _, err := s.pointer(t.Context()); err != nil || p == nil || p.StreamSeq != 5 {
		t.Errorf("pointer after Put: %+v, %v; want one at 5", p, err)
	}
}

// With a key, a replica restores only snapshots written with it: one
// written without the key (a forged snapshot and pointer, from anyone who
// may write to the buckets), and a signed one whose bytes were changed
// while its content still checks out, are both refused before the index
// is touched, and Load falls back to the signed one.
func TestSignedSnapshots(t *testing.T) {
	url := startServer(t)
	auth, err := natstransport.NewAuth([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	signed, _ := openStore(t, url, Config{Model: "m", Keep: 3, Auth: auth})
	good := filledIndex(t, 0, 3)
	if _, err := signed.Put(t.Context(), header("KVEVENTS", 1), good.Snapshot); err != nil {
		t.Fatal(err)
	}
	restore := func(s *Store) (*statefile.Header, *indexer.Index, error) {
		ix, _ := indexer.New(indexer.Options{Hasher: hasher})
		h, err := s.Load(t.Context(), func(_ *statefile.Header, r io.Reader) error { return ix.RestoreChecked(r, Verifier(r)) })
		return h, ix, err
	}
	if h, ix, err := restore(signed); err != nil || h.StreamSeq != 1 || ix.Digest() != good.Digest() {
		t.Fatalf("the signed snapshot: %v, %v", h, err)
	}
	// A forger without the key writes a newer snapshot (and moves the
	// pointer to it).
	forger, _ := openStore(t, url, Config{Model: "m", Keep: 3})
	if _, err := forger.Put(t.Context(), header("KVEVENTS", 2), filledIndex(t, 7, 3).Snapshot); err != nil {
		t.Fatal(err)
	}
	// A signed snapshot whose bytes a forger then changed: a header
	// field, which its own checks do not cover as the code does.
	info, err := signed.Put(t.Context(), header("KVEVENTS", 3), filledIndex(t, 9, 3).Snapshot)
	if err != nil {
		t.Fatal(err)
	}
	b, err := signed.obs.GetBytes(t.Context(), info.Object)
	if err != nil {
		t.Fatal(err)
	}
	meta, err := signed.obs.GetInfo(t.Context(), info.Object)
	if err != nil {
		t.Fatal(err)
	}
	b = append(b[:len(b):len(b)], 0) // trailing bytes after the snapshot's end
	if _, err := signed.obs.Put(t.Context(), meta.ObjectMeta, bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	}
	h, ix, err := restore(signed)
	if err != nil || h.StreamSeq != 1 || ix.Digest() != good.Digest() {
		t.Fatalf("with forgeries newer: restored %v (%v); want the signed snapshot at 1", h, err)
	}
	// Without the key both forgeries would be taken: the test can fail.
	if h, _, err := restore(forger); err != nil || h.StreamSeq != 3 {
		t.Errorf("without the key: %v, %v; want the changed snapshot at 3 restored", h, err)
	}
}

// With a key, a pointer written without it (anyone who may write to the
// meta bucket, naming a far newer sequence) is ignored: it neither holds
// off the real snapshots, each of which would otherwise be superseded by
// it, nor steers a reader; the next signed snapshot replaces it.
func TestForgedPointerIgnored(t *testing.T) {
	url := startServer(t)
	auth, err := natstransport.NewAuth([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	signed, logs := openStore(t, url, Config{Model: "m", Keep: 3, Auth: auth})
	good := filledIndex(t, 0, 3)
	if _, err := signed.Put(t.Context(), header("KVEVENTS", 1), good.Snapshot); err != nil {
		t.Fatal(err)
	}
	forger, _ := openStore(t, url, Config{Model: "m", Keep: 3})
	if _, err := forger.Put(t.Context(), header("KVEVENTS", 1_000_000), filledIndex(t, 7, 3).Snapshot); err != nil {
		t.Fatal(err)
	}
	// The forger's store, without the key, takes its own pointer.
	if p, _, err := forger.pointer(t.Context()); err != nil || p == nil || p.StreamSeq != 1_000_000 {
		t.Fatalf("the forged pointer: %+v, %v", p, err)
	}
	info, err := signed.Put(t.Context(), header("KVEVENTS", 2), good.Snapshot)
	if err != nil {
		t.Fatalf("a signed snapshot after a forged pointer: %v; want it kept", err)
	}
	if p, _, err := signed.pointer(t.Context()); err != nil || p == nil || p.Object != info.Object {
		t.Errorf("pointer after the signed Put: %+v, %v; want %s", p, err, info.Object)
	}
	if got := value(t, signed.forgedPointers); got < 1 {
		t.Errorf("forged pointers counted: %v, want at least 1", got)
	}
	if !strings.Contains(logs.String(), "not signed with kvindex's key") {
		t.Errorf("the forged pointer is not logged:\n%s", logs)
	}
	// A pointer copied from another model does not verify either.
	other, _ := openStore(t, url, Config{Model: "n", Keep: 3, Auth: auth})
	e, err := signed.meta.Get(t.Context(), signed.pointerKey())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.meta.Put(t.Context(), other.pointerKey(), e.Value()); err != nil {
		t.Fatal(err)
	}
	if p, _, err := other.pointer(t.Context()); err != nil || p != nil {
		t.Errorf("model m's pointer under model n: %+v, %v; want it ignored", p, err)
	}
}
