package picker_test

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/picker"
)

var t0 = time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)

// keys returns n block keys of one prompt.
func keys(n int) []uint64 {
	k := make([]uint64, n)
	for i := range k {
		k[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
	}
	return k
}

// pod is a candidate named name at name:8000 with inFlight requests and
// gpu matched blocks.
func pod(name string, inFlight, gpu int) picker.Candidate {
	return picker.Candidate{Pod: name, Endpoint: name + ":8000", InFlight: inFlight, Prefix: picker.Prefix{GPU: gpu}}
}

// step is one Pick of a scenario.
type step struct {
	at    time.Duration // after t0
	req   picker.Request
	cands []picker.Candidate
	want  string         // the pod picked; "" accepts any candidate
	notIn []string       // pods that must not be picked
	match map[string]int // pod -> expected Score.MatchedTokens
}

func TestPick(t *testing.T) {
	prompt := keys(64) // 1,024 tokens
	noLoad := func(c *picker.Config) { c.Weights.Load = 0 }
	tests := []struct {
		name  string
		cfg   func(*picker.Config)
		steps []step
	}{
		{
			name: "turn 2 goes to the holder of turn 1",
			steps: []step{{
				req:   picker.Request{Keys: prompt},
				cands: []picker.Candidate{pod("a", 0, 2), pod("b", 0, 60), pod("c", 0, 0)},
				want:  "b",
			}},
		},
		{
			name: "an overloaded holder yields to a cooler pod",
			steps: []step{{
				req:   picker.Request{Keys: prompt},
				cands: []picker.Candidate{pod("a", 0, 2), pod("b", 3, 64), pod("c", 1, 0)},
				want:  "a",
			}},
		},
		{
			name: "the engine's fresh waiting count overloads a holder the picker thinks idle",
			steps: []step{{
				req: picker.Request{Keys: prompt},
				cands: []picker.Candidate{pod("a", 0, 0), func() picker.Candidate {
					c := pod("b", 0, 64)
					c.Metrics = picker.Metrics{Waiting: 6, ScrapedAt: t0.Add(-time.Second)}
					return c
				}()},
				want: "a",
			}},
		},
		{
			name: "stale metrics are ignored",
			steps: []step{{
				req: picker.Request{Keys: prompt},
				cands: []picker.Candidate{pod("a", 0, 0), func() picker.Candidate {
					c := pod("b", 0, 64)
					c.Metrics = picker.Metrics{Waiting: 6, KVUsage: 1, ScrapedAt: t0.Add(-time.Minute)}
					return c
				}()},
				want: "b",
			}},
		},
		{
			name: "a full KV cache counts as requests ahead",
			steps: []step{{
				req: picker.Request{Keys: prompt},
				cands: []picker.Candidate{pod("a", 0, 32), func() picker.Candidate {
					c := pod("b", 0, 64)
					c.Metrics = picker.Metrics{KVUsage: 1, ScrapedAt: t0}
					return c
				}()},
				want: "a",
			}},
		},
		{
			name: "a session sticks to its last pod when nothing else tells pods apart",
			cfg:  func(c *picker.Config) { c.SpeculativeTTL = 0 },
			steps: []step{
				{req: picker.Request{Session: "s1"}, cands: []picker.Candidate{pod("a", 1, 0), pod("b", 0, 0), pod("c", 1, 0)}, want: "b"},
				{at: time.Second, req: picker.Request{Session: "s1"}, cands: []picker.Candidate{pod("a", 0, 0), pod("b", 0, 0), pod("c", 0, 0)}, want: "b"},
				{at: 2 * time.Second, req: picker.Request{Session: "s1"}, cands: []picker.Candidate{pod("a", 0, 0), pod("b", 0, 0), pod("c", 0, 0)}, want: "b"},
			},
		},
		{
			name: "an overloaded session pod releases the session",
			cfg:  func(c *picker.Config) { c.SpeculativeTTL = 0; c.Weights.Load = 0 },
			steps: []step{
				{req: picker.Request{Session: "s1"}, cands: []picker.Candidate{pod("b", 0, 0)}, want: "b"},
				// a's one matched block does not outweigh the session...
				{at: time.Second, req: picker.Request{Session: "s1", Keys: prompt}, cands: []picker.Candidate{pod("a", 0, 1), pod("b", 3, 0)}, want: "b"},
				// ...until b is overloaded
				{at: 2 * time.Second, req: picker.Request{Session: "s1", Keys: prompt}, cands: []picker.Candidate{pod("a", 0, 1), pod("b", 4, 0)}, want: "a"},
			},
		},
		{
			name: "a saturated holder keeps a hot prefix without the guard",
			cfg:  func(c *picker.Config) { noLoad(c); c.Weights.Hot = 0 },
			steps: []step{{
				req:   picker.Request{Keys: prompt},
				cands: []picker.Candidate{pod("a", 9, 64), pod("b", 0, 0), pod("c", 0, 0)},
				want:  "a",
			}},
		},
		{
			name: "the hot-prefix guard spills from saturated holders to cooler pods",
			cfg:  noLoad,
			steps: []step{{
				req:   picker.Request{Keys: prompt},
				cands: []picker.Candidate{pod("a", 4, 64), pod("b", 5, 40), pod("c", 3, 0), pod("d", 4, 0)},
				want:  "c",
			}},
		},
		{
			name: "the guard leaves a hot prefix alone while a holder has room",
			cfg:  noLoad,
			steps: []step{{
				req:   picker.Request{Keys: prompt},
				cands: []picker.Candidate{pod("a", 4, 64), pod("b", 3, 40), pod("c", 0, 0)},
				want:  "a",
			}},
		},
		{
			name: "a background turn avoids a pod busy with interactive turns when the prefix loss is small",
			steps: []step{{
				req: picker.Request{Keys: prompt, Priority: picker.Background},
				cands: []picker.Candidate{func() picker.Candidate {
					c := pod("a", 1, 60)
					c.InFlightInteractive = 1
					return c
				}(), pod("b", 1, 58)},
				want: "b",
			}},
		},
		{
			name: "an interactive turn is not steered",
			steps: []step{{
				req: picker.Request{Keys: prompt},
				cands: []picker.Candidate{func() picker.Candidate {
					c := pod("a", 1, 60)
					c.InFlightInteractive = 1
					return c
				}(), pod("b", 1, 58)},
				want: "a",
			}},
		},
		{
			name: "a background turn keeps a much larger prefix",
			steps: []step{{
				req: picker.Request{Keys: prompt, Priority: picker.Background},
				cands: []picker.Candidate{func() picker.Candidate {
					c := pod("a", 1, 60)
					c.InFlightInteractive = 1
					return c
				}(), pod("b", 1, 30)},
				want: "a",
			}},
		},
		{
			name: "speculative entries hold the pick's blocks until they expire",
			steps: []step{
				{req: picker.Request{Keys: prompt}, cands: []picker.Candidate{pod("a", 0, 0), pod("b", 1, 0), pod("c", 1, 0)}, want: "a"},
				{
					at:  time.Second,
					req: picker.Request{Keys: prompt}, cands: []picker.Candidate{pod("a", 0, 0), pod("b", 0, 0), pod("c", 0, 0)},
					want: "a", match: map[string]int{"a": 1024, "b": 0, "c": 0},
				},
				{
					// refreshed at 1 s, so held until 3 s
					at:  2500 * time.Millisecond,
					req: picker.Request{Keys: prompt[:32]}, cands: []picker.Candidate{pod("a", 1, 0), pod("b", 0, 0)},
					want: "a", match: map[string]int{"a": 512, "b": 0},
				},
				{
					at:  4500 * time.Millisecond,
					req: picker.Request{Keys: prompt}, cands: []picker.Candidate{pod("a", 0, 0), pod("b", 0, 0)},
					match: map[string]int{"a": 0, "b": 0},
				},
			},
		},
		{
			name: "speculative entries count only the leading blocks held",
			steps: []step{
				{req: picker.Request{Keys: prompt[:16]}, cands: []picker.Candidate{pod("a", 0, 0), pod("b", 1, 0)}, want: "a"},
				{at: time.Millisecond, req: picker.Request{Keys: prompt}, cands: []picker.Candidate{pod("a", 0, 0), pod("b", 0, 0)}, want: "a", match: map[string]int{"a": 256}},
			},
		},
		{
			name: "the subset hint is honoured, by endpoint or pod",
			steps: []step{
				{
					req:   picker.Request{Keys: prompt, Subset: []string{"a:8000", "c:8000"}},
					cands: []picker.Candidate{pod("a", 0, 0), pod("b", 0, 64), pod("c", 0, 32)},
					want:  "c",
				},
				{
					req:   picker.Request{Keys: prompt, Subset: []string{"a"}},
					cands: []picker.Candidate{pod("a", 3, 0), pod("b", 0, 64), pod("c", 0, 32)},
					want:  "a",
				},
			},
		},
		{
			name: "a degraded engine's match is discounted",
			steps: []step{{
				req: picker.Request{Keys: prompt},
				cands: []picker.Candidate{pod("a", 0, 40), func() picker.Candidate {
					c := pod("b", 0, 64)
					c.Prefix.Health = picker.HealthDegraded
					return c
				}()},
				want: "a", match: map[string]int{"a": 640, "b": 1024},
			}},
		},
		{
			name: "blocks in CPU memory count less than on the GPU",
			steps: []step{{
				req:   picker.Request{Keys: prompt},
				cands: []picker.Candidate{pod("a", 0, 41), {Pod: "b", Endpoint: "b:8000", Prefix: picker.Prefix{GPU: 16, CPU: 48}}},
				want:  "a",
			}},
		},
		{
			name: "the matched fraction is over the prompt's tokens, partial last block included",
			steps: []step{{
				req:   picker.Request{Keys: prompt[:4], Tokens: 72},
				cands: []picker.Candidate{pod("a", 0, 4)},
				want:  "a", match: map[string]int{"a": 64},
			}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := picker.DefaultConfig()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			s, err := picker.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			for i, st := range tt.steps {
				d, err := s.Pick(t0.Add(st.at), &st.req, st.cands)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if st.want != "" && d.Pod != st.want {
					t.Errorf("step %d: picked %s, want %s; scores %+v", i, d.Pod, st.want, d.Scores)
				}
				if slices.Contains(st.notIn, d.Pod) {
					t.Errorf("step %d: picked %s, which it must not; scores %+v", i, d.Pod, d.Scores)
				}
				if d.Endpoint != d.Pod+":8000" {
					t.Errorf("step %d: endpoint %q for pod %s", i, d.Endpoint, d.Pod)
				}
				if len(d.Scores) == 0 || d.Scores[0].Pod != d.Pod {
					t.Errorf("step %d: scores do not start with the pick: %+v", i, d.Scores)
				}
				for p, want := range st.match {
					i := slices.IndexFunc(d.Scores, func(s picker.Score) bool { return s.Pod == p })
					if i < 0 {
						t.Errorf("step %d: no score for %s", i, p)
					} else if got := d.Scores[i].MatchedTokens; got != want {
						t.Errorf("step %d: %s matched %d tokens, want %d", i, p, got, want)
					}
				}
			}
		})
	}
}

func TestPickScoresBestFirst(t *testing.T) {
	s, err := picker.New(picker.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	req := picker.Request{Keys: keys(10)}
	d, err := s.Pick(t0, &req, []picker.Candidate{pod("a", 2, 0), pod("b", 0, 5), pod("c", 0, 10), pod("d", 1, 0)})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, sc := range d.Scores {
		got = append(got, sc.Pod)
	}
	if want := []string{"c", "b", "d", "a"}; !slices.Equal(got, want) {
		t.Errorf("order %v, want %v (%+v)", got, want, d.Scores)
	}
	c := d.Scores[0]
	if want := 0.7*1 + 0.3*1; c.Prefix != 1 || c.Load != 1 || c.Total != want {
		t.Errorf("c scored %+v, want prefix 1, load 1, total %g", c, want)
	}
}

func TestPickErrors(t *testing.T) {
	tests := []struct {
		name    string
		req     picker.Request
		cands   []picker.Candidate
		noCands bool
		msg     string
	}{
		{name: "no candidates", noCands: true, msg: "no candidates"},
		{name: "none in the subset", req: picker.Request{Subset: []string{"x:1"}}, cands: []picker.Candidate{pod("a", 0, 0)}, noCands: true, msg: "subset hint"},
		{name: "a candidate without a pod name", cands: []picker.Candidate{pod("a", 0, 0), {Endpoint: "b:1"}}, msg: `candidate 1 (endpoint "b:1") has no pod name`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := picker.New(picker.DefaultConfig())
			if err != nil {
				t.Fatal(err)
			}
			_, err = s.Pick(t0, &tt.req, tt.cands)
			if err == nil {
				t.Fatal("no error")
			}
			if errors.Is(err, picker.ErrNoCandidates) != tt.noCands {
				t.Errorf("errors.Is(%v, ErrNoCandidates) = %v, want %v", err, !tt.noCands, tt.noCands)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q lacks %q", err, tt.msg)
			}
		})
	}
}

// TestPickDeterministic: the same seed and inputs give the same picks,
// and ties do not all go to one pod.
func TestPickDeterministic(t *testing.T) {
	run := func(seed uint64) []string {
		cfg := picker.DefaultConfig()
		cfg.Seed = seed
		s, err := picker.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		var picks []string
		for i := range 40 {
			req := picker.Request{Keys: []uint64{uint64(i)}}
			d, err := s.Pick(t0, &req, []picker.Candidate{pod("a", 0, 0), pod("b", 0, 0), pod("c", 0, 0)})
			if err != nil {
				t.Fatal(err)
			}
			picks = append(picks, d.Pod)
		}
		return picks
	}
	a, b := run(7), run(7)
	if !slices.Equal(a, b) {
		t.Errorf("seed 7 gave %v, then %v", a, b)
	}
	if c := slices.Compact(slices.Sorted(slices.Values(a))); len(c) != 3 {
		t.Errorf("ties went to %v only", c)
	}
}

// TestPickReplicasAgree: two scorers with the same seed, given the same
// request and the same candidates, make the same decision, scores and
// their order included, although one has made other picks before and
// gets the candidates in another order (replicas of the picker in front
// of one index state). Each request ties several pods; a scorer with
// another seed parts from them on some.
func TestPickReplicasAgree(t *testing.T) {
	newScorer := func(seed uint64) *picker.Scorer {
		cfg := picker.DefaultConfig()
		cfg.Seed = seed
		s, err := picker.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	cands := []picker.Candidate{pod("a", 1, 0), pod("b", 1, 0), pod("c", 1, 0), pod("d", 3, 0), pod("e", 1, 0)}
	reversed := slices.Clone(cands)
	slices.Reverse(reversed)

	tests := []struct {
		name string
		req  picker.Request
	}{
		{"keys", picker.Request{Keys: keys(8)[6:]}},
		{"other keys", picker.Request{Keys: keys(16)[12:], Tokens: 70}},
		{"session only", picker.Request{Session: "conv-1", Tokens: 100}},
		{"tie-break hash only", picker.Request{TieBreak: 0xfeed, Tokens: 100}},
		{"another tie-break hash", picker.Request{TieBreak: 0xbeef, Tokens: 100}},
		{"nothing", picker.Request{Model: "m"}},
	}
	replicaA, replicaB, otherSeed := newScorer(3), newScorer(3), newScorer(4)
	// Replica A has routed other requests, ties among them.
	for i := range 25 {
		if _, err := replicaA.Pick(t0, &picker.Request{Keys: []uint64{uint64(1000 + i)}}, cands); err != nil {
			t.Fatal(err)
		}
	}
	parted := 0
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reqA, reqB, reqC := tc.req, tc.req, tc.req
			a, err := replicaA.Pick(t0, &reqA, cands)
			if err != nil {
				t.Fatal(err)
			}
			b, err := replicaB.Pick(t0, &reqB, reversed)
			if err != nil {
				t.Fatal(err)
			}
			if a.Pod != b.Pod || a.Endpoint != b.Endpoint || !slices.Equal(a.Scores, b.Scores) {
				t.Errorf("replicas disagree:\n%+v\n%+v", a, b)
			}
			if a.Scores[0].Total != a.Scores[1].Total {
				t.Fatalf("no tie to break: %+v", a.Scores)
			}
			c, err := otherSeed.Pick(t0, &reqC, cands)
			if err != nil {
				t.Fatal(err)
			}
			if c.Pod != a.Pod {
				parted++
			}
		})
	}
	if parted == 0 {
		t.Errorf("seeds 3 and 4 broke every tie the same way: the seed is not used")
	}
}

