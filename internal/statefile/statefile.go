package statefile

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/kvindex/kvindex/kvevents"
)

// Name is the state file's name in the state directory.
const Name = "kvindex.state"

// tempPrefix starts the name of a state file being written; leftovers of a
// crash are removed by Clean.
const tempPrefix = Name + ".tmp-"

// File layout, version 1:
//
//	"KVIXSTAT" | version u32 BE | header length u32 BE | header (JSON) |
//	XXH3-64 of the header u64 BE | index snapshot (indexer.Index.Snapshot)
const (
	magic   = "KVIXSTAT"
	version = 1
	// maxHeader bounds the header a reader accepts: positions of the most
	// engines a kvindex follows (zmqtransport.DefaultMaxEngines is 8,000,
	// about 150 bytes each) fit many times over.
	maxHeader = 64 << 20
)

// ErrBadState wraps every reason a state file is refused.
var ErrBadState = errors.New("statefile: bad state file")

// Header is what a state file says about itself and the engines.
type Header struct {
	// Written is when the snapshot was taken.
	Written time.Time `json:"written"`
	// Version is the kvindex version that wrote it (informational).
	Version string `json:"version,omitempty"`
	// Hashing is the hash configuration the index's keys were computed
	// with: a kvindex configured otherwise must not restore them.
	Hashing Hashing `json:"hashing"`
	// Positions are the engine streams' positions when the snapshot was
	// taken: the index holds exactly what they applied.
	Positions []Position `json:"positions"`
	// Stream and StreamSeq name the JetStream stream the index was fed
	// from and the sequence of the last message applied, when it was fed
	// from one (empty and 0 otherwise): a replica restoring the snapshot
	// replays the stream from StreamSeq+1.
	Stream    string `json:"stream,omitempty"`
	StreamSeq uint64 `json:"stream_seq,omitempty"`
}

// Hashing identifies a block-hash configuration.
type Hashing struct {
	Algo      string `json:"algo"`
	Seed      string `json:"seed"`
	BlockSize int    `json:"block_size"`
}

// Position is kvevents.Position in the file's form.
type Position struct {
	Model  string `json:"model"`
	Pod    string `json:"pod"`
	Rank   int    `json:"rank"`
	Seq    uint64 `json:"seq"`
	Print  uint64 `json:"print"`
	Health string `json:"health"`
}

// FromPositions converts positions to the file's form.
func FromPositions(ps []kvevents.Position) []Position {
	out := make([]Position, len(ps))
	for i, p := range ps {
		out[i] = Position{Model: p.Engine.Model, Pod: p.Engine.Pod, Rank: p.Engine.DPRank,
			Seq: p.Seq, Print: p.Print, Health: p.Health.String()}
	}
	return out
}

// KVPositions converts the header's positions back, refusing an unknown
// health or an out-of-range rank.
func (h *Header) KVPositions() ([]kvevents.Position, error) {
	out := make([]kvevents.Position, 0, len(h.Positions))
	for _, p := range h.Positions {
		health, ok := parseHealth(p.Health)
		if !ok {
			return nil, fmt.Errorf("%w: engine %s/%d: health %q", ErrBadState, p.Pod, p.Rank, p.Health)
		}
		if p.Rank < 0 || p.Rank >= kvevents.MaxDPRank || p.Pod == "" {
			return nil, fmt.Errorf("%w: engine %q rank %d", ErrBadState, p.Pod, p.Rank)
		}
		out = append(out, kvevents.Position{
			Engine: kvevents.EngineID{Model: p.Model, Pod: p.Pod, DPRank: p.Rank},
			Seq:    p.Seq, Print: p.Print, Health: health,
		})
	}
	return out, nil
}

func parseHealth(s string) (kvevents.Health, bool) {
	for h := kvevents.HealthOK; h <= kvevents.HealthDegraded; h++ {
		if h.String() == s {
			return h, true
		}
	}
	return 0, false
}

// Writer writes one state file. Begin it, Write the header and snapshot
// (the part during which the state must hold still), then Commit (the slow
// part: flush, fsync, rename) or Abort.
type Writer struct {
	dir  string
	f    *os.File
	bw   *bufio.Writer
	n    int64
	done bool
}

// Begin creates a temporary file in dir for a new state file.
func Begin(dir string) (*Writer, error) {
	f, err := os.CreateTemp(dir, tempPrefix+"*")
	if err != nil {
		return nil, err
	}
	return &Writer{dir: dir, f: f, bw: bufio.NewWriterSize(f, 1<<20)}, nil
}

// countingWriter counts what passes through.
type countingWriter struct {
	w io.Writer
	n *int64
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	*c.n += int64(n)
	return n, err
}

