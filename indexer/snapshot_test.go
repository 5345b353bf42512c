package indexer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"testing"

	"github.com/zeebo/xxh3"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
)

// snapshotWorld fills ix with a bit of everything: two models, DP ranks,
// media, groups, references, many holders, a verified and a fallback
// engine.
func snapshotWorld(t testing.TB, ix *Index, h *blockhash.Hasher) {
	t.Helper()
	for i := range 70 {
		id := kvevents.EngineID{Model: "m", Pod: fmt.Sprintf("p%02d", i%35), DPRank: i / 35}
		ix.Apply(id, uint64(10+i), []kvevents.Event{stored(testutil.Seq(1, 20+i%5)...), stored(testutil.Seq(1000*i, 30)...)})
	}
	ix.Apply(eng("x", 0), 5, []kvevents.Event{stored(1, 2), stored(1), storedIn("CPU", 2, 1, 2, 3), storedIn("DISK", 0, 9)})
	toks := testutil.Seq(40, 64)
	good, _ := storedChain(t, h, nil, toks, nil)
	ix.Apply(kvevents.EngineID{Model: "tok", Pod: "good"}, 1, []kvevents.Event{good})
	wrong := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "other", BlockSize: h.BlockSize()})
	bad, _ := storedChain(t, wrong, nil, toks, nil)
	ix.Apply(kvevents.EngineID{Model: "tok", Pod: "bad"}, 7, []kvevents.Event{bad})
}

func TestSnapshotRoundTrip(t *testing.T) {
	h := mustHasher(t, blockhash.SHA256CBOR, "0", 16)
	src := mustNew(t, Options{Hasher: h})
	snapshotWorld(t, src, h)
	var buf bytes.Buffer
	if err := src.Snapshot(&buf); err != nil {
		t.Fatal(err)
	}
	dst := mustNew(t, Options{Hasher: h})
	dst.Apply(eng("stale", 0), 1, []kvevents.Event{stored(1, 2, 3)}) // replaced wholesale
	if err := dst.Restore(bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	if src.Digest() != dst.Digest() {
		t.Fatal("digests differ after restore")
	}
	if s, d := src.Stats(), dst.Stats(); s.HolderBlocks != d.HolderBlocks || s.Blocks != d.Blocks || s.Engines != d.Engines || s.Models != d.Models {
		t.Errorf("stats %+v vs %+v", s, d)
	}
	if !reflect.DeepEqual(src.Engines(), dst.Engines()) {
		// Counters are not content; compare what is.
		se, de := src.Engines(), dst.Engines()
		if len(se) != len(de) {
			t.Fatalf("%d engines, want %d", len(de), len(se))
		}
		for i := range se {
			s, d := se[i], de[i]
			if s.Engine != d.Engine || s.HolderBlocks != d.HolderBlocks || !reflect.DeepEqual(s.Tiers, d.Tiers) || s.HashCheck != d.HashCheck || s.Fallback != d.Fallback || s.LastSeq != d.LastSeq || s.Message != d.Message {
				t.Errorf("engine %d: %+v vs %+v", i, s, d)
			}
		}
	}
	for _, q := range []*Query{
		{Model: "m", BlockHashes: testutil.Seq(1, 30)},
		{Model: "m", BlockHashes: []uint64{1, 2, 3}, Candidates: []string{"x", "p01"}},
		{Model: "tok", Tokens: testutil.Seq(40, 64)},
	} {
		if a, b := query(t, src, q), query(t, dst, q); !reflect.DeepEqual(a, b) {
			t.Errorf("query %+v: %s", q, diffResults(b, a))
		}
	}
	checkInvariants(t, dst)
	// The fallback engine's map came along: its removals still resolve.
	wrong := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "other", BlockSize: 16})
	_, wh := storedChain(t, wrong, nil, testutil.Seq(40, 64), nil)
	bad := kvevents.EngineID{Model: "tok", Pod: "bad"}
	for _, ix := range []*Index{src, dst} {
		ix.Apply(bad, 8, []kvevents.Event{removed(wh[3].Key)})
	}
	if src.Digest() != dst.Digest() || engineInfo(t, dst, bad).HolderBlocks != 3 {
		t.Errorf("fallback removal after restore: %+v", engineInfo(t, dst, bad))
	}
	// A snapshot of the restored index restores to the same content.
	var again bytes.Buffer
	if err := dst.Snapshot(&again); err != nil {
		t.Fatal(err)
	}
	third := mustNew(t, Options{Hasher: h})
	if err := third.Restore(&again); err != nil || third.Digest() != dst.Digest() {
		t.Errorf("second generation: %v", err)
	}
}

