package enginesim_test

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/enginesim"
)

// recorder is a Publisher that keeps what it is given.
type recorder struct {
	seqs     []uint64
	payloads [][]byte
	err      error // returned by Publish
}

func (r *recorder) Publish(seq uint64, payload []byte) error {
	r.seqs = append(r.seqs, seq)
	r.payloads = append(r.payloads, payload)
	return r.err
}

func newModel(t *testing.T, pub enginesim.Publisher, bufferSteps int) *enginesim.Engine {
	t.Helper()
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 4})
	e, err := enginesim.New(enginesim.Config{Hasher: h, CapacityBlocks: 64, Publisher: pub, BufferSteps: bufferSteps, DPRank: 1})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// buffered collects Engine.Buffered(from) as seqs and payloads.
func buffered(e *enginesim.Engine, from uint64) ([]uint64, [][]byte) {
	var seqs []uint64
	var payloads [][]byte
	for seq, p := range e.Buffered(from) {
		seqs = append(seqs, seq)
		payloads = append(payloads, p)
	}
	return seqs, payloads
}

// TestPublisherContract: the Publisher gets every batch once, in sequence
// order, except those DropNext withholds; the replay buffer holds them
// all, the same bytes, up to BufferSteps; Restart starts both over.
func TestPublisherContract(t *testing.T) {
	rec := &recorder{}
	e := newModel(t, rec, 4)
	for i := range 3 {
		if _, err := e.Process(testutil.Seq(100*i, 8), nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.Process(testutil.Seq(0, 8), nil); err != nil { // a full hit: no batch
		t.Fatal(err)
	}
	e.DropNext(2)
	for i := 3; i < 6; i++ {
		if _, err := e.Process(testutil.Seq(100*i, 8), nil); err != nil {
			t.Fatal(err)
		}
	}
	if want := []uint64{0, 1, 2, 5}; !slices.Equal(rec.seqs, want) {
		t.Fatalf("published seqs %v, want %v", rec.seqs, want)
	}
	if e.Seq() != 6 {
		t.Fatalf("Seq = %d, want 6", e.Seq())
	}
	seqs, payloads := buffered(e, 0)
	if want := []uint64{2, 3, 4, 5}; !slices.Equal(seqs, want) {
		t.Fatalf("buffered seqs %v, want %v (the last BufferSteps)", seqs, want)
	}
	if string(payloads[3]) != string(rec.payloads[3]) {
		t.Fatal("the buffered copy of a published batch differs from it")
	}
	var b kvevents.Batch
	if err := (&kvevents.Decoder{}).Decode(payloads[1], &b); err != nil {
		t.Fatal(err)
	}
	if !b.HasDPRank || b.DPRank != 1 || b.Events[0].Kind != kvevents.BlockStored || b.Events[0].TokenIDs[0] != 300 {
		t.Fatalf("a withheld batch in the buffer: %+v", b)
	}
	if seqs, _ := buffered(e, 4); !slices.Equal(seqs, []uint64{4, 5}) {
		t.Fatalf("buffered from 4: %v", seqs)
	}
	if seqs, _ := buffered(e, 6); len(seqs) != 0 {
		t.Fatalf("buffered from the next seq: %v", seqs)
	}
	// An iteration may stop early.
	for range e.Buffered(0) {
		break
	}

	e.Restart()
	if seqs, _ := buffered(e, 0); len(seqs) != 0 || e.Seq() != 0 || e.CachedBlocks() != 0 {
		t.Fatalf("after Restart: buffered %v, Seq %d, CachedBlocks %d", seqs, e.Seq(), e.CachedBlocks())
	}
	if err := e.Clear(); err != nil {
		t.Fatal(err)
	}
	if got := rec.seqs[len(rec.seqs)-1]; got != 0 {
		t.Fatalf("first batch after Restart has seq %d", got)
	}
	if err := (&kvevents.Decoder{}).Decode(rec.payloads[len(rec.payloads)-1], &b); err != nil || b.Events[0].Kind != kvevents.AllBlocksCleared {
		t.Fatalf("Clear published %+v, %v", b.Events, err)
	}
}

// TestFirstSeq: an engine may start its sequence anywhere, and wraps past
// 2^64-1 to 0 on the same stream, as a peer's counter would; the replay
// buffer and a restart follow.
func TestFirstSeq(t *testing.T) {
	rec := &recorder{}
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 4})
	e, err := enginesim.New(enginesim.Config{Hasher: h, CapacityBlocks: 64, Publisher: rec, FirstSeq: math.MaxUint64 - 1})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if _, err := e.Process(testutil.Seq(100*i, 8), nil); err != nil {
			t.Fatal(err)
		}
	}
	if want := []uint64{math.MaxUint64 - 1, math.MaxUint64, 0, 1}; !slices.Equal(rec.seqs, want) {
		t.Fatalf("published seqs %v, want %v", rec.seqs, want)
	}
	if e.Seq() != 2 {
		t.Fatalf("Seq = %d, want 2", e.Seq())
	}
	if seqs, _ := buffered(e, math.MaxUint64); !slices.Equal(seqs, []uint64{math.MaxUint64}) {
		t.Fatalf("buffered from 2^64-1: %v", seqs)
	}
	e.Restart()
	if e.Seq() != math.MaxUint64-1 {
		t.Fatalf("after Restart, Seq = %d, want FirstSeq", e.Seq())
	}
}

