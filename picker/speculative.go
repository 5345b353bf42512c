package picker

import "time"

// speculative holds, for a short TTL after each pick, the prompt's blocks
// as held by the chosen pod: the engine stores them when it admits the
// request, but its events reach the index only later, and a burst of
// sibling requests (back-to-back turns, an agent's fan-out) would
// otherwise scatter before they do. Entries are a prediction kept beside
// the index, never written into it, and only ever add to a pod's match
// (the larger of the two counts); the short TTL bounds how long a wrong
// guess (the engine evicted the blocks, or never admitted the request)
// can mislead.
//
// Memory is bounded by the blocks recorded: records form a FIFO in pick
// order and the oldest are dropped past the limit, whether expired or
// not.
type speculative struct {
	ttl   time.Duration
	limit int
	held  map[uint64][]hold // block key -> pods holding it
	recs  []record          // FIFO: recs[head:] are live
	head  int
	keys  int // blocks across live records
}

type hold struct {
	pod     string
	expires time.Time
}

type record struct {
	pod     string
	keys    []uint64
	expires time.Time
}

func newSpeculative(ttl time.Duration, limit int) *speculative {
	return &speculative{ttl: ttl, limit: limit, held: map[uint64][]hold{}}
}

// expire drops the records whose TTL has passed by now. Records are in
// pick order, so this stops at the first live one; a caller whose clock
// went backwards only delays expiry, which the size limit still bounds.
func (s *speculative) expire(now time.Time) {
	for s.head < len(s.recs) && !s.recs[s.head].expires.After(now) {
		s.drop()
	}
}

// drop removes the oldest record's holds (unless a later pick refreshed
// them) and the record.
func (s *speculative) drop() {
	r := &s.recs[s.head]
	for _, k := range r.keys {
		hs := s.held[k]
		for i, h := range hs {
			if h.pod == r.pod && h.expires.Equal(r.expires) {
				hs[i] = hs[len(hs)-1]
				hs = hs[:len(hs)-1]
				break
			}
		}
		if len(hs) == 0 {
			delete(s.held, k)
		} else {
			s.held[k] = hs
		}
	}
	s.keys -= len(r.keys)
	*r = record{}
	s.head++
	if s.head == len(s.recs) {
		s.recs, s.head = s.recs[:0], 0
	} else if s.head > 1024 && s.head*2 > len(s.recs) {
		n := copy(s.recs, s.recs[s.head:])
		clear(s.recs[n:])
		s.recs, s.head = s.recs[:n], 0
	}
}

// add records keys as held by pod until now + TTL.
func (s *speculative) add(now time.Time, pod string, keys []uint64) {
	if len(keys) == 0 {
		return
	}
	keys = keys[:min(len(keys), s.limit)]
	for s.keys+len(keys) > s.limit && s.head < len(s.recs) {
		s.drop()
	}
	exp := now.Add(s.ttl)
	for _, k := range keys {
		hs := s.held[k]
		found := false
		for i := range hs {
			if hs[i].pod == pod {
				hs[i].expires = exp
				found = true
				break
			}
		}
		if !found {
			s.held[k] = append(hs, hold{pod: pod, expires: exp})
		}
	}
	s.recs = append(s.recs, record{pod: pod, keys: append([]uint64(nil), keys...), expires: exp})
	s.keys += len(keys)
}

// match sets run[i] to the number of leading keys candidate i holds by
// live speculative entries. index maps a pod name to its candidate
// indices; run must be zeroed by the caller.
func (s *speculative) match(now time.Time, keys []uint64, index map[string]int, run []int) {
	for b, k := range keys {
		advanced := false
		for _, h := range s.held[k] {
			if !h.expires.After(now) {
				continue
			}
			if i, ok := index[h.pod]; ok && run[i] == b {
				run[i] = b + 1
				advanced = true
			}
		}
		if !advanced {
			return
		}
	}
}
