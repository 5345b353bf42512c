package service

import (
	"cmp"
	"context"
	"errors"
	"log/slog"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/api/server"
	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/internal/promptinput"
	"github.com/kvindex/kvindex/tokenizer"
	"github.com/kvindex/kvindex/tokenizer/chattemplate"
)

// LoadLocalTokenizer opens a local tokenizer (kvindex serve's, kvindex
// picker's and kvindex hash's): the tokenizer.json at
// file, with the chat template at chatTemplate when set (for chat
// prompts too), keeping the ids of the text between special tokens in a
// segment cache of cacheBytes (tokenizer.Local.WithSegmentCache), so
// that a conversation's next turn encodes only what is new. Its errors
// name the options TokenizerFile and ChatTemplateFile, kvindex serve's
// and kvindex picker's alike.
func LoadLocalTokenizer(file, chatTemplate string, cacheBytes int64) (tokenizer.Tokenizer, error) {
	if file == "" {
		return nil, configerr.New("ChatTemplateFile", "%v needs %v: the template renders the text that tokenizer encodes", configerr.Field("ChatTemplateFile"), configerr.Field("TokenizerFile"))
	}
	t, err := tokenizer.LoadFile(file)
	if err != nil {
		// The cause: the file is named already.
		return nil, configerr.New("TokenizerFile", "%v %s: %w", configerr.Field("TokenizerFile"), file, cmp.Or(errors.Unwrap(err), err))
	}
	t = t.WithSegmentCache(cacheBytes)
	if chatTemplate == "" {
		return t, nil
	}
	tmpl, err := chattemplate.Load(chatTemplate, nil)
	if err != nil {
		return nil, configerr.New("ChatTemplateFile", "%v: %v", configerr.Field("ChatTemplateFile"), err)
	}
	return &tokenizer.ChatLocal{Local: t, Template: tmpl}, nil
}

// TokenizeLocally renders and tokenizes p with the local tokenizer at
// file (with the chat template at chatTemplate for chat prompts), as
// kvindex serve and kvindex picker do: kvindex hash --tokenizer.
func TokenizeLocally(ctx context.Context, file, chatTemplate string, p *kvindexv1.Prompt) ([]uint64, error) {
	t, err := LoadLocalTokenizer(file, chatTemplate, 0)
	if err != nil {
		return nil, err
	}
	in, _, err := promptinput.Of(p)
	if err != nil {
		return nil, err
	}
	return t.Tokenize(ctx, "", in)
}

// localTokenizerSummary says what LoadLocalTokenizer opens.
func localTokenizerSummary(file, chatTemplate string) string {
	if chatTemplate == "" {
		return file
	}
	return file + " with chat template " + chatTemplate
}

// checkServeTokenizer compares kvindex serve's local tokenizer, its
// fallback, with the engine's /tokenize (tokenizer.CheckEngines), once
// the engine answers, and logs the verdict of each form: a local
// tokenizer that differs would give, while the engine is unreachable,
// ids that match none of the engines' blocks. It hands the verdicts to
// store, for ListPods.
func checkServeTokenizer(ctx context.Context, local tokenizer.Tokenizer, o *Options, log *slog.Logger, store func([]server.TokenizerCheck)) {
	rs, err := tokenizer.CheckEngines(ctx, local, func() []string { return []string{o.TokenizeURL} }, tokenizer.CheckConfig{Model: o.Model, Logger: log})
	if err != nil {
		return // stopped first
	}
	var checks []server.TokenizerCheck
	for _, f := range tokenizer.Forms {
		r, _ := tokenizer.FormResult(rs, f)
		checks = append(checks, server.TokenizerCheck{Form: string(f), Verdict: r.Verdict.String(), Detail: r.String(),
			Disagrees: r.Verdict == tokenizer.Mismatch || r.Verdict == tokenizer.LocalFailed})
		switch r.Verdict {
		case tokenizer.Match, tokenizer.LocalDeclined:
			log.Info("tokenizer check: the local tokenizer against the engine's /tokenize", "form", f, "verdict", r.Verdict.String(), "check", r.String())
		case tokenizer.EngineRefused:
			log.Warn("tokenizer check: the engine refused the check's sample; the local tokenizer is not verified", "form", f, "check", r.String())
		default:
			log.Warn("tokenizer check: the local tokenizer (the fallback when the engine's /tokenize fails) does not give the engine's ids: its queries would match nothing",
				"form", f, "verdict", r.Verdict.String(), "check", r.String())
		}
	}
	store(checks)
}