func TestSpeculativeBounded(t *testing.T) {
	cfg := picker.DefaultConfig()
	cfg.SpeculativeBlocks = 100
	s, err := picker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cands := []picker.Candidate{pod("a", 0, 0), pod("b", 1, 0)}
	first := picker.Request{Keys: keys(64)}
	if d, err := s.Pick(t0, &first, cands); err != nil || d.Pod != "a" {
		t.Fatalf("first pick %v, %v", d.Pod, err)
	}
	// 64 other blocks push the first prompt's record out, long before its
	// TTL.
	other := picker.Request{Keys: keys(128)[64:]}
	if _, err := s.Pick(t0, &other, cands); err != nil {
		t.Fatal(err)
	}
	d, err := s.Pick(t0, &first, []picker.Candidate{pod("a", 0, 0), pod("b", 0, 0)})
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range d.Scores {
		if sc.MatchedTokens != 0 {
			t.Errorf("%s still matches %d tokens of a dropped record", sc.Pod, sc.MatchedTokens)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(*picker.Config)
		msg  string // "" means valid
	}{
		{name: "defaults", edit: func(*picker.Config) {}},
		{name: "negative weight", edit: func(c *picker.Config) { c.Weights.Load = -1 }, msg: "weights.load must be >= 0"},
		{name: "all weights zero", edit: func(c *picker.Config) { c.Weights = picker.Weights{} }, msg: "every weight is 0"},
		{name: "zero block size", edit: func(c *picker.Config) { c.BlockSize = 0 }, msg: "block_size"},
		{name: "zero load scale", edit: func(c *picker.Config) { c.LoadScale = 0 }, msg: "load_scale must be > 0"},
		{name: "tier above 1", edit: func(c *picker.Config) { c.Tiers.CPU = 2 }, msg: "tiers.cpu"},
		{name: "full kv threshold with a penalty", edit: func(c *picker.Config) { c.KVThreshold = 1 }, msg: "kv_threshold must be < 1"},
		{name: "no sessions", edit: func(c *picker.Config) { c.Sessions = 0 }, msg: "sessions"},
		{name: "speculation off", edit: func(c *picker.Config) { c.SpeculativeTTL = 0 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := picker.DefaultConfig()
			tt.edit(&cfg)
			_, err := picker.New(cfg)
			switch {
			case tt.msg == "" && err != nil:
				t.Errorf("unexpected error %v", err)
			case tt.msg != "" && (err == nil || !strings.Contains(err.Error(), tt.msg) || !errors.Is(err, picker.ErrConfig)):
				t.Errorf("error %v, want one matching ErrConfig with %q", err, tt.msg)
			}
		})
	}
}

func TestParseHealth(t *testing.T) {
	for _, h := range []picker.Health{picker.HealthOK, picker.HealthRestored, picker.HealthUnconfirmed, picker.HealthDegraded, picker.HealthDisconnected, picker.HealthUnknown} {
		got, err := picker.ParseHealth(h.String())
		if err != nil || got != h {
			t.Errorf("ParseHealth(%q) = %v, %v", h.String(), got, err)
		}
	}
	if _, err := picker.ParseHealth("OK!"); err == nil {
		t.Error("ParseHealth accepted a bad name")
	}
}

// A score's JSON keeps four decimals: 2/3 reads 0.6667.
func TestScoreJSONRounded(t *testing.T) {
	for _, tc := range []struct {
		s    picker.Score
		want string
	}{
		{picker.Score{Pod: "a", Prefix: 2.0 / 3, Load: 1.0 / 3, Total: 0.123456789, MatchedTokens: 96},
			`{"pod":"a","prefix":0.6667,"load":0.3333,"total":0.1235,"matched_tokens":96}`},
		{picker.Score{Pod: "b", Prefix: 1, Load: 0.99995, Session: 1, Hot: 1e-9, Priority: 1, Total: -0.00004},
			`{"pod":"b","prefix":1,"load":1,"session":1,"priority":1,"total":0,"matched_tokens":0}`},
	} {
		b, err := json.Marshal(picker.Decision{Scores: []picker.Score{tc.s}})
		if err != nil {
			t.Fatal(err)
		}
		if want := `{"endpoint":"","pod":"","index_seq":0,"scores":[` + tc.want + `]}`; string(b) != want {
			t.Errorf("got  %s\nwant %s", b, want)
		}
	}
}
