package server

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/promptinput"
	"github.com/kvindex/kvindex/tokenizer"
)

// Tokenizer turns text and chat messages into token ids; the tokenizer
// package's backends implement it.
type Tokenizer = tokenizer.Tokenizer

// resolved describes where a query's blocks came from.
type resolved struct {
	tokens int
	source string
	// seq is the index sequence the answer reflects (Config.IndexSeq).
	seq uint64
}

// resolvePrompt validates p and fills q's input (tokens or block hashes,
// and the extras, stored in x) from it, tokenizing text and messages.
func (s *Server) resolvePrompt(ctx context.Context, p *kvindexv1.Prompt, model string, q *indexer.Query, x *blockhash.Extras) (resolved, error) {
	q.Tokens, q.BlockHashes, q.Extras = nil, nil, nil
	if p == nil || p.GetInput() == nil {
		return resolved{}, status.Error(codes.InvalidArgument, "prompt is required: set one of tokens, text, messages or block_hashes")
	}
	var r resolved
	switch in := p.GetInput().(type) {
	case *kvindexv1.Prompt_BlockHashes:
		if p.GetLoraName() != "" || p.GetCacheSalt() != "" || len(p.GetMmItems()) > 0 {
			return r, status.Error(codes.InvalidArgument, "lora_name, cache_salt and mm_items do not apply to block_hashes: they are already part of the hashes")
		}
		if err := s.checkHashDigest(in.BlockHashes.GetConfigDigest()); err != nil {
			return r, err
		}
		hs := in.BlockHashes.GetHashes()
		if limit := s.maxBlocks(); len(hs) > limit {
			return r, status.Errorf(codes.InvalidArgument, "prompt has %d block hashes; the limit is %d", len(hs), limit)
		}
		q.BlockHashes = hs
		return resolved{source: client.SourceHashes}, nil
	case *kvindexv1.Prompt_Tokens:
		q.Tokens = in.Tokens.GetIds()
		r.source = client.SourceCaller
	case *kvindexv1.Prompt_Text:
		ids, src, err := s.tokenize(ctx, model, tokenizer.Input{Prompt: in.Text})
		if err != nil {
			return r, err
		}
		q.Tokens, r.source = ids, src
	case *kvindexv1.Prompt_Messages:
		chat, err := promptinput.Chat(in.Messages)
		if err != nil {
			return r, status.Error(codes.InvalidArgument, err.Error())
		}
		ids, src, err := s.tokenize(ctx, model, chat)
		if err != nil {
			return r, err
		}
		q.Tokens, r.source = ids, src
	default:
		return r, status.Error(codes.InvalidArgument, "prompt has an unknown input kind")
	}
	if len(q.Tokens) > s.cfg.MaxTokens {
		return r, status.Errorf(codes.InvalidArgument, "prompt has %d tokens; the limit is %d", len(q.Tokens), s.cfg.MaxTokens)
	}
	r.tokens = len(q.Tokens)
	if err := fillExtras(p, len(q.Tokens), x); err != nil {
		return r, err
	}
	if p.GetLoraName() != "" || p.GetCacheSalt() != "" || len(p.GetMmItems()) > 0 {
		q.Extras = x
	}
	return r, nil
}

// checkHashDigest refuses block hashes made with another hashing than the
// index's (a digest d of 0 says nothing and is not checked): their keys
// would match nothing, or worse, the wrong blocks, without a word.
func (s *Server) checkHashDigest(d uint64) error {
	switch {
	case d == 0 || s.hashing != nil && d == s.hashing.GetDigest():
		return nil
	case s.hashing == nil:
		return status.Errorf(codes.FailedPrecondition, "block hashes with config_digest %x: this kvindex does not say how it hashes; send token ids", d)
	}
	h := s.hashing
	return status.Errorf(codes.FailedPrecondition, "block hashes with config_digest %x were not made with this kvindex's hashing (algo %s, seed %q, block size %d, digest %x): call GetHashConfig again, or send token ids",
		d, h.GetAlgo(), h.GetSeed(), h.GetBlockSize(), h.GetDigest())
}

