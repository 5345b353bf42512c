package indexer

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/zeebo/xxh3"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/kvevents"
)

// Snapshot format, version 1:
//
//	"KVIXSNAP" | version u32 BE
//	frames: length u32 BE (at most maxFrame) | payload | checksum u64 BE
//	        checksum = XXH3-64 of the payload seeded with the previous
//	        frame's checksum (the first frame's with the version), so a
//	        dropped, repeated or reordered frame fails as well as a flipped
//	        bit; a frame of length 0 ends the stream.
//
// The frames' payloads, concatenated, carry (integers as uvarints unless
// noted; strings and byte strings as uvarint length + bytes):
//
//	models
//	per model: name, block size, media count, media names (id order),
//	  engines count, per engine: pod, rank (varint), last seq, hash check,
//	  flags (1: fallback, 2: entries evicted, EngineInfo.Evicted; a
//	  restored engine's count is 1), message, fallback entries count, per entry: engine
//	  key (u64 BE), digest bytes, sub-key count, sub-keys (u64 BE);
//	  then blocks: holdings count (0 ends the model), key (u64 BE), per
//	  holding: engine number (order above), group, medium id, references.
//
// Restore verifies each frame before parsing it, builds a separate index
// and swaps it in only when the whole stream checked out; reads are
// bounded by maxFrame and by the limits below, so a hostile stream costs
// at most memory proportional to its own size (and, with a memory budget,
// at most twice the budget).
const (
	snapMagic     = "KVIXSNAP"
	snapVersion   = 1
	maxFrame      = 1 << 20
	maxSnapString = 1 << 16
	maxSnapSub    = 1 << 16
)

// An engine's flags in a snapshot.
const (
	snapFallback = 1 << iota
	snapEvicted
)

// ErrBadSnapshot wraps every reason a snapshot stream is refused.
var ErrBadSnapshot = errors.New("indexer: bad snapshot")

// frameWriter cuts the payload into checksummed frames.
type frameWriter struct {
	w   io.Writer
	buf []byte
	sum uint64
	err error
}

// emit writes p as one frame.
func (fw *frameWriter) emit(p []byte) {
	if fw.err != nil {
		return
	}
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(p)))
	fw.sum = xxh3.HashSeed(p, fw.sum)
	var tr [8]byte
	binary.BigEndian.PutUint64(tr[:], fw.sum)
	for _, b := range [][]byte{hdr[:], p, tr[:]} {
		if _, err := fw.w.Write(b); err != nil {
			fw.err = err
			return
		}
	}
}

// write appends payload bytes, emitting full frames.
func (fw *frameWriter) write(b []byte) {
	fw.buf = append(fw.buf, b...)
	for len(fw.buf) >= maxFrame {
		fw.emit(fw.buf[:maxFrame])
		fw.buf = fw.buf[:copy(fw.buf, fw.buf[maxFrame:])]
	}
}

// close emits what is buffered and the end frame.
func (fw *frameWriter) close() error {
	if len(fw.buf) > 0 {
		fw.emit(fw.buf)
	}
	fw.emit(nil)
	return fw.err
}

// enc appends the payload encodings.
type enc struct{ b []byte }

func (e *enc) uvarint(x uint64) { e.b = binary.AppendUvarint(e.b, x) }
func (e *enc) varint(x int64)   { e.b = binary.AppendVarint(e.b, x) }
func (e *enc) u64(x uint64)     { e.b = binary.BigEndian.AppendUint64(e.b, x) }
func (e *enc) bytes(p []byte)   { e.uvarint(uint64(len(p))); e.b = append(e.b, p...) }
func (e *enc) str(s string)     { e.uvarint(uint64(len(s))); e.b = append(e.b, s...) }

// Snapshot writes the index to w in a versioned binary format. Each shard
// is copied under its lock; for a snapshot consistent across shards,
// pause ingest while it runs.
func (ix *Index) Snapshot(w io.Writer) error {
	var hdr [12]byte
	copy(hdr[:], snapMagic)
	binary.BigEndian.PutUint32(hdr[8:], snapVersion)
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	fw := &frameWriter{w: w, sum: snapVersion, buf: make([]byte, 0, 2*maxFrame)}
	models := ix.sortedModels()
	var e enc
	e.uvarint(uint64(len(models)))
	fw.write(e.b)
	for _, ns := range models {
		ns.snapshot(fw, &e)
		if fw.err != nil {
			return fw.err
		}
	}
	return fw.close()
}

