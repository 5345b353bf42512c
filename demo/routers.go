package demo

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/zeebo/xxh3"
)

// Router names, in the order reports list them.
const (
	RouterRoundRobin     = "round-robin"
	RouterLeastLoaded    = "least-loaded"
	RouterConsistentHash = "consistent-hash"
	RouterApproximate    = "approximate"
	RouterPrecise        = "precise"
	RouterOracle         = "oracle"
)

// Routers lists the standard routers, in report order.
var Routers = []string{RouterRoundRobin, RouterLeastLoaded, RouterConsistentHash, RouterApproximate, RouterPrecise, RouterOracle}

// roundRobin cycles over the candidates.
type roundRobin struct{ next int }

func (*roundRobin) Name() string { return RouterRoundRobin }

func (r *roundRobin) Route(d *decision) (int, error) {
	p := d.Cands[r.next%len(d.Cands)]
	r.next++
	return p, nil
}

// leastLoaded picks the candidate with the fewest queued and in-service
// requests, the lowest index on ties.
type leastLoaded struct{}

func (leastLoaded) Name() string { return RouterLeastLoaded }

func (leastLoaded) Route(d *decision) (int, error) {
	best := d.Cands[0]
	for _, p := range d.Cands[1:] {
		if d.Depth[p] < d.Depth[best] {
			best = p
		}
	}
	return best, nil
}

// consistentHash maps a hash of the prompt's first PrefixTokens tokens onto
// a ring of virtual nodes: the same conversation start always lands on the
// same pod while the pod set is unchanged, and a pod joining or leaving
// moves only the keys next to its nodes.
type consistentHash struct {
	prefixTokens int
	vnodes       int
	names        []string
	ring         []ringNode // sorted by hash
	members      []int      // candidates the ring was built for
	buf          []byte
}

type ringNode struct {
	hash uint64
	pod  int
}

func newConsistentHash(names []string, prefixTokens, vnodes int) *consistentHash {
	return &consistentHash{prefixTokens: prefixTokens, vnodes: vnodes, names: names}
}

func (*consistentHash) Name() string { return RouterConsistentHash }

func (c *consistentHash) Route(d *decision) (int, error) {
	if !slices.Equal(c.members, d.Cands) {
		c.build(d.Cands)
	}
	n := min(len(d.Req.Prompt), c.prefixTokens)
	c.buf = c.buf[:0]
	for _, t := range d.Req.Prompt[:n] {
		c.buf = binary.LittleEndian.AppendUint64(c.buf, t)
	}
	key := xxh3.Hash(c.buf)
	i, _ := slices.BinarySearchFunc(c.ring, key, func(n ringNode, k uint64) int {
		switch {
		case n.hash < k:
			return -1
		case n.hash > k:
			return 1
		}
		return 0
	})
	if i == len(c.ring) {
		i = 0
	}
	return c.ring[i].pod, nil
}

func (c *consistentHash) build(cands []int) {
	c.members = append(c.members[:0], cands...)
	c.ring = c.ring[:0]
	for _, p := range cands {
		for v := range c.vnodes {
			c.ring = append(c.ring, ringNode{hash: xxh3.HashString(c.names[p] + "#" + strconv.Itoa(v)), pod: p})
		}
	}
	slices.SortFunc(c.ring, func(a, b ringNode) int {
		switch {
		case a.hash < b.hash:
			return -1
		case a.hash > b.hash:
			return 1
		}
		return a.pod - b.pod
	})
}

// prefixSource tells a scoring router how much of the prompt each
// candidate pod holds in its cache.
type prefixSource interface {
	// matched fills frac[p], the matched fraction of the prompt in [0, 1],
	// for every candidate p.
	matched(d *decision, frac []float64) error
	// routed reports the decision taken.
	routed(d *decision, pod int)
}

// Weights are a scoring router's weights: a pod's score is
//
//	Prefix*matched_fraction - Load*depth
//
// where matched_fraction is the share of the prompt's tokens the pod holds
// as a cached prefix and depth, the normalized queue depth, counts its
// queued and in-service requests per request the engine serves at once
// (one, in this model): the requests ahead of a new one. With the default
// weights a request ahead weighs as much as 3/7 of the prompt being
// cached: a conversation whose pod holds 85% more of its prompt than any
// other pod stays there unless that pod has two more requests waiting,
// and a hot prefix cached on some pods spills to the others once its pods
// run three requests longer.
type Weights struct {
	Prefix, Load float64
}

