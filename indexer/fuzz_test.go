package indexer

import (
	"testing"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/kvevents"
)

// fuzzEvents turns fuzz input into event batches: every field an engine
// controls, valid or not, drawn from small pools so that stores, removals
// and parents meet.
func fuzzEvents(data []byte, h *blockhash.Hasher) [][]kvevents.Event {
	next := func() int {
		if len(data) == 0 {
			return 0
		}
		b := data[0]
		data = data[1:]
		return int(b)
	}
	media := []string{"", "GPU", "CPU", "STORAGE", string(make([]byte, 100))}
	// A few real chains so verification and fallback have something to
	// match.
	wrong := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "x", BlockSize: 2})
	var chains [2][]blockhash.Hash
	toks := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	chains[0], _ = h.Chain(nil, nil, 0, toks, nil)
	chains[1], _ = wrong.Chain(nil, nil, 0, toks, nil)
	var batches [][]kvevents.Event
	for len(data) > 0 && len(batches) < 64 {
		var evs []kvevents.Event
		for range 1 + next()%4 {
			op := next()
			ev := kvevents.Event{Kind: kvevents.Kind(op % 5)}
			c := chains[op>>3&1]
			first := next() % 4
			n := next() % 5
			for i := range n {
				if j := first + i; j < len(c) && op&0x40 == 0 {
					ev.Hashes = append(ev.Hashes, c[j].Key)
				} else {
					ev.Hashes = append(ev.Hashes, uint64(next()%8))
				}
			}
			ev.BlockSize = []int{2, 2, 2, 0, -1, 4, 1 << 30, 3}[next()%8]
			if f := next(); f%3 > 0 {
				nt := n * 2
				if f%3 == 2 {
					nt = next() % 12
				}
				for i := range nt {
					ev.TokenIDs = append(ev.TokenIDs, toks[(first*2+i)%len(toks)])
				}
			}
			if first > 0 && op&0x80 == 0 {
				ev.HasParent, ev.Parent = true, c[first-1].Key
			}
			if f := next(); f%5 == 4 {
				ev.ExtraKeys = make([]blockhash.BlockExtra, next()%5)
			} else if f%5 == 3 {
				ev.LoRAName = "l"
			}
			if f := next(); f%7 == 6 {
				ev.Digests = make([][]byte, next()%5)
				for i := range ev.Digests {
					ev.Digests[i] = make([]byte, next()%40)
				}
				ev.ParentDigest = make([]byte, next()%40)
			}
			ev.Medium = media[next()%len(media)]
			ev.GroupIdx = []int{0, 0, 1, 3, -1, 5000}[next()%6]
			evs = append(evs, ev)
		}
		batches = append(batches, evs)
	}
	return batches
}

// FuzzApply feeds hostile event streams: nothing may panic, the internal
// bookkeeping must stay consistent, and queries must keep answering.
func FuzzApply(f *testing.F) {
	f.Add([]byte{1, 0, 3, 0, 1, 0, 0, 2, 0, 9, 2, 1, 0, 2, 0})
	f.Add([]byte{4, 1, 0, 4, 0, 2, 7, 0, 1, 2, 1, 1, 8, 3, 2, 2, 0, 1, 4, 0, 0, 1, 4})
	f.Add([]byte{9, 1, 1, 3, 0, 1, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13})
	h := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 2})
	f.Fuzz(func(t *testing.T, data []byte) {
		ix := mustNew(t, Options{Hasher: h, VerifyFirst: 3, VerifyEvery: 2, DigestEntries: 4})
		ids := []kvevents.EngineID{eng("a", 0), eng("a", 1), eng("b", 0)}
		for i, evs := range fuzzEvents(data, h) {
			id := ids[i%len(ids)]
			switch i % 11 {
			case 7:
				ix.Reset(id, kvevents.ResetRestart)
			case 9:
				ix.RemoveEngine(id)
			}
			ix.Apply(id, uint64(i), evs)
		}
		checkInvariants(t, ix)
		var res Result
		if err := ix.LongestPrefix(&Query{Model: "m", Tokens: []uint64{1, 2, 3, 4, 5, 6, 7, 8}}, &res); err != nil {
			t.Fatal(err)
		}
		if err := sane(&res, 4); err != nil {
			t.Fatal(err)
		}
		if _, err := ix.Lookup(&Query{Model: "m", BlockHashes: []uint64{0, 1, 2}}); err != nil {
			t.Fatal(err)
		}
	})
}
