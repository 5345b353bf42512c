package server

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// The spans the server records with Config.Tracer.
const (
	// SpanTokenize is one tokenizing of a text or chat prompt, by the
	// tokenizer backends in order.
	SpanTokenize = "kvindex.tokenize"
	// SpanIndexWalk is one longest-prefix walk of the index: the
	// prompt's blocks (hashed from its ids unless given as block
	// hashes) looked up in turn until no pod holds the next.
	SpanIndexWalk = "kvindex.index_walk"
)

// walk asks the index for st's query, in a SpanIndexWalk span when
// tracing.
func (s *Server) walk(ctx context.Context, st *queryState) error {
	if s.cfg.Tracer == nil {
		return s.index.LongestPrefix(&st.q, &st.res)
	}
	_, span := s.cfg.Tracer.Start(ctx, SpanIndexWalk, trace.WithAttributes(
		attribute.String("kvindex.model", st.q.Model),
		attribute.Int("kvindex.tokens", len(st.q.Tokens)),
		attribute.Int("kvindex.block_hashes", len(st.q.BlockHashes)),
		attribute.Int("kvindex.candidates", len(st.q.Candidates))))
	defer span.End()
	err := s.index.LongestPrefix(&st.q, &st.res)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		return err
	}
	best := 0
	for i := range st.res.Pods {
		best = max(best, st.res.Pods[i].MatchedBlocks)
	}
	span.SetAttributes(attribute.Int("kvindex.blocks_total", st.res.BlocksTotal),
		attribute.Int("kvindex.pods", len(st.res.Pods)), attribute.Int("kvindex.matched_blocks", best))
	return nil
}

// startTokenize starts a SpanTokenize span; nil when not tracing.
func (s *Server) startTokenize(ctx context.Context, model string) (context.Context, trace.Span) {
	if s.cfg.Tracer == nil {
		return ctx, nil
	}
	return s.cfg.Tracer.Start(ctx, SpanTokenize, trace.WithAttributes(attribute.String("kvindex.model", model)))
}

// endTokenize ends span (nil: not tracing) with what tokenizing gave.
func endTokenize(span trace.Span, ids int, source string, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	} else {
		span.SetAttributes(attribute.Int("kvindex.tokens", ids), attribute.String("kvindex.token_source", source))
	}
	span.End()
}
