package statefile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents"
)

var hasher = blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 4})

// filledIndex is an index holding a few prompts of two engines.
func filledIndex(t testing.TB, prompts int) *indexer.Index {
	t.Helper()
	ix, err := indexer.New(indexer.Options{Hasher: hasher})
	if err != nil {
		t.Fatal(err)
	}
	for p := range prompts {
		toks := make([]uint64, 16)
		for i := range toks {
			toks[i] = uint64(p*1000 + i)
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

var positions = []kvevents.Position{
	{Engine: kvevents.EngineID{Model: "m", Pod: "pod-a"}, Seq: 41, Print: 1<<64 - 3, Health: kvevents.HealthOK},
	{Engine: kvevents.EngineID{Model: "m", Pod: "pod-b", DPRank: 3}, Seq: 7, Print: 99, Health: kvevents.HealthDegraded},
}

// write writes one state file of ix into dir.
func write(t testing.TB, dir string, ix *indexer.Index, ps []kvevents.Position) {
	t.Helper()
	w, err := Begin(dir)
	if err != nil {
		t.Fatal(err)
	}
	h := &Header{Written: time.Unix(1700000000, 0).UTC(), Hashing: Hashing{Algo: "sha256_cbor", Seed: "0", BlockSize: 4}, Positions: FromPositions(ps)}
	if err := w.Write(h, ix.Snapshot); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
}

func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	ix := filledIndex(t, 10)
	write(t, dir, ix, positions)
	h, r, c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, err := h.KVPositions()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, positions) {
		t.Errorf("positions %+v, want %+v", got, positions)
	}
	if h.Hashing.Algo != "sha256_cbor" || h.Hashing.BlockSize != 4 || !h.Written.Equal(time.Unix(1700000000, 0)) {
		t.Errorf("header %+v", h)
	}
	ix2, _ := indexer.New(indexer.Options{Hasher: hasher})
	if err := ix2.Restore(r); err != nil {
		t.Fatal(err)
	}
	if ix2.Digest() != ix.Digest() {
		t.Error("restored index differs from the one written")
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || ents[0].Name() != Name {
		t.Errorf("dir holds %v, want only %s", ents, Name)
	}
}

// TestReplaceKeepsOldOnAbort: a write that does not commit leaves the
// previous state file as it was, and no temporary file.
func TestReplaceKeepsOldOnAbort(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, filledIndex(t, 2), positions[:1])
	before, _ := os.ReadFile(filepath.Join(dir, Name))
	w, err := Begin(dir)
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("snapshot failed")
	if err := w.Write(&Header{}, func(io.Writer) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Write: %v, want %v", err, boom)
	}
	w.Abort()
	after, _ := os.ReadFile(filepath.Join(dir, Name))
	if !bytes.Equal(before, after) {
		t.Error("an aborted write changed the state file")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("dir holds %d files after abort, want 1", len(ents))
	}
	if err := w.Commit(); err == nil {
		t.Error("Commit after Abort succeeded")
	}
}

func TestClean(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, filledIndex(t, 1), nil)
	for _, n := range []string{tempPrefix + "123", "other"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := Clean(dir); err != nil {
		t.Fatal(err)
	}
	var names []string
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{Name, "other"}) {
		t.Errorf("after Clean: %v", names)
	}
}

func TestOpenMissing(t *testing.T) {
	if _, _, _, err := Open(t.TempDir()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open of an empty dir: %v, want fs.ErrNotExist", err)
	}
}

// TestCorruption: every truncation and every flipped byte of a state file
// is refused (by the header's checksum or the snapshot's frames), never
// restored in part.
func TestCorruption(t *testing.T) {
	dir := t.TempDir()
	ix := filledIndex(t, 3)
	write(t, dir, ix, positions)
	good, _ := os.ReadFile(filepath.Join(dir, Name))
	load := func(b []byte) error {
		r := bytes.NewReader(b)
		h, err := ReadHeader(r)
		if err != nil {
			return err
		}
		if _, err := h.KVPositions(); err != nil {
			return err
		}
		ix2, _ := indexer.New(indexer.Options{Hasher: hasher})
		return ix2.Restore(r)
	}
	if err := load(good); err != nil {
		t.Fatalf("the intact file: %v", err)
	}
	for n := 0; n < len(good); n++ {
		if load(good[:n]) == nil {
			t.Fatalf("truncated to %d of %d bytes: accepted", n, len(good))
		}
	}
	for i := range good {
		bad := slices.Clone(good)
		bad[i] ^= 0x20
		if load(bad) == nil {
			t.Fatalf("byte %d flipped: accepted", i)
		}
	}
}

