package demo

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvindex/kvindex/picker"
)

// req returns a request whose prompt has n blocks of 16 tokens and whose
// block keys are base+0, base+1, ...
func req(base uint64, n int) *Request {
	r := &Request{Prompt: make([]uint64, n*16), Keys: make([]uint64, n)}
	for i := range r.Keys {
		r.Keys[i] = base + uint64(i)
	}
	for i := range r.Prompt {
		r.Prompt[i] = base + uint64(i)
	}
	return r
}

func decide(r *Request, depth ...int) *decision {
	d := &decision{Req: r, Depth: depth}
	for i := range depth {
		d.Cands = append(d.Cands, i)
	}
	return d
}

func TestRoundRobinCyclesOverCandidates(t *testing.T) {
	var r roundRobin
	d := decide(req(0, 1), 5, 0, 3)
	var got []int
	for range 4 {
		p, _ := r.Route(d)
		got = append(got, p)
	}
	if fmt.Sprint(got) != "[0 1 2 0]" {
		t.Fatalf("got %v", got)
	}
	d.Cands = []int{1, 2} // a pod left: cycle over the rest
	p, _ := r.Route(d)
	if p != 1 && p != 2 {
		t.Fatalf("routed to %d, not a candidate", p)
	}
}

func TestLeastLoadedPicksShortestQueueLowestIndexOnTies(t *testing.T) {
	for _, tc := range []struct {
		depth []int
		want  int
	}{
		{[]int{2, 1, 3}, 1},
		{[]int{1, 1, 0, 0}, 2},
		{[]int{0, 0}, 0},
	} {
		if p, _ := (leastLoaded{}).Route(decide(req(0, 1), tc.depth...)); p != tc.want {
			t.Errorf("depths %v: got %d, want %d", tc.depth, p, tc.want)
		}
	}
}

