package server

import (
	"sync"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/indexer"
)

// A LongestPrefix request of 1,024 blocks carries 16,384 token ids: a
// 128 KiB slice if decoded the usual way, per request. The server instead
// decodes token ids into pooled buffers (see codec.go), and pools its
// query, result and response storage, so that the steady state allocates
// only small, fixed-size objects.

// Pool bounds: buffers beyond them are left to the garbage collector, so
// that one huge request does not pin its memory in a pool.
const (
	maxPooledTokens = 1 << 18 // 2 MiB of ids
	maxPooledPods   = 4096
)

// queryState is the per-request storage of a query.
type queryState struct {
	q   indexer.Query
	res indexer.Result
	x   blockhash.Extras
}

var queryStates = sync.Pool{New: func() any { return new(queryState) }}

func getQueryState() *queryState { return queryStates.Get().(*queryState) }

func putQueryState(st *queryState) {
	st.q = indexer.Query{}
	mm := st.x.MM[:0]
	st.x = blockhash.Extras{MM: mm}
	if cap(st.res.Pods) > maxPooledPods {
		st.res.Pods = nil
	}
	queryStates.Put(st)
}

var tokenIDs = sync.Pool{New: func() any { return new(kvindexv1.TokenIds) }}

// releaseRequestTokens returns the token ids of a finished request to the
// pool. The request must not be used afterwards.
func releaseRequestTokens(p *kvindexv1.Prompt) {
	if w, ok := p.GetInput().(*kvindexv1.Prompt_Tokens); ok && w.Tokens != nil {
		putTokenIDs(w.Tokens)
		w.Tokens = nil
	}
}

func putTokenIDs(t *kvindexv1.TokenIds) {
	if cap(t.Ids) > maxPooledTokens {
		return
	}
	ids := t.Ids[:0]
	t.Reset()
	t.Ids = ids
	tokenIDs.Put(t)
}

var blockHashes = sync.Pool{New: func() any { return new(kvindexv1.BlockHashes) }}

// releaseRequestHashes returns the block hashes of a finished request to
// the pool. Only requests the gRPC server decoded may be released so
// (grpcIndexService): an in-process caller's hashes may live on in the
// caller (the picker's chain memo holds them).
func releaseRequestHashes(p *kvindexv1.Prompt) {
	w, ok := p.GetInput().(*kvindexv1.Prompt_BlockHashes)
	if !ok || w.BlockHashes == nil || cap(w.BlockHashes.Hashes) > maxPooledTokens {
		return
	}
	h := w.BlockHashes
	w.BlockHashes = nil
	hashes := h.Hashes[:0]
	h.Reset()
	h.Hashes = hashes
	blockHashes.Put(h)
}

var prefixResponses = sync.Pool{New: func() any { return new(kvindexv1.LongestPrefixResponse) }}

func getPrefixResponse() *kvindexv1.LongestPrefixResponse {
	return prefixResponses.Get().(*kvindexv1.LongestPrefixResponse)
}

// putPrefixResponse recycles r, keeping its PodMatch messages and their
// tier maps for the next response.
func putPrefixResponse(r *kvindexv1.LongestPrefixResponse) {
	if cap(r.Pods) > maxPooledPods {
		return
	}
	pods := r.Pods[:0]
	r.Reset()
	r.Pods = pods
	prefixResponses.Put(r)
}

// growPods returns p with length n, every element non-nil, reusing the
// PodMatch messages p already holds (beyond its length too).
func growPods(p []*kvindexv1.PodMatch, n int) []*kvindexv1.PodMatch {
	if cap(p) < n {
		np := make([]*kvindexv1.PodMatch, n)
		copy(np, p[:cap(p)])
		p = np
	}
	p = p[:n]
	for i, m := range p {
		if m == nil {
			p[i] = new(kvindexv1.PodMatch)
		}
	}
	return p
}
