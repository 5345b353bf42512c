package service

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/internal/statefile"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// TestStateDirRefusals: a state file kvindex cannot use leaves it empty,
// never half restored; a corrupted one is kept aside for inspection.
func TestStateDirRefusals(t *testing.T) {
	o := baseOptions(zmqtransport.EngineConfig{Name: "pod-a", Model: "m", Endpoint: "tcp://127.0.0.1:1", Ranks: 1})
	o.StateDir = t.TempDir()
	fresh := func() (*stateDir, *indexer.Index, *testutil.SyncBuffer) {
		ix, err := indexer.New(o.Index)
		if err != nil {
			t.Fatal(err)
		}
		logs := &testutil.SyncBuffer{}
		d, err := newStateDir(o, ix, slog.New(slog.NewTextHandler(logs, nil)))
		if err != nil {
			t.Fatal(err)
		}
		return d, ix, logs
	}
	// A state file of one engine, written by a kvindex hashing as o does.
	src, _, _ := fresh()
	id := kvevents.EngineID{Model: "m", Pod: "pod-a"}
	src.index.Apply(id, 3, []kvevents.Event{{Kind: kvevents.BlockStored, Hashes: []uint64{11, 12}, BlockSize: 16}})
	writeState := func(h statefile.Hashing) {
		w, err := statefile.Begin(o.StateDir)
		if err != nil {
			t.Fatal(err)
		}
		hdr := &statefile.Header{Hashing: h, Positions: statefile.FromPositions([]kvevents.Position{
			{Engine: id, Seq: 3, Print: 5}, {Engine: kvevents.EngineID{Model: "m", Pod: "gone"}, Seq: 9},
		})}
		if err := w.Write(hdr, src.index.Snapshot); err != nil {
			t.Fatal(err)
		}
		if err := w.Commit(); err != nil {
			t.Fatal(err)
		}
	}

	writeState(src.hashing)
	d, ix, _ := fresh()
	pos := d.restore(o)
	if len(pos) != 1 || pos[0].Engine != id || pos[0].Seq != 3 || pos[0].Print != 5 {
		t.Fatalf("restored positions %+v, want pod-a's only (gone is not configured)", pos)
	}
	if st := ix.Stats(); st.HolderBlocks != 2 {
		t.Fatalf("restored %d holder blocks, want 2", st.HolderBlocks)
	}

	other := src.hashing
	other.Seed = "1"
	writeState(other)
	d, ix, logs := fresh()
	if pos := d.restore(o); pos != nil || ix.Stats().HolderBlocks != 0 {
		t.Errorf("another hash seed: restored %v, %d blocks; want nothing", pos, ix.Stats().HolderBlocks)
	}
	if !strings.Contains(logs.String(), "hashed otherwise") {
		t.Errorf("the refusal is not logged:\n%s", logs)
	}

	writeState(src.hashing)
	path := filepath.Join(o.StateDir, statefile.Name)
	b, _ := os.ReadFile(path)
	b[len(b)-3] ^= 1 // in the snapshot's last frame
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	d, ix, logs = fresh()
	if pos := d.restore(o); pos != nil || ix.Stats().HolderBlocks != 0 {
		t.Errorf("corrupted file: restored %v, %d blocks; want nothing", pos, ix.Stats().HolderBlocks)
	}
	if _, err := os.Stat(path + ".bad"); err != nil {
		t.Errorf("the corrupted file is not kept: %v", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the corrupted file is still the state file: %v", err)
	}
	if !strings.Contains(logs.String(), "state file refused") {
		t.Errorf("the refusal is not logged:\n%s", logs)
	}
}

// A state directory kvindex cannot create is a setting that failed when
// used, named as such.
func TestStateDirNotCreatable(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	o := baseOptions(zmqtransport.EngineConfig{Name: "a", Model: "m", Endpoint: "tcp://h:1", Ranks: 1})
	o.StateDir = filepath.Join(file, "sub")
	err := Check(o, slog.New(slog.DiscardHandler))
	if ce, ok := configerr.As(err); !ok || ce.Field != "StateDir" || ce.Usage() || !errors.Is(err, syscall.ENOTDIR) {
		t.Fatalf("a state dir under a file: %v, want StateDir failing with ENOTDIR", err)
	}
}
