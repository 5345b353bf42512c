package server

import (
	"math"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/internal/inflight"
)

// tokenGate bounds the tokens of the queries being answered at once
// (Limits.MaxTokensInFlight), or the bytes of the HTTP request bodies
// being read (Limits.MaxBodyBytesInFlight): an inflight.Gate, whose
// refusals are logged at most every refusalLogEvery.
type tokenGate struct {
	inflight.Gate
	logged atomic.Int64 // unix nanos of the last refusal logged
}

// refusalLogEvery rate-limits the log line of refused queries.
const refusalLogEvery = 10 * time.Second

// promptWeight is what a prompt counts against MaxTokensInFlight, known
// before it is tokenized: its token ids, its block hashes' tokens, or the
// bytes of its text (a token is at least a byte in practice), at most
// MaxTokens (a larger prompt is refused later, and alone always fits).
func (s *Server) promptWeight(p *kvindexv1.Prompt) int64 {
	var n int
	switch in := p.GetInput().(type) {
	case *kvindexv1.Prompt_Tokens:
		n = len(in.Tokens.GetIds())
	case *kvindexv1.Prompt_BlockHashes:
		n = min(len(in.BlockHashes.GetHashes()), s.cfg.MaxTokens) * s.cfg.BlockSize
	case *kvindexv1.Prompt_Text:
		n = len(in.Text)
	case *kvindexv1.Prompt_Messages:
		for _, m := range in.Messages.GetMessages() {
			n += len(m.GetContent()) + len(m.GetMessageJson())
		}
	}
	return int64(max(min(n, s.cfg.MaxTokens), 1))
}

// admit reserves a query's tokens, or refuses it with ResourceExhausted
// (HTTP 429) naming the limit and its flag. The caller calls release when
// the query is answered.
func (s *Server) admit(p *kvindexv1.Prompt) (release func(), err error) {
	n := s.promptWeight(p)
	g := &s.tokens
	if g.TryAcquire(n) {
		return func() { g.Release(n) }, nil
	}
	now := s.now().UnixNano()
	if last := g.logged.Load(); now-last >= int64(refusalLogEvery) && g.logged.CompareAndSwap(last, now) {
		s.log.Warn("queries refused: too many tokens in flight", "limit", g.Max, "refused_total", g.Refused())
	}
	return nil, status.Errorf(codes.ResourceExhausted,
		"kvindex is busy: a query of %d tokens would exceed its limit of %d tokens in flight across concurrent queries; retry shortly", n, g.Max)
}

// sat32 converts a count for a uint32 field of an answer, saturating
// instead of wrapping.
func sat32[T ~int | ~int64 | ~uint64](n T) uint32 {
	switch {
	case n < 0:
		return 0
	case uint64(n) > math.MaxUint32:
		return math.MaxUint32
	}
	return uint32(n)
}
