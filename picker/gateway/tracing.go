package gateway

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/picker"
	"github.com/kvindex/kvindex/tokenizer"
)

// The spans the picker records with Config.Tracer.
const (
	// SpanPick is one pick: reading the index's answer and scoring the
	// candidates.
	SpanPick = "kvindex.pick"
	// SpanTokenize is the picker's own tokenizing of a text or chat
	// prompt (Config.Tokenizer).
	SpanTokenize = "kvindex.tokenize"
	// SpanHash is the picker's hashing of a prompt's ids into the
	// index's block keys.
	SpanHash = "kvindex.hash"
)

// traceContext is the W3C trace context (traceparent, tracestate) the
// gateway puts among the request's headers.
var traceContext propagation.TraceContext

// requestContext is ctx carrying the trace context of the request whose
// headers (by lower-case name) are hdr, when tracing: the pick's span is
// then a child of the gateway's.
func (s *Service) requestContext(ctx context.Context, hdr map[string]string) context.Context {
	if s.cfg.Tracer == nil || hdr["traceparent"] == "" {
		return ctx
	}
	return traceContext.Extract(ctx, propagation.MapCarrier(hdr))
}

// startPick starts r's SpanPick span (r may be nil: a request without a
// body).
func (s *Service) startPick(ctx context.Context, r *Request) (context.Context, trace.Span) {
	var attrs []attribute.KeyValue
	if r != nil {
		attrs = append(attrs, attribute.String("kvindex.model", r.Model), attribute.Bool("kvindex.session", r.Session != ""))
	}
	return s.cfg.Tracer.Start(ctx, SpanPick, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
}

// endPick ends span with the decision, or the error.
func endPick(span trace.Span, d picker.Decision, err error) {
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	} else {
		attrs := []attribute.KeyValue{attribute.String("kvindex.pod", d.Pod), attribute.String("kvindex.endpoint", d.Endpoint),
			attribute.Int64("kvindex.index_seq", int64(d.IndexSeq))}
		if d.Fallback != "" {
			attrs = append(attrs, attribute.String("kvindex.fallback", string(d.Fallback)))
		}
		for _, sc := range d.Scores {
			if sc.Pod == d.Pod {
				attrs = append(attrs, attribute.Int("kvindex.matched_tokens", sc.MatchedTokens))
				break
			}
		}
		span.SetAttributes(attrs...)
	}
	span.End()
}

// tracedTokenize appends tok's ids for in to dst (tokenizer.AppendTokenize),
// in a SpanTokenize span when tracing.
func (s *Service) tracedTokenize(ctx context.Context, tok tokenizer.Tokenizer, dst []uint64, model string, in tokenizer.Input) ([]uint64, error) {
	if s.cfg.Tracer == nil {
		return tokenizer.AppendTokenize(ctx, tok, dst, model, in)
	}
	ctx, span := s.cfg.Tracer.Start(ctx, SpanTokenize, trace.WithAttributes(attribute.String("kvindex.model", model)))
	defer span.End()
	ids, err := tokenizer.AppendTokenize(ctx, tok, dst, model, in)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.SetAttributes(attribute.Int("kvindex.tokens", len(ids)))
	return ids, err
}

// tracedHashedPrompt is hashedPrompt, in a SpanHash span when tracing
// and there are ids to hash.
func (s *Service) tracedHashedPrompt(ctx context.Context, r *Request) (*hashing, *kvindexv1.Prompt) {
	if s.cfg.Tracer == nil || r.Tokens == nil {
		return s.hashedPrompt(r)
	}
	_, span := s.cfg.Tracer.Start(ctx, SpanHash, trace.WithAttributes(attribute.Int("kvindex.tokens", len(r.Tokens))))
	defer span.End()
	hs, p := s.hashedPrompt(r)
	span.SetAttributes(attribute.Int("kvindex.blocks", len(p.GetBlockHashes().GetHashes())), attribute.Bool("kvindex.hashed", p != nil))
	return hs, p
}
