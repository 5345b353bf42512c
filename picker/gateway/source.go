package gateway

import (
	"context"
	"strings"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/picker"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Source answers kvindex's LongestPrefix: *server.Server in the same
// process (kvindex serve --picker), or Remote over gRPC.
type Source interface {
	LongestPrefix(ctx context.Context, req *kvindexv1.LongestPrefixRequest) (*kvindexv1.LongestPrefixResponse, error)
}

// Remote asks a kvindex server over gRPC.
type Remote struct{ Client *client.Client }

// LongestPrefix implements Source.
func (r Remote) LongestPrefix(ctx context.Context, req *kvindexv1.LongestPrefixRequest) (*kvindexv1.LongestPrefixResponse, error) {
	return r.Client.LongestPrefix(ctx, req.GetModel(), req.GetPrompt(), &client.QueryOptions{Candidates: req.GetCandidatePods()})
}

// Warm connects to the index, if the connection is not up, and makes one
// cheap call (ListPods) through it, within ctx: a query's deadline is a
// couple of milliseconds, too short for a connection's setup (TCP, TLS,
// HTTP/2 settings) or the first call's lazy initialisation on both
// sides, so a query on a cold connection would fall back.
//
// The call waits for the connection to be ready, and is tried again when
// it fails as unavailable (a connection lost under it), until ctx ends.
func (r Remote) Warm(ctx context.Context) error {
	r.Client.Conn().Connect()
	for {
		_, err := r.Client.Index.ListPods(ctx, &kvindexv1.ListPodsRequest{}, grpc.WaitForReady(true))
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			return err
		}
	}
}

// Outcomes hears, for each request routed over ext_proc, the cached
// tokens the pick predicted (the chosen pod's matched prefix) and, once
// the response has passed through, its body (at most Config.MaxBody;
// larger ones are not reported), whose usage says what the engine served
// from cache. Comparing the two shows routing that goes wrong while every
// engine's own hit rate looks fine. /v1/pick decisions are not reported:
// their responses never pass the picker.
type Outcomes interface {
	Predicted(model string, matchedTokens int)
	Responded(model string, body []byte)
}

// MetricsSource gives an engine's scraped load metrics (vLLM's
// /metrics), by pod name; ok is false when there are none.
type MetricsSource interface {
	EngineMetrics(pod string) (m picker.Metrics, ok bool)
}

// prefixes converts kvindex's answer into the picker's per-pod prefix,
// in blocks of blockSize tokens (the scorer's), by pod name. A pod with
// several data-parallel ranks counts its best rank: the engine's own
// balancer places the request, and the longest match is where a
// conversation's earlier turns went.
func prefixes(resp *kvindexv1.LongestPrefixResponse, blockSize int, out map[string]picker.Prefix) {
	clear(out)
	bs := int(resp.GetBlockSize())
	if bs <= 0 {
		bs = blockSize
	}
	conv := func(blocks uint32) int { return int(blocks) * bs / blockSize }
	for _, pm := range resp.GetPods() {
		var p picker.Prefix
		matched := conv(pm.GetMatchedBlocks())
		for medium, n := range pm.GetTiers() {
			switch strings.ToLower(medium) {
			case "gpu":
				p.GPU += conv(n)
			case "cpu":
				p.CPU += conv(n)
			}
		}
		// Tiers are the blocks per medium; whatever the index matched on
		// another medium (disk, a connector's store) counts as disk.
		p.GPU = min(p.GPU, matched)
		p.CPU = min(p.CPU, matched-p.GPU)
		p.Disk = matched - p.GPU - p.CPU
		if len(pm.GetTiers()) == 0 {
			p.GPU, p.Disk = matched, 0
		}
		p.Health, _ = picker.ParseHealth(client.HealthName(pm.GetHealth()))
		if old, ok := out[pm.GetPod()]; ok && old.Blocks() >= p.Blocks() {
			continue
		}
		out[pm.GetPod()] = p
	}
}

// Local asks a server in the same process (kvindex serve --picker), e.g.
// *server.Server, with no network in between.
type Local struct{ Server Source }

// LongestPrefix implements Source. The server takes ownership of a
// token-id prompt's ids (it recycles them when the query ends), so the
// caller must not read them afterwards; the prompt message itself is
// left as it was.
func (l Local) LongestPrefix(ctx context.Context, req *kvindexv1.LongestPrefixRequest) (*kvindexv1.LongestPrefixResponse, error) {
	p := req.GetPrompt()
	if t, ok := p.GetInput().(*kvindexv1.Prompt_Tokens); ok {
		p = &kvindexv1.Prompt{Input: &kvindexv1.Prompt_Tokens{Tokens: &kvindexv1.TokenIds{Ids: t.Tokens.GetIds()}},
			LoraName: p.GetLoraName(), CacheSalt: p.GetCacheSalt(), MmItems: p.GetMmItems()}
	}
	return l.Server.LongestPrefix(ctx, &kvindexv1.LongestPrefixRequest{Model: req.GetModel(), Prompt: p, CandidatePods: req.GetCandidatePods()})
}