func (ix *Index) sortedModels() []*namespace {
	var out []*namespace
	for _, ns := range *ix.models.Load() {
		out = append(out, ns)
	}
	slices.SortFunc(out, func(a, b *namespace) int { return cmp.Compare(a.model, b.model) })
	return out
}

// snapshot writes the namespace. Shards are encoded under their lock and
// written after it is released, so a slow writer never stalls ingest.
func (ns *namespace) snapshot(fw *frameWriter, en *enc) {
	en.b = en.b[:0]
	fw2 := en
	fw2.str(ns.model)
	fw2.uvarint(uint64(ns.blockSize.Load()))
	media := *ns.media.names.Load()
	fw2.uvarint(uint64(len(media)))
	for _, m := range media {
		fw2.str(m)
	}
	et := ns.engines.Load()
	number := make([]int64, len(et.byID)) // engine id -> position in the stream
	var engines []*engine
	for id, e := range et.byID {
		number[id] = -1
		if e != nil {
			number[id] = int64(len(engines))
			engines = append(engines, e)
		}
	}
	fw2.uvarint(uint64(len(engines)))
	for _, e := range engines {
		e.mu.Lock()
		fw2.str(e.eid.Pod)
		fw2.varint(int64(e.eid.DPRank))
		fw2.uvarint(e.lastSeq.Load())
		fw2.uvarint(uint64(e.check.Load()))
		var flags uint64
		if e.fallback.Load() {
			flags |= snapFallback
		}
		if e.evicted.Load() != 0 {
			flags |= snapEvicted
		}
		fw2.uvarint(flags)
		msg := ""
		if m := e.message.Load(); m != nil {
			msg = *m
		}
		fw2.str(msg)
		keys := make([]uint64, 0, len(e.fb))
		for k := range e.fb {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		fw2.uvarint(uint64(len(keys)))
		for _, k := range keys {
			ent := e.fb[k]
			fw2.u64(k)
			fw2.bytes(ent.h.Digest())
			fw2.uvarint(uint64(len(ent.sub)))
			for _, s := range ent.sub {
				fw2.u64(s)
			}
		}
		e.mu.Unlock()
		fw.write(fw2.b)
		fw2.b = fw2.b[:0]
	}
	fw.write(fw2.b)
	fw2.b = fw2.b[:0]
	ns.eachBlock(func(key uint64, hold []uint64) {
		n := 0
		for _, x := range hold {
			if e := hEngine(x); int(e) < len(number) && number[e] >= 0 {
				n++
			}
		}
		if n == 0 {
			return
		}
		fw2.uvarint(uint64(n))
		fw2.u64(key)
		for _, x := range hold {
			e := hEngine(x)
			if int(e) >= len(number) || number[e] < 0 {
				continue
			}
			fw2.uvarint(uint64(number[e]))
			fw2.uvarint(uint64(hGroup(x)))
			fw2.uvarint(uint64(hMedium(x)))
			fw2.uvarint(uint64(hRefs(x)))
		}
	}, func() bool {
		fw.write(fw2.b)
		fw2.b = fw2.b[:0]
		return fw.err == nil
	})
	if fw.err != nil {
		return
	}
	fw2.uvarint(0)
	fw.write(fw2.b)
}

// holdings appends every holding of hs, packed, simple ones included.
func (hs *holderSet) holdings(dst []uint64) []uint64 {
	for j := 0; j < len(hs.s); j += 2 {
		for x := hs.s[j+1]; x != 0; x &= x - 1 {
			dst = append(dst, packHolding(uint32(hs.s[j])<<6|uint32(trailingZeros(x)), 0, mediumGPU, 1))
		}
	}
	return append(dst, hs.d...)
}

// frameReader serves the payload bytes of verified frames.
type frameReader struct {
	r     io.Reader
	frame []byte
	pos   int
	sum   uint64
	ended bool
}

func snapErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrBadSnapshot, fmt.Sprintf(format, a...))
}