// maxBlocks bounds the block hashes of a query as MaxTokens bounds tokens.
func (s *Server) maxBlocks() int { return max(s.cfg.MaxTokens/s.cfg.BlockSize, 1) }

// fillExtras copies p's hash-affecting inputs into x, reusing x.MM.
func fillExtras(p *kvindexv1.Prompt, tokens int, x *blockhash.Extras) error {
	x.LoRAName, x.CacheSalt, x.LegacyMM, x.PromptEmbeds = p.GetLoraName(), p.GetCacheSalt(), false, nil
	x.MM = x.MM[:0]
	for i, m := range p.GetMmItems() {
		switch {
		case m.GetIdentifier() == "":
			return status.Errorf(codes.InvalidArgument, "mm_items[%d] has no identifier", i)
		case m.GetLength() == 0:
			return status.Errorf(codes.InvalidArgument, "mm_items[%d] has length 0", i)
		case uint64(m.GetOffset())+uint64(m.GetLength()) > uint64(tokens):
			return status.Errorf(codes.InvalidArgument, "mm_items[%d] covers tokens %d..%d, beyond the prompt's %d tokens",
				i, m.GetOffset(), uint64(m.GetOffset())+uint64(m.GetLength()), tokens)
		case i > 0 && m.GetOffset() < p.GetMmItems()[i-1].GetOffset()+p.GetMmItems()[i-1].GetLength():
			return status.Errorf(codes.InvalidArgument, "mm_items[%d] overlaps or precedes mm_items[%d]; items must be sorted by offset", i, i-1)
		}
		x.MM = append(x.MM, blockhash.MMItem{Identifier: m.GetIdentifier(), Offset: int(m.GetOffset()), Length: int(m.GetLength())})
	}
	return nil
}

// tokenize runs the tokenizer backends in order and maps their failure to
// a status: Unavailable if a backend could not be reached (or failed on
// its side), InvalidArgument for input a backend refused, and
// FailedPrecondition if no backend can do it at all (a chat prompt with
// only a local tokenizer).
func (s *Server) tokenize(ctx context.Context, model string, in tokenizer.Input) (ids []uint64, source string, err error) {
	if s.cfg.Tracer != nil {
		var span trace.Span
		ctx, span = s.startTokenize(ctx, model)
		defer func() { endTokenize(span, len(ids), source, err) }()
	}
	return s.tokenizeBackends(ctx, model, in)
}

// tokenizeBackends is tokenize's work.
func (s *Server) tokenizeBackends(ctx context.Context, model string, in tokenizer.Input) ([]uint64, string, error) {
	if len(s.cfg.Tokenizers) == 0 {
		return nil, "", status.Error(codes.FailedPrecondition,
			"text and chat prompts need a tokenizer: this kvindex has none (neither the engine's /tokenize nor a local tokenizer.json); send token ids")
	}
	code := codes.FailedPrecondition
	var msgs []string
	for _, t := range s.cfg.Tokenizers {
		ids, err := t.Tokenizer.Tokenize(ctx, model, in)
		s.metrics.observeTokenize(t.Source, err)
		if err == nil {
			return ids, t.Source, nil
		}
		if ctx.Err() != nil {
			return nil, "", status.FromContextError(ctx.Err()).Err()
		}
		var se *tokenizer.StatusError
		switch {
		case errors.Is(err, tokenizer.ErrInvalidInput):
			return nil, "", status.Error(codes.InvalidArgument, err.Error())
		case errors.Is(err, tokenizer.ErrResponseTooLarge),
			errors.As(err, &se) && se.StatusCode >= 400 && se.StatusCode < 500:
			// The engine refused this prompt (too long, unknown model).
			if code == codes.FailedPrecondition {
				code = codes.InvalidArgument
			}
		case errors.Is(err, tokenizer.ErrChatTemplate), errors.Is(err, tokenizer.ErrUnsupported):
		default:
			code = codes.Unavailable // unreachable, timed out, 5xx
		}
		msgs = append(msgs, tokenizeProblem(t, err))
	}
	return nil, "", tokenizeError(code, msgs)
}