// TestConsistentHashRemapsOnlyToTheNewPod checks the ring's two promises:
// a prompt start always maps to the same pod, and a pod joining takes keys
// only for itself, about its share of them.
func TestConsistentHashRemapsOnlyToTheNewPod(t *testing.T) {
	names := []string{"pod-0", "pod-1", "pod-2", "pod-3", "pod-4", "pod-5", "pod-6", "pod-7", "pod-8"}
	ch := newConsistentHash(names, 64, 100)
	route := func(r *Request, cands []int) int {
		d := &decision{Req: r, Cands: cands, Depth: make([]int, len(names))}
		p, err := ch.Route(d)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	eight := []int{0, 1, 2, 3, 4, 5, 6, 7}
	nine := append(eight[:8:8], 8)
	const keys = 4000
	rng := rand.New(rand.NewPCG(1, 2))
	reqs := make([]*Request, keys)
	for i := range reqs {
		reqs[i] = req(rng.Uint64(), 8)
	}
	before := make([]int, keys)
	counts := make([]int, 9)
	for i, r := range reqs {
		before[i] = route(r, eight)
		counts[before[i]]++
		// Tokens past the hashed prefix do not matter.
		longer := *r
		longer.Prompt = append(r.Prompt[:len(r.Prompt):len(r.Prompt)], 1, 2, 3)
		if route(&longer, eight) != before[i] {
			t.Fatal("tokens after the hashed prefix changed the pod")
		}
	}
	moved := 0
	for i, r := range reqs {
		if after := route(r, nine); after != before[i] {
			moved++
			if after != 8 {
				t.Fatalf("a key moved from pod %d to pod %d, not to the new pod", before[i], after)
			}
		}
	}
	for i, r := range reqs {
		if route(r, eight) != before[i] {
			t.Fatal("the pod set came back but the key did not")
		}
	}
	if f := float64(moved) / keys; f < 0.05 || f > 0.2 {
		t.Fatalf("%.3f of keys moved to the ninth pod, want about 1/9", f)
	}
	for p, n := range counts[:8] {
		if f := float64(n) / keys; f < 0.06 || f > 0.2 {
			t.Errorf("pod %d holds %.3f of keys with 100 virtual nodes, want about 1/8", p, f)
		}
	}
}

// fixedSource is a prefixSource with given fractions, as matched blocks
// of a 100-block prompt.
type fixedSource struct {
	frac   []float64
	routes []int
}

func (f *fixedSource) matched(d *decision, pre []picker.Prefix) (int, error) {
	for _, p := range d.Cands {
		pre[p] = picker.Prefix{GPU: int(math.Round(f.frac[p] * 100))}
	}
	return 100 * 16, nil
}

func (f *fixedSource) routed(_ *decision, pod int) { f.routes = append(f.routes, pod) }

func testScoring(t *testing.T, w Weights, src prefixSource, seed uint64, pods int) *scoring {
	t.Helper()
	var names []string
	for i := range pods {
		names = append(names, podName(i))
	}
	s, err := newScoring("test", pickerConfig(w, 16, seed), src, names)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestScoringTradesPrefixAgainstQueue checks the trade-off the default
// weights make (picker.Weights), as the demo's routers see it.
func TestScoringTradesPrefixAgainstQueue(t *testing.T) {
	for _, tc := range []struct {
		name  string
		w     Weights
		frac  []float64
		depth []int
		want  int
	}{
		{"cache wins over one request ahead", DefaultWeights, []float64{0.1, 0.95}, []int{0, 1}, 1},
		{"two requests ahead outweigh 85% of the prompt", DefaultWeights, []float64{0.1, 0.95}, []int{0, 2}, 0},
		{"but not 90%", DefaultWeights, []float64{0.05, 0.95}, []int{0, 2}, 1},
		{"no cache anywhere: shortest queue", DefaultWeights, []float64{0.1, 0.1, 0.1}, []int{2, 0, 1}, 1},
		{"load weight 0 follows the cache, short of the hot-prefix guard", Weights{Prefix: 0.7}, []float64{0.1, 0.95}, []int{0, 3}, 1},
		{"longer prefix wins at equal load", DefaultWeights, []float64{0.5, 0.6}, []int{1, 1}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &fixedSource{frac: tc.frac}
			s := testScoring(t, tc.w, src, 1, len(tc.frac))
			p, err := s.Route(decide(req(0, 4), tc.depth...))
			if err != nil || p != tc.want {
				t.Fatalf("got pod %d (%v), want %d", p, err, tc.want)
			}
			if len(src.routes) != 1 || src.routes[0] != p {
				t.Fatalf("the source was told %v, want [%d]", src.routes, p)
			}
		})
	}
}

// TestScoringBreaksTiesAtRandomButRepeatably checks that equal scores
// spread over the tied pods, the same way for the same seed. Each request
// is a new prompt of a new conversation, so that neither the picker's
// speculative entries nor its sessions tell the pods apart.
func TestScoringBreaksTiesAtRandomButRepeatably(t *testing.T) {
	picks := func(seed uint64) []int {
		s := testScoring(t, DefaultWeights, &fixedSource{frac: []float64{0.5, 0.9, 0.9, 0.9}}, seed, 4)
		var out []int
		for i := range 300 {
			r := req(uint64(i)<<20, 4)
			r.Conv = i
			p, _ := s.Route(decide(r, 0, 0, 0, 0))
			out = append(out, p)
		}
		return out
	}
	a, b := picks(3), picks(3)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatal("the same seed broke ties differently")
	}
	counts := map[int]int{}
	for _, p := range a {
		counts[p]++
	}
	if counts[0] != 0 {
		t.Fatal("a pod with a lower score won")
	}
	for p := 1; p <= 3; p++ {
		if counts[p] < 60 {
			t.Fatalf("tied pod %d won %d of 300 times: ties are not spread (%v)", p, counts[p], counts)
		}
	}
}

