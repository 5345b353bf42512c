package demo

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/zeebo/xxh3"

	"github.com/kvindex/kvindex/picker"
)

// Router names, in the order reports list them.
const (
	RouterRoundRobin     = "round-robin"
	RouterLeastLoaded    = "least-loaded"
	RouterConsistentHash = "consistent-hash"
	RouterApproximate    = "approximate"
	RouterPrecise        = "precise"
	RouterOracle         = "oracle"
	// RouterSessionAffinity is the sessions scenario's extra row.
	RouterSessionAffinity = "session-affinity"
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
	tokens       []uint64
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
	n := min(d.Req.PromptLen(), c.prefixTokens)
	prefix := d.Req.Prompt
	if d.Req.trace != nil {
		c.tokens = d.Req.appendTokens(c.tokens[:0], n)
		prefix = c.tokens
	}
	c.buf = c.buf[:0]
	for _, t := range prefix[:n] {
		c.buf = binary.LittleEndian.AppendUint64(c.buf, t)
	}
	return c.lookup(d.Cands, xxh3.Hash(c.buf)), nil
}

// lookup returns the pod owning key on the ring of cands: the first
// virtual node at or after it, wrapping around.
func (c *consistentHash) lookup(cands []int, key uint64) int {
	if !slices.Equal(c.members, cands) {
		c.build(cands)
	}
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
	return c.ring[i].pod
}

// sessionAffinity pins each session (a conversation: the demo's session
// id) to the pod its id hashes to on the same kind of ring, as a gateway's
// ring-hash load balancer keyed on a session header does (Envoy's
// ring_hash with a header hash policy, Istio's consistentHash
// httpHeaderName, NGINX's "hash $http_x_session_id consistent"). The first
// placement is the hash too: it never looks at load, caches or capacity.
type sessionAffinity struct {
	ring *consistentHash
	buf  []byte
}

func newSessionAffinity(names []string, vnodes int) *sessionAffinity {
	return &sessionAffinity{ring: newConsistentHash(names, 0, vnodes)}
}

func (*sessionAffinity) Name() string { return RouterSessionAffinity }

func (s *sessionAffinity) Route(d *decision) (int, error) {
	s.buf = strconv.AppendInt(append(s.buf[:0], "session-"...), int64(d.Req.Conv), 10)
	return s.ring.lookup(d.Cands, xxh3.Hash(s.buf)), nil
}

// gateways is one router per gateway replica: request i goes to replica
// i mod len(replicas) (round-robin over the arrival plan, as a Service in
// front of the replicas spreads them), and each replica decides with its
// own state. What the replicas share is the caller's choice: the pods'
// load (every decision's Depth) always, and for precise one kvindex.
type gateways struct {
	replicas []router
}

func (g *gateways) Name() string { return g.replicas[0].Name() }

func (g *gateways) Route(d *decision) (int, error) {
	return g.replicas[d.Req.ID%len(g.replicas)].Route(d)
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
	// matched fills pre[p], the pod's matched leading blocks, for every
	// candidate p, and returns the prompt length in tokens the matched
	// fraction is over (0: the whole prompt).
	matched(d *decision, pre []picker.Prefix) (tokens int, err error)
	// routed reports the decision taken.
	routed(d *decision, pod int)
}

// Weights are the demo's flags for the picker's two main weights
// (picker.Weights documents them and the trade-off their defaults make);
// the picker's other scorers keep their defaults.
type Weights struct {
	Prefix, Load float64
}

// DefaultWeights are the picker's defaults.
var DefaultWeights = Weights{Prefix: picker.DefaultConfig().Weights.Prefix, Load: picker.DefaultConfig().Weights.Load}

// pickerConfig is a scoring router's configuration: the picker's
// defaults with the run's weights, block size and seed.
func pickerConfig(w Weights, blockSize int, seed uint64) picker.Config {
	c := picker.DefaultConfig()
	c.Weights.Prefix, c.Weights.Load = w.Prefix, w.Load
	c.BlockSize, c.Seed = blockSize, seed
	return c
}

// simEpoch is simulated time 0 on the picker's clock.
var simEpoch = time.Unix(0, 0).UTC()

// scoring is the gateway picker's scorer (package picker) fed by a
// prefixSource: the kvindex path (precise), the engines' true state
// (oracle) or the router's own history (approximate). Each pod's depth
// (queued plus in-service requests) is the in-flight count a picker
// tracks, every request is interactive and its conversation is its
// session; the demo's engines publish no metrics.
type scoring struct {
	name   string
	p      *picker.Scorer
	src    prefixSource
	names  []string
	byName map[string]int
	pre    []picker.Prefix
	cands  []picker.Candidate
	req    picker.Request
}

func newScoring(name string, cfg picker.Config, src prefixSource, names []string) (*scoring, error) {
	p, err := picker.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	s := &scoring{name: name, p: p, src: src, names: names, byName: map[string]int{}}
	for i, n := range names {
		s.byName[n] = i
	}
	return s, nil
}

func (s *scoring) Name() string { return s.name }

func (s *scoring) Route(d *decision) (int, error) {
	if len(s.pre) < len(d.Depth) {
		s.pre = make([]picker.Prefix, len(d.Depth))
	}
	clear(s.pre)
	tokens, err := s.src.matched(d, s.pre)
	if err != nil {
		return -1, err
	}
	if tokens == 0 {
		tokens = d.Req.PromptLen()
	}
	s.cands = s.cands[:0]
	for _, p := range d.Cands {
		s.cands = append(s.cands, picker.Candidate{
			Pod: s.names[p], Endpoint: s.names[p],
			InFlight: d.Depth[p], InFlightInteractive: d.Depth[p],
			Prefix: s.pre[p],
		})
	}
	s.req = picker.Request{Model: model, Keys: d.Req.Keys, Tokens: tokens, Session: strconv.Itoa(d.Req.Conv)}
	dec, err := s.p.Pick(simEpoch.Add(d.Now), &s.req, s.cands)
	if err != nil {
		return -1, err
	}
	best := s.byName[dec.Pod]
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
	blockSize int
	pods      []*simplelru.LRU[uint64, struct{}]
}

func newApproxSource(pods, capacityBlocks, maxBlocks, blockSize int) (*approxSource, error) {
	a := &approxSource{maxBlocks: maxBlocks, blockSize: blockSize}
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

// matched scores the tracked blocks a pod matches over the tracked
// blocks, as that scorer does.
func (a *approxSource) matched(d *decision, pre []picker.Prefix) (int, error) {
	keys := a.tracked(d.Req)
	if len(keys) == 0 {
		return 0, nil
	}
	for _, p := range d.Cands {
		n := 0
		for _, k := range keys {
			if !a.pods[p].Contains(k) {
				break
			}
			n++
		}
		pre[p] = picker.Prefix{GPU: n}
	}
	return len(keys) * a.blockSize, nil
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
	engines   []engine
	blockSize int
}

func (o *oracleSource) matched(d *decision, pre []picker.Prefix) (int, error) {
	for _, p := range d.Cands {
		pre[p] = picker.Prefix{GPU: o.engines[p].Lookup(d.Req.Keys) / o.blockSize}
	}
	return 0, nil
}

func (*oracleSource) routed(*decision, int) {}
