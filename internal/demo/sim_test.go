package demo

import (
	"testing"
	"time"
)

// conversationRequests builds a workload by hand: each spec is a request
// of conversation conv whose prompt is the conversation's context so far
// plus add new tokens, answered with out tokens.
type spec struct {
	conv, add, out int
	planned        time.Duration
}

func handWorkload(t *testing.T, specs []spec) *Workload {
	t.Helper()
	h := testHasher(t)
	w := &Workload{}
	ctx := map[int][]uint64{}
	last := map[int]int{}
	next := uint64(1)
	for i, s := range specs {
		tokens := ctx[s.conv]
		for range s.add {
			tokens = append(tokens, next)
			next++
		}
		n := len(tokens)
		for range s.out {
			tokens = append(tokens, next)
			next++
		}
		ctx[s.conv] = tokens
		r := Request{ID: i, Conv: s.conv, Prev: -1, Next: -1, Planned: s.planned,
			Prompt: tokens[:n:n], Full: tokens[: n+s.out : n+s.out]}
		chain, err := h.Chain(nil, nil, 0, r.Prompt, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range chain {
			r.Keys = append(r.Keys, c.Key)
		}
		if p, ok := last[s.conv]; ok {
			r.Prev = p
			w.Requests[p].Next = i
		}
		last[s.conv] = i
		w.Requests = append(w.Requests, r)
	}
	return w
}

func simulate(t *testing.T, w *Workload, cost CostModel, r router, engines, initial int, fleet []fleetEvent) []outcome {
	t.Helper()
	f, err := newFleet(testHasher(t), engines, 1000, false, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	out, err := newSimulation(w, cost, r, f.engines, initial, fleet).run()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSimulationTimeModel follows three requests on one engine through
// queueing, prefill and decode, with the cache filled at admission and
// completion.
func TestSimulationTimeModel(t *testing.T) {
	cost := CostModel{PrefillPerToken: ms, DecodePerToken: 10 * ms, Overhead: 5 * ms}
	w := handWorkload(t, []spec{
		{conv: 0, add: 64, out: 16},             // r0: cold, 4 blocks
		{conv: 1, add: 32, out: 16},             // r1: another conversation, queued behind r0
		{conv: 0, add: 16, out: 16, planned: 0}, // r2: r0's next turn, sent when r0's answer is back
	})
	out := simulate(t, w, cost, &roundRobin{}, 1, 1, nil)
	for i, want := range []outcome{
		// r0 at 0: TTFT 5+64 = 69ms, busy 69+160 = 229ms; caches 80 tokens.
		{Pod: 0, Arrived: 0, Cached: 0, TTFT: 69 * ms},
		// r1 waits until 229ms: TTFT 229+5+32 = 266ms, busy until 426ms.
		{Pod: 0, Arrived: 0, Cached: 0, TTFT: 266 * ms},
		// r2 arrives at 229ms, starts at 426ms with r0's prompt and answer
		// cached (80 tokens): TTFT 197+5+16 = 218ms.
		{Pod: 0, Arrived: 229 * ms, Cached: 80, TTFT: 218 * ms},
	} {
		if out[i] != want {
			t.Errorf("request %d: got %+v, want %+v", i, out[i], want)
		}
	}
}

// TestSimulationChurn checks the fleet events: a restarted engine has lost
// its cache, and a joining engine receives traffic only after joining.
func TestSimulationChurn(t *testing.T) {
	cost := CostModel{PrefillPerToken: ms, DecodePerToken: ms, Overhead: ms}
	var specs []spec
	for i := range 8 {
		specs = append(specs, spec{conv: 0, add: 32, out: 16, planned: time.Duration(i) * time.Second})
	}
	w := handWorkload(t, specs)
	fleet := []fleetEvent{
		{At: 2500 * ms, Kind: eventRestart, Pod: 0},
		{At: 4500 * ms, Kind: eventJoin, Pod: 1},
	}
	out := simulate(t, w, cost, &roundRobin{}, 2, 1, fleet)
	for i, o := range out {
		planned := w.Requests[i].Planned
		switch {
		case planned < 4500*ms && o.Pod != 0:
			t.Errorf("request %d at %v went to pod %d before it joined", i, planned, o.Pod)
		case i > 0 && i != 3 && planned < 4500*ms && o.Cached != len(w.Requests[i-1].Full):
			t.Errorf("request %d: cached %d, want the previous turn's %d tokens", i, o.Cached, len(w.Requests[i-1].Full))
		case i == 3 && o.Cached != 0:
			t.Errorf("first request after the restart: cached %d, want 0", o.Cached)
		}
	}
	if out[5].Pod != 1 && out[6].Pod != 1 {
		t.Errorf("after the join, round-robin never used the new pod: %+v", out[4:])
	}
	if out[5].Pod == 1 && out[5].Cached != 0 {
		t.Errorf("the new pod served a cached prefix (%d tokens) it never saw", out[5].Cached)
	}
}
