package indexer

import (
	"math/bits"
	"slices"
	"sync/atomic"
)

// holderSet is the decoded holders of one block, for writers and Lookup.
type holderSet struct {
	s []uint64 // flattened (word index, bits) pairs of simple holdings, sorted, no zero words
	d []uint64 // packed holdings that are not simple, unsorted
}

func (hs *holderSet) reset() { hs.s, hs.d = hs.s[:0], hs.d[:0] }

// decode loads the holders of slot value v. Writers call it under mu;
// readers with atomic=true inside a seq section, and must check ok.
func (hs *holderSet) decode(arena []uint64, v uint64) (ok bool) {
	hs.reset()
	switch valKind(v) {
	case kindInline:
		for f := 0; f < 3; f++ {
			if id := uint32(v >> (16 * f) & 0xffff); id != 0 {
				hs.setBit(id - 1)
			}
		}
		return true
	case kindRecord:
		off := int(uint32(v))
		if off >= len(arena) {
			return false
		}
		hdr := atomic.LoadUint64(&arena[off])
		np, nd := int(hdr&0xffff), int(hdr>>16&0xffff)
		end := off + 1 + 2*np + nd
		if end > len(arena) || end < off {
			return false
		}
		for i := off + 1; i < off+1+2*np; i++ {
			hs.s = append(hs.s, atomic.LoadUint64(&arena[i]))
		}
		for i := off + 1 + 2*np; i < end; i++ {
			hs.d = append(hs.d, atomic.LoadUint64(&arena[i]))
		}
		return true
	}
	return false
}

func (hs *holderSet) pairIndex(w uint64) (int, bool) {
	for i := 0; i < len(hs.s); i += 2 {
		if hs.s[i] == w {
			return i, true
		}
		if hs.s[i] > w {
			return i, false
		}
	}
	return len(hs.s), false
}

func (hs *holderSet) hasBit(e uint32) bool {
	i, ok := hs.pairIndex(uint64(e >> 6))
	return ok && hs.s[i+1]&(1<<(e&63)) != 0
}

func (hs *holderSet) setBit(e uint32) {
	w := uint64(e >> 6)
	i, ok := hs.pairIndex(w)
	if !ok {
		hs.s = slices.Insert(hs.s, i, w, 0)
	}
	hs.s[i+1] |= 1 << (e & 63)
}

func (hs *holderSet) clearBit(e uint32) bool {
	i, ok := hs.pairIndex(uint64(e >> 6))
	if !ok || hs.s[i+1]&(1<<(e&63)) == 0 {
		return false
	}
	hs.s[i+1] &^= 1 << (e & 63)
	if hs.s[i+1] == 0 {
		hs.s = slices.Delete(hs.s, i, i+2)
	}
	return true
}

func (hs *holderSet) findD(e uint32, g, m int) int {
	want := packHolding(e, g, m, 0)
	for i, x := range hs.d {
		if hSlot(x) == want {
			return i
		}
	}
	return -1
}

// hasEngine reports whether e holds the block in any group or medium.
func (hs *holderSet) hasEngine(e uint32) bool {
	if hs.hasBit(e) {
		return true
	}
	for _, x := range hs.d {
		if hEngine(x) == e {
			return true
		}
	}
	return false
}

func (hs *holderSet) empty() bool { return len(hs.s) == 0 && len(hs.d) == 0 }

// count returns the number of holdings.
func (hs *holderSet) count() int {
	n := len(hs.d)
	for i := 1; i < len(hs.s); i += 2 {
		n += bits.OnesCount64(hs.s[i])
	}
	return n
}

