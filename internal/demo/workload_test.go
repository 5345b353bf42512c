package demo

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockhash"
)

func testHasher(t testing.TB) *blockhash.Hasher {
	t.Helper()
	h, err := blockhash.New(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: blockhash.DefaultSeed, BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// smallWorkload is a quick workload of the scenario's shape, token counts
// divided by 8.
func smallWorkload(scenario string, seed uint64) WorkloadConfig {
	c := DefaultWorkload(scenario)
	c.Seed, c.Conversations, c.Turns, c.Requests, c.Rate = seed, 6, 6, 150, 8
	for _, p := range []*int{&c.SharedTokens, &c.HistoryMin, &c.HistoryMax, &c.ForkPromptMin, &c.ForkPromptMax,
		&c.HotPrefixTokens, &c.HotSuffixMin, &c.HotSuffixMax} {
		*p /= 8
	}
	return c
}

func estimate(newTokens, output int) time.Duration { return DefaultCost().Service(newTokens, output) }

func plan(t *testing.T, c WorkloadConfig) *Workload {
	t.Helper()
	w, err := Plan(c, testHasher(t), estimate)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestPlanIsDeterministic(t *testing.T) {
	for _, sc := range Scenarios {
		t.Run(sc, func(t *testing.T) {
			a, b := plan(t, smallWorkload(sc, 7)), plan(t, smallWorkload(sc, 7))
			other := plan(t, smallWorkload(sc, 8))
			if len(a.Requests) != len(b.Requests) {
				t.Fatalf("%d vs %d requests", len(a.Requests), len(b.Requests))
			}
			same := true
			for i := range a.Requests {
				ra, rb := &a.Requests[i], &b.Requests[i]
				if ra.Planned != rb.Planned || ra.Conv != rb.Conv || !slices.Equal(ra.Full, rb.Full) || !slices.Equal(ra.Keys, rb.Keys) {
					t.Fatalf("request %d differs between two plans of the same seed", i)
				}
				if i < len(other.Requests) && !slices.Equal(ra.Full, other.Requests[i].Full) {
					same = false
				}
			}
			if same {
				t.Fatal("another seed planned the same tokens")
			}
		})
	}
}

// TestPlanInvariants checks the shape every router relies on: prompts grow
// turn by turn, share the system prompt, hash as the engines hash them, and
// a conversation never has two requests planned at once.
func TestPlanInvariants(t *testing.T) {
	h := testHasher(t)
	for _, sc := range Scenarios {
		t.Run(sc, func(t *testing.T) {
			c := smallWorkload(sc, 3)
			w := plan(t, c)
			if len(w.Requests) != c.Requests {
				t.Fatalf("%d requests, want %d", len(w.Requests), c.Requests)
			}
			shared := w.Requests[0].Prompt[:0]
			var hot int
			for i := range w.Requests {
				r := &w.Requests[i]
				if r.ID != i {
					t.Fatalf("request %d has ID %d", i, r.ID)
				}
				if i > 0 && r.Planned < w.Requests[i-1].Planned {
					t.Fatalf("request %d planned before request %d", i, i-1)
				}
				if len(r.Full) <= len(r.Prompt) || !slices.Equal(r.Full[:len(r.Prompt)], r.Prompt) {
					t.Fatalf("request %d: the prompt is not a proper prefix of prompt+output", i)
				}
				for _, tok := range r.Full {
					if tok >= uint64(c.Vocab) {
						t.Fatalf("request %d: token %d outside the vocabulary", i, tok)
					}
				}
				if r.Hot {
					hot++
					if r.Prev >= 0 || r.Next >= 0 {
						t.Fatalf("hot request %d belongs to a conversation", i)
					}
					continue
				}
				if len(shared) == 0 {
					shared = r.Prompt[:c.SharedTokens]
				}
				if !slices.Equal(r.Prompt[:c.SharedTokens], shared) {
					t.Fatalf("request %d does not start with the shared prefix", i)
				}
				if r.Next >= 0 {
					n := &w.Requests[r.Next]
					if n.Prev != i || n.Conv != r.Conv {
						t.Fatalf("request %d: broken conversation links", i)
					}
					if !slices.Equal(n.Prompt[:len(r.Full)], r.Full) {
						t.Fatalf("request %d: the next turn does not resend the previous prompt and answer", i)
					}
					if done := r.Planned + estimate(0, r.Output()); n.Planned < done {
						t.Fatalf("request %d: next turn planned at %v, before the answer at %v", i, n.Planned, done)
					}
				}
			}
			if sc == ScenarioHotPrefix {
				if f := float64(hot) / float64(len(w.Requests)); math.Abs(f-c.HotShare) > 0.1 {
					t.Fatalf("hot share %.2f, want about %.2f", f, c.HotShare)
				}
			} else if hot > 0 {
				t.Fatalf("%d hot requests outside hot-prefix", hot)
			}
			// Keys are the engines' block hashes of the prompt.
			for _, i := range []int{0, len(w.Requests) / 2, len(w.Requests) - 1} {
				r := &w.Requests[i]
				chain, err := h.Chain(nil, nil, 0, r.Prompt, nil)
				if err != nil {
					t.Fatal(err)
				}
				if len(chain) != len(r.Keys) {
					t.Fatalf("request %d: %d keys, want %d", i, len(r.Keys), len(chain))
				}
				for j := range chain {
					if chain[j].Key != r.Keys[j] {
						t.Fatalf("request %d block %d: key %d, want %d", i, j, r.Keys[j], chain[j].Key)
					}
				}
			}
		})
	}
}

// TestPlanForksShareTheParentContext checks that a forked conversation's
// first prompt starts with another conversation's whole context.
func TestPlanForksShareTheParentContext(t *testing.T) {
	c := smallWorkload(ScenarioAgents, 5)
	c.ForkProb = 1
	w := plan(t, c)
	forks := 0
	for i := range w.Requests {
		r := &w.Requests[i]
		if !r.Fork {
			continue
		}
		forks++
		found := false
		for j := i - 1; j >= 0 && !found; j-- {
			p := &w.Requests[j]
			found = p.Conv != r.Conv && len(p.Full) < len(r.Prompt) && slices.Equal(r.Prompt[:len(p.Full)], p.Full) &&
				(p.Next < 0 || p.Next > i)
		}
		if !found {
			t.Fatalf("fork %d does not start with another conversation's latest context", i)
		}
	}
	if forks == 0 || forks != w.Forks {
		t.Fatalf("%d forks seen, workload counts %d", forks, w.Forks)
	}
}

// TestPickSlotFollowsZipf checks the activity skew: slot i is drawn with
// weight 1/(i+1)^s among idle slots, and busy slots are never drawn.
func TestPickSlotFollowsZipf(t *testing.T) {
	c := smallWorkload(ScenarioAgents, 1)
	c.Conversations = 5
	p := &planner{cfg: c, arrival: newRand(1, streamArrivals), slots: make([]slot, 5), weights: make([]float64, 5)}
	var total float64
	for i := range p.weights {
		p.weights[i] = 1 / math.Pow(float64(i+1), c.ZipfS)
		total += p.weights[i]
	}
	const draws = 20000
	counts := make([]int, 5)
	for range draws {
		now := time.Duration(0)
		counts[p.pickSlot(&now)]++
	}
	for i, n := range counts {
		want := p.weights[i] / total
		if got := float64(n) / draws; math.Abs(got-want) > 0.02 {
			t.Errorf("slot %d drawn %.3f of the time, want %.3f", i, got, want)
		}
	}
	p.slots[0].busyUntil = time.Second
	for range 1000 {
		now := time.Duration(0)
		if p.pickSlot(&now) == 0 {
			t.Fatal("a busy slot was drawn")
		}
	}
	for i := range p.slots {
		p.slots[i].busyUntil = time.Duration(i+2) * time.Second
	}
	now := time.Duration(0)
	if s := p.pickSlot(&now); s != 0 || now != 2*time.Second {
		t.Fatalf("every slot busy: got slot %d at %v, want slot 0 when it frees at 2s", s, now)
	}
}

func TestPlanRejectsBadConfigs(t *testing.T) {
	h := testHasher(t)
	for _, tc := range []struct {
		name string
		mod  func(*WorkloadConfig)
		want string
	}{
		{"scenario", func(c *WorkloadConfig) { c.Scenario = "nope" }, "unknown scenario"},
		{"conversations", func(c *WorkloadConfig) { c.Conversations = 0 }, "conversations"},
		{"turns", func(c *WorkloadConfig) { c.Turns = 0 }, "turns"},
		{"requests", func(c *WorkloadConfig) { c.Requests = 0 }, "requests"},
		{"rate", func(c *WorkloadConfig) { c.Rate = math.NaN() }, "rate"},
		{"history", func(c *WorkloadConfig) { c.HistoryMax = c.HistoryMin - 1 }, "token ranges"},
		{"fork", func(c *WorkloadConfig) { c.ForkProb = 2 }, "probabilities"},
		{"vocab", func(c *WorkloadConfig) { c.Vocab = 1 }, "vocabulary"},
		{"hot", func(c *WorkloadConfig) { c.HotShare, c.HotPrefixTokens = 0.5, 0 }, "hot-prefix"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := smallWorkload(ScenarioAgents, 1)
			tc.mod(&c)
			_, err := Plan(c, h, estimate)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
}

// A Generator draws the requests Plan lists, in the same order, each
// numbered by its turn in its conversation.
func TestGeneratorDrawsThePlan(t *testing.T) {
	for _, sc := range Scenarios {
		t.Run(sc, func(t *testing.T) {
			c := smallWorkload(sc, 4)
			w := plan(t, c)
			c.Requests = 0 // a Generator has no end
			g, err := NewGenerator(c, estimate)
			if err != nil {
				t.Fatal(err)
			}
			for i := range w.Requests {
				want, got := w.Requests[i], g.Next()
				want.Next, want.Keys = -1, nil
				if got.ID != want.ID || got.Conv != want.Conv || got.Turn != want.Turn || got.Prev != want.Prev || got.Next != want.Next ||
					got.Planned != want.Planned || got.Hot != want.Hot || got.Fork != want.Fork ||
					!slices.Equal(got.Prompt, want.Prompt) || !slices.Equal(got.Full, want.Full) || got.Keys != nil {
					t.Fatalf("request %d: the generator and the plan differ", i)
				}
				turn := 0
				if want.Prev >= 0 {
					turn = w.Requests[want.Prev].Turn + 1
				}
				if want.Turn != turn {
					t.Fatalf("request %d is turn %d of its conversation, want %d", i, want.Turn, turn)
				}
			}
		})
	}
	if _, err := NewGenerator(WorkloadConfig{Scenario: ScenarioAgents}, estimate); err == nil || !strings.Contains(err.Error(), "conversations") {
		t.Errorf("a zero configuration: %v", err)
	}
}
