package picker

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// ErrNoCandidates is matched (errors.Is) by Pick's error when no
// candidate may serve the request: none given, or none in the subset
// hint. An Endpoint Picker answers it with 503.
var ErrNoCandidates = errors.New("picker: no candidate can serve the request")

// Scorer picks a pod for each request. It is safe for concurrent use; its
// state (sessions, speculative entries) is in memory and bounded by its
// Config.
type Scorer struct {
	cfg Config

	mu       sync.Mutex
	sessions *simplelru.LRU[string, string] // session -> last pod
	spec     *speculative

	// scratch, reused under mu
	first    map[string]int // pod -> first candidate index
	eligible []int
	run      []int
	ties     []int
	order    []int
	scores   []Score
	ahead    []float64
}

// New returns a Scorer for cfg, or an error matching ErrConfig.
func New(cfg Config) (*Scorer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	sessions, err := simplelru.NewLRU[string, string](cfg.Sessions, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return &Scorer{
		cfg:      cfg,
		sessions: sessions,
		spec:     newSpeculative(cfg.SpeculativeTTL, cfg.SpeculativeBlocks),
		first:    map[string]int{},
	}, nil
}

// Config returns the Scorer's configuration.
func (s *Scorer) Config() Config { return s.cfg }

// Pick chooses one of cands for req at time now (the caller's clock:
// speculative entries and metric ages are measured against it) and
// records the choice: the prompt's blocks as the pod's speculative entries
// and the pod as the session's last. The candidate with the highest total
// wins; exact ties go to the tied pod the request hashes to (tieBreak), so
// that the first pods to cache a hot prefix do not take every tie.
//
// Out-of-range signals (negative counts, a KV usage outside [0, 1] or
// NaN, more matched blocks than the prompt has) are clamped, never
// trusted. A candidate without a pod name is an error, and so is no
// eligible candidate (ErrNoCandidates).
func (s *Scorer) Pick(now time.Time, req *Request, cands []Candidate) (Decision, error) {
	if len(cands) == 0 {
		return Decision{}, fmt.Errorf("%w: no candidates", ErrNoCandidates)
	}
	for i := range cands {
		if cands[i].Pod == "" {
			return Decision{}, fmt.Errorf("picker: candidate %d (endpoint %q) has no pod name", i, cands[i].Endpoint)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()

	s.eligible = s.eligible[:0]
	for i := range cands {
		if len(req.Subset) == 0 || slices.Contains(req.Subset, cands[i].Endpoint) || slices.Contains(req.Subset, cands[i].Pod) {
			s.eligible = append(s.eligible, i)
		}
	}
	if len(s.eligible) == 0 {
		return Decision{}, fmt.Errorf("%w: none of the %d candidates is in the subset hint %v", ErrNoCandidates, len(cands), req.Subset)
	}

	tokens := req.Tokens
	if tokens <= 0 {
		tokens = len(req.Keys) * s.cfg.BlockSize
	}
	bs := s.cfg.BlockSize
	maxBlocks := 0
	if tokens > 0 {
		maxBlocks = tokens / bs
	}

	// Speculative matches, per eligible candidate.
	s.run = slices.Grow(s.run[:0], len(s.eligible))[:len(s.eligible)]
	clear(s.run)
	if s.cfg.SpeculativeTTL > 0 {
		s.spec.expire(now)
		clear(s.first)
		for j, i := range s.eligible {
			if _, ok := s.first[cands[i].Pod]; !ok {
				s.first[cands[i].Pod] = j
			}
		}
		s.spec.match(now, req.Keys, s.first, s.run)
		for j, i := range s.eligible {
			s.run[j] = s.run[s.first[cands[i].Pod]]
		}
	}

	sessionPod, hasSession := "", false
	if req.Session != "" {
		sessionPod, hasSession = s.sessions.Get(req.Session)
	}

	s.scores = slices.Grow(s.scores[:0], len(s.eligible))[:len(s.eligible)]
	clear(s.scores)
	s.ahead = slices.Grow(s.ahead[:0], len(s.eligible))[:len(s.eligible)]
	scores, pressure := s.scores, s.ahead
	w := s.cfg.Weights
	for j, i := range s.eligible {
		c := &cands[i]
		sc := &scores[j]
		sc.Pod = c.Pod

		// Prefix: the index's match, tier- and health-weighted, or the
		// speculative one, whichever is more.
		matched := min(c.Prefix.Blocks(), maxBlocks)
		weighted := 0.0
		if n := c.Prefix.Blocks(); n > 0 {
			weighted = (float64(max(c.Prefix.GPU, 0))*s.cfg.Tiers.GPU +
				float64(max(c.Prefix.CPU, 0))*s.cfg.Tiers.CPU +
				float64(max(c.Prefix.Disk, 0))*s.cfg.Tiers.Disk) *
				float64(matched) / float64(n) * s.cfg.healthWeight(c.Prefix.Health)
		}
		if spec := min(s.run[j], maxBlocks); float64(spec)*s.cfg.Tiers.GPU > weighted {
			weighted = float64(spec) * s.cfg.Tiers.GPU
			matched = max(matched, spec)
		}
		if tokens > 0 {
			sc.Prefix = min(weighted*float64(bs)/float64(tokens), 1)
		}
		sc.MatchedTokens = matched * bs

		pressure[j] = s.pressure(now, c)
		sc.Load = 1 - pressure[j]/s.cfg.LoadScale
		if hasSession && c.Pod == sessionPod && pressure[j] < s.cfg.SessionOverload {
			sc.Session = 1
		}
		if req.Priority == Background && c.InFlightInteractive <= 0 {
			sc.Priority = 1
		}
	}
	s.hotGuard(scores, pressure)

	best := math.Inf(-1)
	s.ties = s.ties[:0]
	for j := range scores {
		sc := &scores[j]
		sc.Total = w.Prefix*sc.Prefix + w.Load*sc.Load + w.Session*sc.Session + w.Hot*sc.Hot + w.Priority*sc.Priority
		switch {
		case sc.Total > best:
			best = sc.Total
			s.ties = append(s.ties[:0], j)
		case sc.Total == best:
			s.ties = append(s.ties, j)
		}
	}
	pick := s.ties[0]
	if len(s.ties) > 1 {
		pick = s.tieBreak(req, cands)
	}
	chosen := &cands[s.eligible[pick]]

	if s.cfg.SpeculativeTTL > 0 {
		s.spec.add(now, chosen.Pod, req.Keys[:min(len(req.Keys), maxBlocks)])
	}
	if req.Session != "" {
		s.sessions.Add(req.Session, chosen.Pod)
	}

	// Best first, the chosen pod ahead of any it tied with, then by pod
	// name and endpoint, so that the order does not depend on the
	// candidates' (replicas may list them differently), then candidate
	// order. Sorting indices rather than Scores avoids moving 80-byte
	// structs with pointers.
	s.order = s.order[:0]
	for j := range scores {
		if j != pick {
			s.order = append(s.order, j)
		}
	}
	slices.SortFunc(s.order, func(a, b int) int {
		ca, cb := &cands[s.eligible[a]], &cands[s.eligible[b]]
		return cmp.Or(cmp.Compare(s.scores[b].Total, s.scores[a].Total),
			cmp.Compare(ca.Pod, cb.Pod), cmp.Compare(ca.Endpoint, cb.Endpoint), a-b)
	})
	out := make([]Score, 0, len(scores))
	out = append(out, scores[pick])
	for _, j := range s.order {
		out = append(out, scores[j])
	}
	return Decision{Endpoint: chosen.Endpoint, Pod: chosen.Pod, Scores: out}, nil
}

// tieBreak returns the winner among s.ties (indices of s.eligible): the
// tied candidate whose pod ranks highest by a hash of Config.Seed, the
// request and the pod's name (rendezvous hashing), then by endpoint, then
// candidate order. The winner is a function of the request and the tied
// pods alone, not of the picks before nor of the candidates' order, so
// that replicas of the picker agree; different requests spread over the
// tied pods, and a pod leaving the tie moves only the requests it won.
func (s *Scorer) tieBreak(req *Request, cands []Candidate) int {
	h := mix64(s.cfg.Seed ^ 0x9e3779b97f4a7c15)
	h = hashString(h, req.Model)
	h = hashString(h, req.Session)
	h = mix64(h ^ uint64(max(req.Tokens, 0)))
	h = mix64(h ^ req.TieBreak)
	for _, k := range req.Keys {
		h = mix64(h ^ k)
	}
	best, bestRank := -1, uint64(0)
	for _, j := range s.ties {
		c := &cands[s.eligible[j]]
		rank := mix64(hashString(h, c.Pod))
		if best < 0 || rank > bestRank {
			best, bestRank = j, rank
			continue
		}
		if rank == bestRank {
			b := &cands[s.eligible[best]]
			if cmp.Or(cmp.Compare(c.Pod, b.Pod), cmp.Compare(c.Endpoint, b.Endpoint)) < 0 {
				best = j
			}
		}
	}
	return best
}

// mix64 is SplitMix64's finalizer: every input bit flips about half of
// the output bits.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// hashString folds s into h (FNV-1a over its bytes, then its length, so
// that "ab"+"" and "a"+"b" differ).
func hashString(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 0x100000001b3
	}
	return mix64(h ^ uint64(len(s)))
}

// pressure is the candidate's load in requests ahead of a new one: the
// larger of the picker's in-flight count and the engine's waiting count
// (the engine counts every picker's requests but not those running; the
// picker counts only its own, running or not, so the larger is the better
// lower bound), plus the penalty of a nearly full KV cache. Metrics older
// than MetricsMaxAge, or never scraped, are left out.
func (s *Scorer) pressure(now time.Time, c *Candidate) float64 {
	p := float64(max(c.InFlight, 0))
	m := &c.Metrics
	if m.ScrapedAt.IsZero() || now.Sub(m.ScrapedAt) > s.cfg.MetricsMaxAge {
		return p
	}
	p = max(p, float64(max(m.Waiting, 0)))
	if kv := m.KVUsage; kv > s.cfg.KVThreshold && s.cfg.KVPenalty > 0 { // NaN fails the comparison
		p += s.cfg.KVPenalty * (min(kv, 1) - s.cfg.KVThreshold) / (1 - s.cfg.KVThreshold)
	}
	return p
}

// hotGuard sets the Hot term (see the package doc's Hot prefix).
func (s *Scorer) hotGuard(scores []Score, pressure []float64) {
	holders, cool := 0, 0
	for j := range scores {
		switch {
		case scores[j].Prefix >= s.cfg.HotHolder:
			holders++
			if pressure[j] < s.cfg.HotSaturation {
				return // a holder has room
			}
		case pressure[j] < s.cfg.HotSaturation:
			cool++
		}
	}
	if holders == 0 || cool == 0 {
		return
	}
	for j := range scores {
		if pressure[j] < s.cfg.HotSaturation {
			scores[j].Hot = 1
		}
	}
}