func TestBadHeaders(t *testing.T) {
	mk := func(magicS string, ver, n uint32, body []byte, sum uint64) []byte {
		b := []byte(magicS)
		b = append(b, byte(ver>>24), byte(ver>>16), byte(ver>>8), byte(ver))
		b = append(b, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
		b = append(b, body...)
		for i := 7; i >= 0; i-- {
			b = append(b, byte(sum>>(8*i)))
		}
		return b
	}
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"empty", nil},
		{"other magic", mk("KVIXSNAP", 1, 2, []byte("{}"), 0)},
		{"future version", mk(magic, 2, 2, []byte("{}"), 0)},
		{"hostile length", mk(magic, 1, 1<<31, nil, 0)},
		{"claimed longer than file", mk(magic, 1, 1000, []byte("{}"), 0)},
		{"bad checksum", mk(magic, 1, 2, []byte("{}"), 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ReadHeader(bytes.NewReader(tc.in)); !errors.Is(err, ErrBadState) {
				t.Errorf("ReadHeader: %v, want ErrBadState", err)
			}
		})
	}
}

func TestKVPositionsRefusesBadValues(t *testing.T) {
	for _, p := range []Position{
		{Pod: "a", Health: "fine"},
		{Pod: "a", Rank: -1, Health: "ok"},
		{Pod: "a", Rank: kvevents.MaxDPRank, Health: "ok"},
		{Pod: "", Health: "ok"},
	} {
		h := &Header{Positions: []Position{p}}
		if _, err := h.KVPositions(); !errors.Is(err, ErrBadState) {
			t.Errorf("%+v: %v, want ErrBadState", p, err)
		}
	}
}

func FuzzReadHeader(f *testing.F) {
	dir := f.TempDir()
	write(f, dir, filledIndex(f, 1), positions)
	good, _ := os.ReadFile(filepath.Join(dir, Name))
	f.Add(good)
	f.Add([]byte(magic))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ReadHeader(bytes.NewReader(b))
		if err != nil {
			if !errors.Is(err, ErrBadState) {
				t.Fatalf("error %v does not wrap ErrBadState", err)
			}
			return
		}
		_, _ = h.KVPositions()
	})
}

// TestEncode: Encode writes what the file writer writes, and its stream
// fields come back from ReadHeader with the snapshot after them.
func TestEncode(t *testing.T) {
	ix := filledIndex(t, 5)
	for _, tc := range []struct {
		name   string
		stream string
		seq    uint64
	}{
		{"without a stream", "", 0},
		{"with a stream", "KVEVENTS", 1<<64 - 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &Header{Written: time.Unix(1700000000, 0).UTC(), Hashing: Hashing{Algo: "sha256_cbor", Seed: "0", BlockSize: 4},
				Positions: FromPositions(positions), Stream: tc.stream, StreamSeq: tc.seq}
			var buf bytes.Buffer
			if err := Encode(&buf, h, ix.Snapshot); err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			w, err := Begin(dir)
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Write(h, ix.Snapshot); err != nil {
				t.Fatal(err)
			}
			if err := w.Commit(); err != nil {
				t.Fatal(err)
			}
			if file, _ := os.ReadFile(filepath.Join(dir, Name)); !bytes.Equal(file, buf.Bytes()) || w.Size() != int64(buf.Len()) {
				t.Errorf("the file writer wrote %d bytes (Size %d), Encode %d, or other bytes", len(file), w.Size(), buf.Len())
			}
			got, err := ReadHeader(&buf)
			if err != nil {
				t.Fatal(err)
			}
			if got.Stream != tc.stream || got.StreamSeq != tc.seq {
				t.Errorf("stream %q seq %d, want %q %d", got.Stream, got.StreamSeq, tc.stream, tc.seq)
			}
			ix2, _ := indexer.New(indexer.Options{Hasher: hasher})
			if err := ix2.Restore(&buf); err != nil {
				t.Fatal(err)
			}
			if ix2.Digest() != ix.Digest() {
				t.Error("restored index differs from the one encoded")
			}
		})
	}
}

// TestEncodeSnapshotError: a failing snapshot is Encode's error.
func TestEncodeSnapshotError(t *testing.T) {
	boom := errors.New("snapshot failed")
	if err := Encode(io.Discard, &Header{}, func(io.Writer) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("Encode: %v, want %v", err, boom)
	}
}

// TestHeaderWithoutStream: a header written before the stream fields
// existed reads, and a header without a stream does not name the fields,
// so the files kvindex writes without NATS stay as they were.
func TestHeaderWithoutStream(t *testing.T) {
	old := []byte(`{"written":"2023-11-14T22:13:20Z","hashing":{"algo":"sha256_cbor","seed":"0","block_size":4},"positions":[]}`)
	var b []byte
	b = append(b, magic...)
	b = binary.BigEndian.AppendUint32(b, version)
	b = binary.BigEndian.AppendUint32(b, uint32(len(old)))
	b = append(b, old...)
	b = binary.BigEndian.AppendUint64(b, xxh3.Hash(old))
	h, err := ReadHeader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if h.Stream != "" || h.StreamSeq != 0 || h.Hashing.BlockSize != 4 {
		t.Errorf("header %+v", h)
	}
	var buf bytes.Buffer
	if err := Encode(&buf, h, func(io.Writer) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(buf.Bytes(), []byte("stream")) {
		t.Errorf("a header without a stream names it: %q", buf.Bytes())
	}
}