// add adds refs references of (e, g, m). newHolding: the holding did not
// exist; newAssoc: e held nothing in this block before. saturated: the
// reference count hit maxRefs.
func (hs *holderSet) add(e uint32, g, m int, refs uint32) (newHolding, newAssoc, saturated bool) {
	simple := g == 0 && m == mediumGPU
	if simple && hs.hasBit(e) {
		// One reference becomes several: the holding moves to detail.
		hs.clearBit(e)
		r := 1 + refs
		if r > maxRefs {
			r, saturated = maxRefs, true
		}
		hs.d = append(hs.d, packHolding(e, g, m, r))
		return false, false, saturated
	}
	if i := hs.findD(e, g, m); i >= 0 {
		r := hRefs(hs.d[i]) + refs
		if r > maxRefs {
			r, saturated = maxRefs, true
		}
		hs.d[i] = hSlot(hs.d[i]) | uint64(r)
		return false, false, saturated
	}
	newAssoc = !hs.hasEngine(e)
	if simple && refs == 1 {
		hs.setBit(e)
	} else {
		if refs > maxRefs {
			refs, saturated = maxRefs, true
		}
		hs.d = append(hs.d, packHolding(e, g, m, refs))
	}
	return true, newAssoc, saturated
}

// remove drops one reference of (e, g, m). removed: the holding is gone;
// assocGone: e holds nothing in this block any more; found: there was
// such a holding.
func (hs *holderSet) remove(e uint32, g, m int) (found, removed, assocGone bool) {
	if g == 0 && m == mediumGPU && hs.clearBit(e) {
		return true, true, !hs.hasEngine(e)
	}
	i := hs.findD(e, g, m)
	if i < 0 {
		return false, false, false
	}
	r := hRefs(hs.d[i]) - 1
	if r == 0 {
		hs.d = slices.Delete(hs.d, i, i+1)
		return true, true, !hs.hasEngine(e)
	}
	if r == 1 && g == 0 && m == mediumGPU {
		// Back to the canonical simple form.
		hs.d = slices.Delete(hs.d, i, i+1)
		hs.setBit(e)
		return true, false, false
	}
	hs.d[i] = hSlot(hs.d[i]) | uint64(r)
	return true, false, false
}

// removeEngine drops every holding of e and returns how many there were,
// counting them by medium in gone (as negative changes).
func (hs *holderSet) removeEngine(e uint32, gone *tierDelta) int {
	n := 0
	if hs.clearBit(e) {
		n++
		gone.add(mediumGPU, -1)
	}
	j := 0
	for _, x := range hs.d {
		if hEngine(x) == e {
			n++
			gone.add(hMedium(x), -1)
			continue
		}
		hs.d[j] = x
		j++
	}
	hs.d = hs.d[:j]
	return n
}

// engines calls f once per distinct engine holding the block.
func (hs *holderSet) engines(f func(e uint32)) {
	for i := 0; i < len(hs.s); i += 2 {
		w := hs.s[i+1]
		for w != 0 {
			b := bits.TrailingZeros64(w)
			w &= w - 1
			f(uint32(hs.s[i])<<6 | uint32(b))
		}
	}
	for i, x := range hs.d {
		e := hEngine(x)
		if hs.hasBit(e) {
			continue
		}
		dup := false
		for _, y := range hs.d[:i] {
			if hEngine(y) == e {
				dup = true
				break
			}
		}
		if !dup {
			f(e)
		}
	}
}

// inline returns the inline payload for hs if it has at most three simple
// holdings of small engine ids and nothing else.
func (hs *holderSet) inline() (uint64, bool) {
	if len(hs.d) != 0 || len(hs.s) > 6 {
		return 0, false
	}
	var v uint64
	f := 0
	for i := 0; i < len(hs.s); i += 2 {
		w := hs.s[i+1]
		for w != 0 {
			b := bits.TrailingZeros64(w)
			w &= w - 1
			id := uint32(hs.s[i])<<6 | uint32(b)
			if f == 3 || id > maxInlineID {
				return 0, false
			}
			v |= uint64(id+1) << (16 * f)
			f++
		}
	}
	return v, true
}

func (hs *holderSet) recordWords() int { return 1 + len(hs.s) + len(hs.d) }

// recordFits reports whether hs can be stored as a record at all.
func (hs *holderSet) recordFits() bool {
	return len(hs.s)/2 <= maxRecPairs && len(hs.d) <= maxRecD && classFor(hs.recordWords()) <= maxClass
}