func (fr *frameReader) next() error {
	if fr.ended {
		return snapErr("truncated content")
	}
	var hdr [4]byte
	if _, err := io.ReadFull(fr.r, hdr[:]); err != nil {
		return snapErr("reading frame: %v", err)
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > maxFrame {
		return snapErr("frame of %d bytes exceeds %d", n, maxFrame)
	}
	if cap(fr.frame) < int(n) {
		fr.frame = make([]byte, n)
	}
	fr.frame = fr.frame[:n]
	if _, err := io.ReadFull(fr.r, fr.frame); err != nil {
		return snapErr("reading frame: %v", err)
	}
	var tr [8]byte
	if _, err := io.ReadFull(fr.r, tr[:]); err != nil {
		return snapErr("reading checksum: %v", err)
	}
	fr.sum = xxh3.HashSeed(fr.frame, fr.sum)
	if binary.BigEndian.Uint64(tr[:]) != fr.sum {
		return snapErr("checksum mismatch")
	}
	fr.pos = 0
	if n == 0 {
		fr.ended = true
	}
	return nil
}

func (fr *frameReader) ReadByte() (byte, error) {
	for fr.pos == len(fr.frame) {
		if err := fr.next(); err != nil {
			return 0, err
		}
	}
	b := fr.frame[fr.pos]
	fr.pos++
	return b, nil
}

func (fr *frameReader) uvarint() (uint64, error) {
	x, err := binary.ReadUvarint(fr)
	if err != nil && !errors.Is(err, ErrBadSnapshot) {
		err = snapErr("%v", err)
	}
	return x, err
}

func (fr *frameReader) varint() (int64, error) {
	x, err := binary.ReadVarint(fr)
	if err != nil && !errors.Is(err, ErrBadSnapshot) {
		err = snapErr("%v", err)
	}
	return x, err
}

func (fr *frameReader) read(dst []byte) error {
	for i := range dst {
		b, err := fr.ReadByte()
		if err != nil {
			return err
		}
		dst[i] = b
	}
	return nil
}

func (fr *frameReader) u64() (uint64, error) {
	if fr.pos+8 <= len(fr.frame) {
		x := binary.BigEndian.Uint64(fr.frame[fr.pos:])
		fr.pos += 8
		return x, nil
	}
	var b [8]byte
	err := fr.read(b[:])
	return binary.BigEndian.Uint64(b[:]), err
}

func (fr *frameReader) bytes(limit int) ([]byte, error) {
	n, err := fr.uvarint()
	if err != nil {
		return nil, err
	}
	if n > uint64(limit) {
		return nil, snapErr("string of %d bytes exceeds %d", n, limit)
	}
	b := make([]byte, n)
	return b, fr.read(b)
}

func (fr *frameReader) str() (string, error) {
	b, err := fr.bytes(maxSnapString)
	return string(b), err
}

// count reads a count bounded by limit.
func (fr *frameReader) count(what string, limit uint64) (int, error) {
	n, err := fr.uvarint()
	if err == nil && n > limit {
		err = snapErr("%d %s exceeds %d", n, what, limit)
	}
	return int(n), err
}

// Restore replaces the index's content with a snapshot read from r. On any
// error the index is left as it was. Restore must not run concurrently with
// Apply, Reset or RemoveEngine (pause ingest); queries may run throughout.
func (ix *Index) Restore(r io.Reader) error { return ix.RestoreChecked(r, nil) }

// RestoreChecked is Restore with one more test before the index's content
// is replaced: check, if not nil, is called once the whole snapshot has
// been read and checked, and its error leaves the index as it was (an
// authentication code over the snapshot's bytes, which only its end can
// confirm).
func (ix *Index) RestoreChecked(r io.Reader, check func() error) error {
	var hdr [12]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return snapErr("reading header: %v", err)
	}
	if string(hdr[:8]) != snapMagic {
		return snapErr("not a kvindex snapshot")
	}
	if v := binary.BigEndian.Uint32(hdr[8:]); v != snapVersion {
		return snapErr("version %d, want %d", v, snapVersion)
	}
	fr := &frameReader{r: r, sum: snapVersion}
	nm, err := fr.count("models", 1<<16)
	if err != nil {
		return err
	}
	models := make(map[string]*namespace, min(nm, 64))
	var bytes int64
	for range nm {
		ns, err := ix.restoreNamespace(fr, &bytes)
		if err != nil {
			return err
		}
		if models[ns.model] != nil {
			return snapErr("model %q twice", ns.model)
		}
		models[ns.model] = ns
	}
	if !fr.ended {
		// The end frame must follow the content.
		if fr.pos != len(fr.frame) {
			return snapErr("trailing content")
		}
		if err := fr.next(); err != nil {
			return err
		}
		if !fr.ended {
			return snapErr("trailing content")
		}
	}
	if check != nil {
		if err := check(); err != nil {
			return err
		}
	}
	ix.nsMu.Lock()
	ix.models.Store(&models)
	ix.nsMu.Unlock()
	ix.maybeEvict()
	return nil
}

