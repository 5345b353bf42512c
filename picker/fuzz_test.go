package picker_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvindex/kvindex/picker"
)

// FuzzPick feeds the scorer arbitrary candidates and requests, twice in a
// row (so speculative entries and sessions are consulted): it must never
// panic, and must pick one of the eligible candidates or say why not.
func FuzzPick(f *testing.F) {
	f.Add(uint64(1), uint8(3), uint8(8), 0, 0, 0.5, int64(0), uint8(0), "s", false)
	f.Add(uint64(2), uint8(0), uint8(0), -5, 1<<40, math.NaN(), int64(-1), uint8(9), "", true)
	f.Add(uint64(3), uint8(64), uint8(255), 1<<62, -1, math.Inf(1), int64(math.MaxInt64), uint8(1), "x", true)
	f.Fuzz(func(t *testing.T, seed uint64, n, nkeys uint8, inFlight, blocks int, kv float64, ageMs int64, health uint8, session string, subset bool) {
		s, err := picker.New(picker.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(seed, 1))
		var cands []picker.Candidate
		for i := range int(n) {
			name := string(rune('a' + r.IntN(8))) // duplicates on purpose
			if r.IntN(16) == 0 {
				name = ""
			}
			cands = append(cands, picker.Candidate{
				Pod:                 name,
				Endpoint:            name + ":1",
				InFlight:            inFlight + i,
				InFlightInteractive: r.IntN(3) - 1,
				Metrics: picker.Metrics{
					Waiting:   blocks - i,
					KVUsage:   kv,
					ScrapedAt: t0.Add(-time.Duration(ageMs) * time.Millisecond),
				},
				Prefix: picker.Prefix{GPU: blocks, CPU: r.IntN(5) - 2, Disk: int(nkeys) - i, Health: picker.Health(health)},
			})
		}
		req := picker.Request{
			Keys:     make([]uint64, nkeys),
			Tokens:   blocks,
			Session:  session,
			Priority: picker.Priority(health % 3),
		}
		for i := range req.Keys {
			req.Keys[i] = uint64(r.IntN(4))
		}
		if subset {
			req.Subset = []string{"a:1", "c", "zz"}
		}
		for round := range 2 {
			d, err := s.Pick(t0.Add(time.Duration(round)*time.Second), &req, cands)
			if err != nil {
				if !errors.Is(err, picker.ErrNoCandidates) && !slices.ContainsFunc(cands, func(c picker.Candidate) bool { return c.Pod == "" }) {
					t.Fatalf("unexpected error %v", err)
				}
				continue
			}
			i := slices.IndexFunc(cands, func(c picker.Candidate) bool { return c.Pod == d.Pod && c.Endpoint == d.Endpoint })
			if i < 0 {
				t.Fatalf("picked %s at %s, not a candidate", d.Pod, d.Endpoint)
			}
			if subset && !slices.Contains(req.Subset, d.Endpoint) && !slices.Contains(req.Subset, d.Pod) {
				t.Fatalf("picked %s outside the subset %v", d.Pod, req.Subset)
			}
			if len(d.Scores) == 0 || d.Scores[0].Pod != d.Pod {
				t.Fatalf("scores do not start with the pick: %+v", d.Scores)
			}
			for _, sc := range d.Scores {
				if math.IsNaN(sc.Total) || sc.Prefix < 0 || sc.Prefix > 1 || sc.MatchedTokens < 0 {
					t.Fatalf("score out of range: %+v", sc)
				}
			}
		}
	})
}