// TestPublishErrors: a Publisher's error comes back from Process with the
// cache updated and the batch buffered; after Close nothing is published.
func TestPublishErrors(t *testing.T) {
	boom := errors.New("boom")
	rec := &recorder{err: boom}
	e := newModel(t, rec, 0)
	if _, err := e.Process(testutil.Seq(0, 8), nil); !errors.Is(err, boom) {
		t.Fatalf("Process error %v, want %v", err, boom)
	}
	if e.CachedBlocks() != 2 || e.Seq() != 1 {
		t.Fatalf("after a failed publish: CachedBlocks %d, Seq %d", e.CachedBlocks(), e.Seq())
	}
	if seqs, _ := buffered(e, 0); !slices.Equal(seqs, []uint64{0}) {
		t.Fatalf("buffered %v", seqs)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	n := len(rec.seqs)
	if _, err := e.Process(testutil.Seq(50, 8), nil); !errors.Is(err, enginesim.ErrClosed) {
		t.Fatalf("Process after Close: %v", err)
	}
	if err := e.Clear(); !errors.Is(err, enginesim.ErrClosed) {
		t.Fatalf("Clear after Close: %v", err)
	}
	if len(rec.seqs) != n {
		t.Fatal("published after Close")
	}
}

func TestNewErrors(t *testing.T) {
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 4})
	for _, tc := range []struct {
		name string
		cfg  enginesim.Config
	}{
		{"no hasher", enginesim.Config{CapacityBlocks: 1}},
		{"no capacity", enginesim.Config{Hasher: h}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := enginesim.New(tc.cfg); err == nil {
				t.Fatal("New succeeded")
			}
		})
	}
}

func ExampleEngine() {
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 16})
	// No Publisher: batches only go to the replay buffer.
	// simzmq.New publishes them over ZMQ.
	e, err := enginesim.New(enginesim.Config{Pod: "pod-a", Model: "m", Hasher: h, CapacityBlocks: 1024})
	if err != nil {
		fmt.Println(err)
		return
	}
	prompt := make([]uint64, 100)
	for i := range prompt {
		prompt[i] = uint64(i)
	}
	first, _ := e.Process(prompt, nil)
	second, _ := e.Process(prompt, nil)
	blocks, _ := e.Lookup(prompt, nil)
	fmt.Println(first, second, blocks, e.CachedBlocks(), e.Seq())
	// Output: 0 96 6 6 1
}