func TestSnapshotEmptyAndLarge(t *testing.T) {
	ix := mustNew(t, Options{})
	var buf bytes.Buffer
	if err := ix.Snapshot(&buf); err != nil {
		t.Fatal(err)
	}
	other := mustNew(t, Options{})
	other.Apply(eng("a", 0), 1, []kvevents.Event{stored(1)})
	if err := other.Restore(&buf); err != nil || other.Digest() != ix.Digest() || other.Stats().Engines != 0 {
		t.Errorf("empty: %v %+v", err, other.Stats())
	}
	// Several frames.
	for i := range 20 {
		ix.Apply(eng(fmt.Sprintf("p%d", i), 0), 1, []kvevents.Event{stored(testutil.Seq(i*10000, 5000)...)})
	}
	buf.Reset()
	if err := ix.Snapshot(&buf); err != nil {
		t.Fatal(err)
	}
	if buf.Len() <= maxFrame {
		t.Fatalf("snapshot of %d bytes: want several frames", buf.Len())
	}
	if err := other.Restore(&buf); err != nil || other.Digest() != ix.Digest() {
		t.Errorf("large: %v", err)
	}
}

func TestRestoreRejectsCorruption(t *testing.T) {
	h := mustHasher(t, blockhash.SHA256CBOR, "0", 16)
	src := mustNew(t, Options{Hasher: h})
	snapshotWorld(t, src, h)
	var buf bytes.Buffer
	if err := src.Snapshot(&buf); err != nil {
		t.Fatal(err)
	}
	snap := buf.Bytes()
	dst := mustNew(t, Options{Hasher: h})
	dst.Apply(eng("keep", 0), 1, []kvevents.Event{stored(4, 5, 6)})
	before := dst.Digest()
	check := func(name string, data []byte) {
		t.Helper()
		err := dst.Restore(bytes.NewReader(data))
		if !errors.Is(err, ErrBadSnapshot) {
			t.Fatalf("%s: error %v", name, err)
		}
		if dst.Digest() != before || dst.Stats().Engines != 1 {
			t.Fatalf("%s: index changed", name)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	flips := 300
	if raceEnabled {
		flips = 60
	}
	for range flips {
		bad := slices.Clone(snap)
		i := rng.IntN(len(bad))
		bad[i] ^= byte(1 + rng.IntN(255))
		check(fmt.Sprintf("flip at %d", i), bad)
	}
	for _, n := range []int{0, 5, 12, 13, 16, len(snap) / 2, len(snap) - 13, len(snap) - 1} {
		check(fmt.Sprintf("truncated to %d", n), snap[:n])
	}
	check("version", append([]byte(snapMagic+"\x00\x00\x00\x02"), snap[12:]...))
	check("magic", append([]byte("KVIXSNAQ"), snap[8:]...))
	// Hostile frames with valid checksums.
	frame := func(payload []byte) []byte {
		out := append([]byte(snapMagic), 0, 0, 0, 1)
		out = binary.BigEndian.AppendUint32(out, uint32(len(payload)))
		out = append(out, payload...)
		sum := xxh3.HashSeed(payload, snapVersion)
		out = binary.BigEndian.AppendUint64(out, sum)
		out = binary.BigEndian.AppendUint32(out, 0)
		return binary.BigEndian.AppendUint64(out, xxh3.HashSeed(nil, sum))
	}
	huge := binary.AppendUvarint(nil, 1)     // one model
	huge = binary.AppendUvarint(huge, 1)     // name length
	huge = append(huge, 'm')                 // name
	huge = binary.AppendUvarint(huge, 16)    // block size
	huge = binary.AppendUvarint(huge, 1)     // media
	huge = binary.AppendUvarint(huge, 3)     // "GPU"
	huge = append(huge, "GPU"...)            //
	huge = binary.AppendUvarint(huge, 1<<19) // engines claimed, none sent
	check("claims without content", frame(huge))
	over := binary.AppendUvarint(nil, 1<<62)
	check("huge model count", frame(over))
	long := binary.AppendUvarint(nil, 1)
	long = binary.AppendUvarint(long, 1<<30) // model name length
	check("huge string", frame(long))
	check("oversized frame", append(append([]byte(snapMagic), 0, 0, 0, 1), 0xff, 0xff, 0xff, 0xff))
	// Duplicate blocks and holdings, bad references.
	dup := slices.Clone(huge[:len(huge)-3])
	dup = binary.AppendUvarint(dup, 1) // one engine
	dup = binary.AppendUvarint(dup, 1)
	dup = append(dup, 'a')
	dup = binary.AppendVarint(dup, 0)
	dup = append(dup, 0, 0, 0, 0, 0) // seq, check, fallback, message, fallback entries
	block := func(b []byte, key uint64, holdings ...[4]uint64) []byte {
		b = binary.AppendUvarint(b, uint64(len(holdings)))
		b = binary.BigEndian.AppendUint64(b, key)
		for _, hd := range holdings {
			for _, x := range hd {
				b = binary.AppendUvarint(b, x)
			}
		}
		return b
	}
	ok := block(slices.Clone(dup), 7, [4]uint64{0, 0, 0, 1})
	okEnd := binary.AppendUvarint(slices.Clone(ok), 0)
	if err := mustNew(t, Options{}).Restore(bytes.NewReader(frame(okEnd))); err != nil {
		t.Fatalf("hand-made snapshot: %v", err)
	}
	check("duplicate block", frame(binary.AppendUvarint(block(slices.Clone(ok), 7, [4]uint64{0, 0, 0, 1}), 0)))
	check("duplicate holding", frame(binary.AppendUvarint(block(slices.Clone(dup), 8, [4]uint64{0, 0, 0, 1}, [4]uint64{0, 0, 0, 2}), 0)))
	check("engine out of range", frame(binary.AppendUvarint(block(slices.Clone(dup), 8, [4]uint64{1, 0, 0, 1}), 0)))
	check("medium out of range", frame(binary.AppendUvarint(block(slices.Clone(dup), 8, [4]uint64{0, 0, 1, 1}), 0)))
	check("zero references", frame(binary.AppendUvarint(block(slices.Clone(dup), 8, [4]uint64{0, 0, 0, 0}), 0)))
	check("group out of range", frame(binary.AppendUvarint(block(slices.Clone(dup), 8, [4]uint64{0, 5000, 0, 1}), 0)))
	check("content after the end", frame(append(slices.Clone(okEnd), 0)))
	// A budget bounds what a stream may make the index allocate.
	small := mustNew(t, Options{MemoryBudget: 1 << 20})
	var big bytes.Buffer
	large := mustNew(t, Options{})
	for i := range 8 {
		large.Apply(eng(fmt.Sprintf("p%d", i), 0), 1, []kvevents.Event{stored(testutil.Seq(i*100000, 20000)...)})
	}
	if err := large.Snapshot(&big); err != nil {
		t.Fatal(err)
	}
	if err := small.Restore(&big); !errors.Is(err, ErrBadSnapshot) || small.Stats().Engines != 0 {
		t.Errorf("over budget: %v", err)
	}
}

// errWriter fails after n bytes.
type errWriter struct{ n int }

func (w *errWriter) Write(p []byte) (int, error) {
	if w.n -= len(p); w.n < 0 {
		return 0, io.ErrShortWrite
	}
	return len(p), nil
}

func TestSnapshotWriteError(t *testing.T) {
	ix := mustNew(t, Options{})
	ix.Apply(eng("a", 0), 1, []kvevents.Event{stored(testutil.Seq(1, 100000)...)})
	for _, n := range []int{0, 11, 100, 1 << 20} {
		if err := ix.Snapshot(&errWriter{n: n}); !errors.Is(err, io.ErrShortWrite) {
			t.Errorf("writer failing after %d bytes: %v", n, err)
		}
	}
}

func TestDigestOrderIndependent(t *testing.T) {
	events := map[kvevents.EngineID][]kvevents.Event{
		eng("a", 0):            {stored(1, 2, 3), storedIn("CPU", 1, 2)},
		eng("b", 1):            {stored(1, 2), stored(1)},
		{Model: "n", Pod: "a"}: {stored(1, 2, 3)},
	}
	ids := []kvevents.EngineID{eng("a", 0), eng("b", 1), {Model: "n", Pod: "a"}}
	var digests [][32]byte
	for _, order := range [][]int{{0, 1, 2}, {2, 1, 0}, {1, 0, 2}} {
		ix := mustNew(t, Options{})
		for _, i := range order {
			ix.Apply(ids[i], 1, events[ids[i]])
		}
		digests = append(digests, ix.Digest())
	}
	if digests[0] != digests[1] || digests[0] != digests[2] {
		t.Errorf("digest depends on order: %x", digests)
	}
	empty := mustNew(t, Options{}).Digest()
	for _, change := range []kvevents.Event{stored(4), storedIn("CPU", 0, 1), storedIn("", 2, 1), stored(1)} {
		ix := mustNew(t, Options{})
		for _, id := range ids {
			ix.Apply(id, 1, events[id])
		}
		ix.Apply(eng("a", 0), 2, []kvevents.Event{change})
		if d := ix.Digest(); d == digests[0] || d == empty {
			t.Errorf("digest blind to %+v", change)
		}
	}
	// Engine identity counts, not the internal id.
	x, y := mustNew(t, Options{}), mustNew(t, Options{})
	x.Apply(eng("a", 0), 1, []kvevents.Event{stored(1)})
	y.Apply(eng("b", 0), 1, []kvevents.Event{stored(1)})
	if x.Digest() == y.Digest() {
		t.Error("digest blind to the engine")
	}
}

func FuzzRestore(f *testing.F) {
	h := mustHasher(f, blockhash.SHA256CBOR, "0", 16)
	src := mustNew(f, Options{Hasher: h})
	snapshotWorld(f, src, h)
	var buf bytes.Buffer
	if err := src.Snapshot(&buf); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	small := mustNew(f, Options{})
	small.Apply(eng("a", 0), 1, []kvevents.Event{stored(1, 2), storedIn("CPU", 3, 2)})
	buf.Reset()
	if err := small.Snapshot(&buf); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Add([]byte(snapMagic))
	f.Fuzz(func(t *testing.T, data []byte) {
		ix := mustNew(t, Options{Hasher: h, MemoryBudget: 64 << 20})
		ix.Apply(eng("keep", 0), 1, []kvevents.Event{stored(1)})
		before := ix.Digest()
		if err := ix.Restore(bytes.NewReader(data)); err != nil {
			if ix.Digest() != before {
				t.Fatal("failed restore changed the index")
			}
			return
		}
		checkInvariants(t, ix)
		var out bytes.Buffer
		if err := ix.Snapshot(&out); err != nil {
			t.Fatal(err)
		}
		again := mustNew(t, Options{Hasher: h})
		if err := again.Restore(&out); err != nil || again.Digest() != ix.Digest() {
			t.Fatalf("re-snapshot: %v", err)
		}
	})
}

var updateGolden = flag.Bool("update", false, "rewrite testdata golden files")

// TestSnapshotGolden pins the version-1 format: a deterministic index
// snapshots to the committed bytes, and the committed bytes restore to it.
func TestSnapshotGolden(t *testing.T) {
	h := mustHasher(t, blockhash.SHA256CBOR, "0", 16)
	ix := mustNew(t, Options{Hasher: h})
	snapshotWorld(t, ix, h)
	var buf bytes.Buffer
	if err := ix.Snapshot(&buf); err != nil {
		t.Fatal(err)
	}
	const golden = "testdata/snapshot_v1.bin"
	if *updateGolden {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		// Blocks are written in table order, so a change of table layout
		// changes the bytes too: regenerate with -update then; a change
		// of the format itself needs a new snapVersion.
		t.Errorf("snapshot bytes differ from %s (%d vs %d bytes)", golden, buf.Len(), len(want))
	}
	restored := mustNew(t, Options{Hasher: h})
	if err := restored.Restore(bytes.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	if restored.Digest() != ix.Digest() {
		t.Error("golden snapshot restores to other content")
	}
}