// TestApproxSourceLearnsOnlyFromItsRoutes checks the approximate model: a
// prompt routed to a pod is predicted there, it ages out in prompt order
// once the pod's capacity is used by other prompts, and a limit on tracked
// blocks measures the match over those blocks only.
func TestApproxSourceLearnsOnlyFromItsRoutes(t *testing.T) {
	a, err := newApproxSource(2, 10, 0, 16)
	if err != nil {
		t.Fatal(err)
	}
	pre := make([]picker.Prefix, 2)
	blocks := func() []int { return []int{pre[0].Blocks(), pre[1].Blocks()} }
	r := req(100, 6)
	d := decide(r, 0, 0)
	_, _ = a.matched(d, pre)
	if b := blocks(); b[0] != 0 || b[1] != 0 {
		t.Fatalf("predicted %v before any routing", b)
	}
	a.routed(d, 1)
	if tokens, _ := a.matched(d, pre); tokens != 6*16 || pre[0].Blocks() != 0 || pre[1].Blocks() != 6 {
		t.Fatalf("after routing to pod 1: predicted %v of %d tokens, want [0 6] of 96", blocks(), tokens)
	}
	// Longer prompt of the same conversation: the known head matches.
	longer := req(100, 12)
	if tokens, _ := a.matched(decide(longer, 0, 0), pre); tokens != 12*16 || pre[1].Blocks() != 6 {
		t.Fatalf("12-block prompt with 6 known blocks: predicted %d of %d tokens, want 6 blocks of 192", pre[1].Blocks(), tokens)
	}
	// Five other blocks on pod 1 evict the oldest entries: the prompt's
	// head, which breaks the whole predicted prefix.
	a.routed(decide(req(900, 5), 0, 0), 1)
	_, _ = a.matched(d, pre)
	if pre[1].Blocks() != 0 {
		t.Fatalf("after the head was evicted: predicted %d blocks, want 0", pre[1].Blocks())
	}

	limited, _ := newApproxSource(1, 100, 4, 16)
	limited.routed(decide(req(100, 6), 0), 0)
	p := make([]picker.Prefix, 1)
	if tokens, _ := limited.matched(decide(req(100, 20), 0), p); tokens != 4*16 || p[0].Blocks() != 4 {
		t.Fatalf("tracking 4 blocks: a prompt sharing them matches %d blocks of %d tokens, want all 4", p[0].Blocks(), tokens)
	}
}

// TestSessionAffinityIsStickyAndBlind checks that a session always lands
// on the pod its id hashes to, whatever its prompt, the queues or the
// caches, and that the sessions spread over the pods.
func TestSessionAffinityIsStickyAndBlind(t *testing.T) {
	names := []string{"pod-0", "pod-1", "pod-2", "pod-3"}
	sa := newSessionAffinity(names, 100)
	home := map[int]int{}
	used := map[int]bool{}
	for turn := range 3 {
		for conv := range 64 {
			r := req(uint64(1000*turn+conv), 1+turn) // the prompt changes every turn
			r.Conv = conv
			d := decide(r, 0, 0, 0, 0)
			d.Depth[(conv+turn)%4] = 100 // a different pod is swamped each turn
			p, err := sa.Route(d)
			if err != nil {
				t.Fatal(err)
			}
			if h, ok := home[conv]; ok && h != p {
				t.Fatalf("session %d moved from pod %d to %d on turn %d", conv, h, p, turn)
			}
			home[conv] = p
			used[p] = true
		}
	}
	if len(used) != len(names) {
		t.Fatalf("64 sessions landed on %d of %d pods", len(used), len(names))
	}
}

// TestGatewaysDealRequestsToReplicas checks that request i goes to
// replica i mod n, so each replica's state sees only its share.
func TestGatewaysDealRequestsToReplicas(t *testing.T) {
	var srcs []*fixedSource
	g := &gateways{}
	for i := range 3 {
		src := &fixedSource{frac: []float64{0, 0}}
		srcs = append(srcs, src)
		g.replicas = append(g.replicas, testScoring(t, DefaultWeights, src, uint64(i+1), 2))
	}
	for id := range 7 {
		r := req(0, 1)
		r.ID = id
		if _, err := g.Route(decide(r, 0, 0)); err != nil {
			t.Fatal(err)
		}
	}
	for i, want := range []int{3, 2, 2} {
		if got := len(srcs[i].routes); got != want {
			t.Errorf("replica %d decided %d of 7 requests, want %d", i, got, want)
		}
	}
}