// DefaultWeights are the scoring routers' default weights.
var DefaultWeights = Weights{Prefix: 0.7, Load: 0.3}

// scoring routes to the candidate with the highest score, from any
// prefixSource: the kvindex path (precise), the engines' true state
// (oracle) or the router's own history (approximate). Ties are broken at
// random (seeded, so runs repeat), as llm-d's max-score picker does: with
// a fixed order, the first pods to cache a hot prefix would take every
// tie and carry the hot traffic alone.
type scoring struct {
	name string
	w    Weights
	src  prefixSource
	rng  *rand.Rand
	frac []float64
	ties []int
}

func newScoring(name string, w Weights, src prefixSource, seed uint64) *scoring {
	return &scoring{name: name, w: w, src: src, rng: newRand(seed, streamTies)}
}

func (s *scoring) Name() string { return s.name }

func (s *scoring) Route(d *decision) (int, error) {
	if len(s.frac) < len(d.Depth) {
		s.frac = make([]float64, len(d.Depth))
	}
	clear(s.frac)
	if err := s.src.matched(d, s.frac); err != nil {
		return -1, err
	}
	bestScore := math.Inf(-1)
	s.ties = s.ties[:0]
	for _, p := range d.Cands {
		score := s.w.Prefix*s.frac[p] - s.w.Load*float64(d.Depth[p])
		switch {
		case score > bestScore:
			bestScore = score
			s.ties = append(s.ties[:0], p)
		case score == bestScore:
			s.ties = append(s.ties, p)
		}
	}
	best := s.ties[0]
	if len(s.ties) > 1 {
		best = s.ties[s.rng.IntN(len(s.ties))]
	}
	s.src.routed(d, best)
	return best, nil
}

// approxSource predicts each pod's cache from the router's own decisions,
// the way the approximate prefix-cache scorer of the Gateway API Inference
// Extension (llm-d's and GKE's approximate mode) does: per pod, an LRU set
// of the block hashes of the prompts it sent there, sized to the engine's
// block count (what that scorer's autoTune reads from the engine),
// recorded in prompt order when it routes; a pod scores the tracked blocks
// it matches over the prompt's tracked blocks. By default it tracks the
// whole prompt, its best setting for long prompts; maxBlocks > 0 limits it
// to the first maxBlocks blocks as that scorer's maxPrefixBlocksToMatch
// does (default 256: 4,096 tokens, which makes every agent prompt look
// half-cached wherever the 2k-token shared prefix is). It never hears from
// the engines: it cannot see what they evicted, in what order (engines
// evict a finished request's tail first; its LRU ages a prompt's head
// first), nor that one restarted.
type approxSource struct {
	maxBlocks int // 0: the whole prompt
	pods      []*simplelru.LRU[uint64, struct{}]
}

func newApproxSource(pods, capacityBlocks, maxBlocks int) (*approxSource, error) {
	a := &approxSource{maxBlocks: maxBlocks}
	for range pods {
		l, err := simplelru.NewLRU[uint64, struct{}](capacityBlocks, nil)
		if err != nil {
			return nil, fmt.Errorf("approximate router: %w", err)
		}
		a.pods = append(a.pods, l)
	}
	return a, nil
}

func (a *approxSource) tracked(r *Request) []uint64 {
	if a.maxBlocks > 0 && len(r.Keys) > a.maxBlocks {
		return r.Keys[:a.maxBlocks]
	}
	return r.Keys
}

func (a *approxSource) matched(d *decision, frac []float64) error {
	keys := a.tracked(d.Req)
	if len(keys) == 0 {
		return nil
	}
	for _, p := range d.Cands {
		n := 0
		for _, k := range keys {
			if !a.pods[p].Contains(k) {
				break
			}
			n++
		}
		frac[p] = float64(n) / float64(len(keys))
	}
	return nil
}

// routed records the prompt's tracked blocks on the chosen pod, in prompt
// order.
func (a *approxSource) routed(d *decision, pod int) {
	l := a.pods[pod]
	for _, k := range a.tracked(d.Req) {
		l.Add(k, struct{}{})
	}
}

// oracleSource reads the engines' true cache state at decision time.
type oracleSource struct {
	engines []engine
}

func (o *oracleSource) matched(d *decision, frac []float64) error {
	n := float64(max(len(d.Req.Prompt), 1))
	for _, p := range d.Cands {
		frac[p] = float64(o.engines[p].Lookup(d.Req.Keys)) / n
	}
	return nil
}

func (*oracleSource) routed(*decision, int) {}