func (ix *Index) restoreNamespace(fr *frameReader, total *int64) (*namespace, error) {
	model, err := fr.str()
	if err != nil {
		return nil, err
	}
	ns := newNamespace(model)
	bs, err := fr.uvarint()
	if err != nil {
		return nil, err
	}
	if bs > blockhash.MaxBlockSize {
		return nil, snapErr("block size %d", bs)
	}
	ns.blockSize.Store(int64(bs))
	nMedia, err := fr.count("media", maxMedia)
	if err != nil {
		return nil, err
	}
	if nMedia < 1 {
		return nil, snapErr("no media")
	}
	for i := range nMedia {
		m, err := fr.str()
		if err != nil {
			return nil, err
		}
		if i == 0 {
			if m != kvevents.MediumGPU {
				return nil, snapErr("medium 0 is %q, want %q", m, kvevents.MediumGPU)
			}
			continue
		}
		if id, ok := ns.media.intern(m); !ok || id != i {
			return nil, snapErr("bad medium %q", m)
		}
	}
	nEng, err := fr.count("engines", maxEngines)
	if err != nil {
		return nil, err
	}
	var engines []*engine
	for range nEng {
		e, err := ix.restoreEngine(fr, ns, total)
		if err != nil {
			return nil, err
		}
		engines = append(engines, e)
	}
	hold := 0
	gen := ix.stored.Load() / ix.genSpan & genMask
	// Blocks arrive shard by shard, each shard's in the order of their
	// home slots (eachBlock). Added one by one to a table that grows, the
	// keys would all land in the front of a table sized for far fewer:
	// one long probe cluster, quadratic time (33 s instead of about 3 for
	// 10M holder-blocks, BenchmarkSnapshot/restore). So a run of blocks of
	// one shard is gathered and the shard sized for it first. A run is
	// bounded, so a stream of any order costs memory only for one run.
	var run restoreRun
	flush := func() error {
		if len(run.keys) == 0 {
			return nil
		}
		sh := &ns.shards[run.shard]
		sh.mu.Lock()
		if sh.used+len(run.keys) > len(sh.data.Load().slots)*maxLoadNum/16 {
			sh.rebuild(len(run.keys), rebuildLoad)
		}
		sh.mu.Unlock()
		hi := 0
		for k, key := range run.keys {
			if h := mixKey(key); ns.shards[run.shard].data.Load().find(key, h) >= 0 {
				return snapErr("block %d twice in model %q", key, model)
			}
			for _, rh := range run.holdings[hi:run.ends[k]] {
				e := engines[rh.engine]
				newHolding, _ := ns.add(e.id, key, int(rh.group), int(rh.medium), rh.refs, gen)
				if !newHolding {
					return snapErr("holding repeated in block %d", key)
				}
				e.holderBlocks.Add(1)
				c, grew := e.tiers.counter(int(rh.medium))
				c.Add(1)
				ns.bytes.Add(grew)
			}
			hi = run.ends[k]
		}
		run.reset()
		return nil
	}
	for {
		n, err := fr.count("holdings", uint64(len(engines))*(maxGroup+1)*maxMedia)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			break
		}
		key, err := fr.u64()
		if err != nil {
			return nil, err
		}
		if si := shardIndex(mixKey(key)); si != run.shard || len(run.keys) >= maxRestoreRun {
			if err := flush(); err != nil {
				return nil, err
			}
			run.shard = si
		}
		for range n {
			var v [4]uint64
			for j := range v {
				if v[j], err = fr.uvarint(); err != nil {
					return nil, err
				}
			}
			switch {
			case v[0] >= uint64(len(engines)):
				return nil, snapErr("engine %d of %d", v[0], len(engines))
			case v[1] > maxGroup:
				return nil, snapErr("group %d", v[1])
			case v[2] >= uint64(nMedia):
				return nil, snapErr("medium %d of %d", v[2], nMedia)
			case v[3] == 0 || v[3] > maxRefs:
				return nil, snapErr("reference count %d", v[3])
			}
			run.holdings = append(run.holdings, restoredHolding{engine: uint32(v[0]), group: uint16(v[1]), medium: uint16(v[2]), refs: uint32(v[3])})
		}
		run.keys = append(run.keys, key)
		run.ends = append(run.ends, len(run.holdings))
		if hold++; hold%4096 == 0 && ix.overBudget(*total+ns.bytes.Load()) {
			return nil, snapErr("content exceeds twice the memory budget")
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	*total += ns.bytes.Load()
	if ix.overBudget(*total) {
		return nil, snapErr("content exceeds twice the memory budget")
	}
	return ns, nil
}

// maxRestoreRun bounds the blocks Restore gathers before adding them.
const maxRestoreRun = 1 << 16

// restoreRun is a run of restored blocks of one shard, not yet added.
type restoreRun struct {
	shard    int
	keys     []uint64
	ends     []int // per key, the end of its holdings
	holdings []restoredHolding
}

type restoredHolding struct {
	engine        uint32
	group, medium uint16
	refs          uint32
}

func (r *restoreRun) reset() {
	r.keys, r.ends, r.holdings = r.keys[:0], r.ends[:0], r.holdings[:0]
}

func (ix *Index) overBudget(b int64) bool {
	return ix.opts.MemoryBudget > 0 && b > 2*ix.opts.MemoryBudget
}

func (ix *Index) restoreEngine(fr *frameReader, ns *namespace, total *int64) (*engine, error) {
	pod, err := fr.str()
	if err != nil {
		return nil, err
	}
	rank, err := fr.varint()
	if err != nil {
		return nil, err
	}
	if rank < 0 || rank > 1<<20 {
		return nil, snapErr("rank %d", rank)
	}
	id := kvevents.EngineID{Model: ns.model, Pod: pod, DPRank: int(rank)}
	if ns.engine(pod, int(rank)) != nil {
		return nil, snapErr("engine %v twice", id)
	}
	e := ns.addEngine(id, func(i uint32) *engine { return newEngine(i, id, ix.digestEntries) })
	if e == nil {
		return nil, snapErr("too many engines")
	}
	var v [3]uint64
	for j := range v {
		if v[j], err = fr.uvarint(); err != nil {
			return nil, err
		}
	}
	if v[1] > uint64(HashMismatch) || v[2]&^(snapFallback|snapEvicted) != 0 {
		return nil, snapErr("engine state %d/%d", v[1], v[2])
	}
	e.lastSeq.Store(v[0])
	e.check.Store(uint32(v[1]))
	e.fallback.Store(v[2]&snapFallback != 0)
	if v[2]&snapEvicted != 0 {
		e.evicted.Store(1)
	}
	msg, err := fr.str()
	if err != nil {
		return nil, err
	}
	if msg != "" {
		e.setMessage(msg)
	}
	nfb, err := fr.count("fallback entries", 1<<40)
	if err != nil {
		return nil, err
	}
	for range nfb {
		k, err := fr.u64()
		if err != nil {
			return nil, err
		}
		dg, err := fr.bytes(32)
		if err != nil {
			return nil, err
		}
		var ent fbEntry
		if ix.hasher == nil {
			return nil, snapErr("fallback keys without a Hasher")
		}
		if ent.h, err = ix.hasher.HashFromDigest(dg); err != nil {
			return nil, snapErr("fallback digest: %v", err)
		}
		ns2, err := fr.count("sub-keys", maxSnapSub)
		if err != nil {
			return nil, err
		}
		for range ns2 {
			s, err := fr.u64()
			if err != nil {
				return nil, err
			}
			ent.sub = append(ent.sub, s)
		}
		if e.fb == nil {
			e.fb = make(map[uint64]fbEntry)
		}
		if _, dup := e.fb[k]; dup {
			return nil, snapErr("fallback key %d twice", k)
		}
		e.fb[k] = ent
		sz := int64(fallbackEntryBytes + 8*len(ent.sub))
		e.extraBytes += sz
		ns.bytes.Add(sz)
		if ix.overBudget(*total + ns.bytes.Load()) {
			return nil, snapErr("content exceeds twice the memory budget")
		}
	}
	return e, nil
}

// Digest returns an order-independent digest of the index content: every
// holding (model, pod, rank, block key, group, medium name, references)
// hashed on its own, the hashes summed lane-wise, the sums and the count
// hashed with SHA-256. Two indexes with the same content have the same
// digest whatever order the events came in, on any replica; an empty index
// has the digest of nothing. Shards are read one at a time, so for an
// exact comparison pause ingest.
func (ix *Index) Digest() [32]byte {
	var lanes [4]uint64
	var count uint64
	var buf [40]byte
	for _, ns := range *ix.models.Load() {
		et := ns.engines.Load()
		engineFP := make([]xxh3.Uint128, len(et.byID))
		for id, e := range et.byID {
			if e == nil {
				continue
			}
			b := binary.AppendUvarint(nil, uint64(len(ns.model)))
			b = append(b, ns.model...)
			b = binary.AppendUvarint(b, uint64(len(e.eid.Pod)))
			b = append(b, e.eid.Pod...)
			b = binary.AppendVarint(b, int64(e.eid.DPRank))
			engineFP[id] = xxh3.Hash128(b)
		}
		media := *ns.media.names.Load()
		mediumFP := make([]uint64, len(media))
		for i, m := range media {
			mediumFP[i] = xxh3.HashString(m)
		}
		ns.eachBlock(func(key uint64, hold []uint64) {
			for _, x := range hold {
				e, m := int(hEngine(x)), hMedium(x)
				if e >= len(engineFP) || et.byID[e] == nil || m >= len(mediumFP) {
					continue
				}
				binary.LittleEndian.PutUint64(buf[0:], engineFP[e].Lo)
				binary.LittleEndian.PutUint64(buf[8:], engineFP[e].Hi)
				binary.LittleEndian.PutUint64(buf[16:], key)
				binary.LittleEndian.PutUint64(buf[24:], uint64(hGroup(x))<<32|uint64(hRefs(x)))
				binary.LittleEndian.PutUint64(buf[32:], mediumFP[m])
				u := xxh3.Hash128(buf[:])
				v := xxh3.Hash128Seed(buf[:], 0x6b76696e646578)
				lanes[0] += u.Lo
				lanes[1] += u.Hi
				lanes[2] += v.Lo
				lanes[3] += v.Hi
				count++
			}
		}, nil)
	}
	var out [40]byte
	for i, l := range lanes {
		binary.BigEndian.PutUint64(out[8*i:], l)
	}
	binary.BigEndian.PutUint64(out[32:], count)
	return sha256.Sum256(out[:])
}

// eachBlock calls fn with every live block's key and holdings (valid only
// during the call), one shard at a time under the shard's lock, so each
// shard is seen consistently. After each shard it calls shardDone, if not
// nil, and stops when that returns false.
func (ns *namespace) eachBlock(fn func(key uint64, hold []uint64), shardDone func() bool) {
	var hs holderSet
	var hold []uint64
	for si := range ns.shards {
		sh := &ns.shards[si]
		sh.mu.Lock()
		d := sh.data.Load()
		for _, s := range d.slots {
			if !isLive(s.val) {
				continue
			}
			hs.decode(d.arena, s.val)
			hold = hs.holdings(hold[:0])
			fn(s.key, hold)
		}
		sh.mu.Unlock()
		if shardDone != nil && !shardDone() {
			return
		}
	}
}