// Write writes the header, then the index snapshot that snapshot (e.g.
// indexer.Index.Snapshot) streams.
func (w *Writer) Write(h *Header, snapshot func(io.Writer) error) error {
	return Encode(countingWriter{w: w.bw, n: &w.n}, h, snapshot)
}

// Encode writes a state file to w: the header, then the index snapshot
// that snapshot (e.g. indexer.Index.Snapshot) streams. It is the format's
// one writer: Writer puts its output in a file, other stores (an object
// store) elsewhere. ReadHeader reads it back.
func Encode(w io.Writer, h *Header, snapshot func(io.Writer) error) error {
	hj, err := json.Marshal(h)
	if err != nil {
		return err
	}
	if len(hj) > maxHeader {
		return fmt.Errorf("statefile: header of %d bytes exceeds %d", len(hj), maxHeader)
	}
	buf := make([]byte, 0, len(magic)+16+len(hj))
	buf = append(buf, magic...)
	buf = binary.BigEndian.AppendUint32(buf, version)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(hj)))
	buf = append(buf, hj...)
	buf = binary.BigEndian.AppendUint64(buf, xxh3.Hash(hj))
	if _, err := w.Write(buf); err != nil {
		return err
	}
	return snapshot(w)
}

// Size is the bytes written so far.
func (w *Writer) Size() int64 { return w.n }

// Commit makes the written file the state file: flushed, fsynced, renamed
// over the previous one, the directory fsynced.
func (w *Writer) Commit() error {
	if w.done {
		return errors.New("statefile: writer already finished")
	}
	err := w.bw.Flush()
	if err == nil {
		err = w.f.Sync()
	}
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(w.f.Name(), filepath.Join(w.dir, Name))
	}
	if err == nil {
		err = syncDir(w.dir)
	}
	w.done = true
	if err != nil {
		os.Remove(w.f.Name())
	}
	return err
}

// Abort discards the file being written.
func (w *Writer) Abort() {
	if w.done {
		return
	}
	w.done = true
	w.f.Close()
	os.Remove(w.f.Name())
}

// syncDir fsyncs a directory, so that a rename in it survives a crash.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Clean removes temporary files a crashed writer left in dir.
func Clean(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tempPrefix) && e.Type().IsRegular() {
			errs = append(errs, os.Remove(filepath.Join(dir, e.Name())))
		}
	}
	return errors.Join(errs...)
}

// Open opens dir's state file and reads and checks its header; the index
// snapshot follows in the returned reader. A missing file is reported as
// an error satisfying errors.Is(err, fs.ErrNotExist); a refused one wraps
// ErrBadState. The caller closes the returned closer.
func Open(dir string) (*Header, io.Reader, io.Closer, error) {
	f, err := os.Open(filepath.Join(dir, Name))
	if err != nil {
		return nil, nil, nil, err
	}
	br := bufio.NewReaderSize(f, 1<<20)
	h, err := ReadHeader(br)
	if err != nil {
		f.Close()
		return nil, nil, nil, err
	}
	return h, br, f, nil
}

// ReadHeader reads and checks a state file's header from r, leaving r at
// the index snapshot.
func ReadHeader(r io.Reader) (*Header, error) {
	var pre [len(magic) + 8]byte
	if _, err := io.ReadFull(r, pre[:]); err != nil {
		return nil, fmt.Errorf("%w: reading header: %v", ErrBadState, err)
	}
	if string(pre[:len(magic)]) != magic {
		return nil, fmt.Errorf("%w: not a kvindex state file", ErrBadState)
	}
	if v := binary.BigEndian.Uint32(pre[len(magic):]); v != version {
		return nil, fmt.Errorf("%w: version %d, want %d", ErrBadState, v, version)
	}
	n := binary.BigEndian.Uint32(pre[len(magic)+4:])
	if n > maxHeader {
		return nil, fmt.Errorf("%w: header of %d bytes exceeds %d", ErrBadState, n, maxHeader)
	}
	// Read what is there before allocating the claimed size: a short file
	// claiming a huge header costs only its own length.
	hj, err := io.ReadAll(io.LimitReader(r, int64(n)))
	if err != nil || len(hj) != int(n) {
		return nil, fmt.Errorf("%w: header truncated", ErrBadState)
	}
	var sum [8]byte
	if _, err := io.ReadFull(r, sum[:]); err != nil {
		return nil, fmt.Errorf("%w: header checksum truncated", ErrBadState)
	}
	if binary.BigEndian.Uint64(sum[:]) != xxh3.Hash(hj) {
		return nil, fmt.Errorf("%w: header checksum mismatch", ErrBadState)
	}
	var h Header
	if err := json.Unmarshal(hj, &h); err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrBadState, err)
	}
	return &h, nil
}
