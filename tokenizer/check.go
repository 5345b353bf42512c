package tokenizer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"
)

// Form is an input's form: what the check verifies separately, since a
// chat template can differ where the tokenizer agrees.
type Form string

const (
	FormCompletion Form = "completion"
	FormChat       Form = "chat"
)

// Forms are the forms, in the order the check reports them.
var Forms = []Form{FormCompletion, FormChat}

// FormOf is in's form.
func FormOf(in *Input) Form {
	if in.IsChat() {
		return FormChat
	}
	return FormCompletion
}

// CheckSample is one input the check tokenizes both ways.
type CheckSample struct {
	Name  string
	Input Input
}

// CheckSamples are the check's built-in inputs: a completion prompt
// (ASCII, digits, whitespace runs and multi-byte text, where byte-level
// BPE implementations part ways), and a chat with a system prompt, two
// user turns and an assistant's, ending with the generation prompt, as
// most chat requests are.
func CheckSamples() []CheckSample {
	return []CheckSample{
		{Name: "completion", Input: Input{Prompt: "The quick brown fox jumps over the lazy dog, 1234567 times.\n\n\tdéjà vu — naïve café, 東京 😀 ok?"}},
		{Name: "chat", Input: Input{
			Messages: []Message{
				{Role: "system", Content: "You are a helpful assistant."},
				{Role: "user", Content: "What is the capital of France?"},
				{Role: "assistant", Content: "Paris."},
				{Role: "user", Content: "And of Japan?"},
			},
			ChatParams: json.RawMessage(`{"add_generation_prompt":true}`),
		}},
	}
}

// Verdict is what the check concluded of a sample.
type Verdict int

const (
	// Unchecked: no engine has answered for the sample yet.
	Unchecked Verdict = iota
	// Match: the local ids are the engine's.
	Match
	// Mismatch: they differ (CheckResult.Pos says where).
	Mismatch
	// LocalDeclined: the local tokenizer does not do the sample's form
	// (ErrChatTemplate: no chat template; ErrChatUnsupported), so it is
	// never used for it.
	LocalDeclined
	// LocalFailed: the local tokenizer failed on the sample otherwise.
	LocalFailed
	// EngineRefused: the engine answered the sample with a client error
	// (HTTP 4xx): it cannot be compared, and asking again would not help.
	EngineRefused
)

var verdictNames = [...]string{"unchecked", "match", "mismatch", "local_declined", "local_failed", "engine_refused"}

func (v Verdict) String() string {
	if int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return fmt.Sprintf("Verdict(%d)", int(v))
}

// final reports whether asking another engine cannot change v.
func (v Verdict) final() bool { return v != Unchecked }

// CheckResult is the check of one sample.
type CheckResult struct {
	Sample  string
	Form    Form
	Verdict Verdict
	// Pos is where the ids first differ (Mismatch): an index into both,
	// or the length of the shorter when one is a prefix of the other.
	Pos int
	// Local and Engine are the ids each side gave (nil when it failed).
	Local, Engine []uint64
	// EngineURL is the engine last asked for the sample.
	EngineURL string
	// Err is why the sample was not compared: the local tokenizer's
	// error, or the engine's.
	Err error
}

// String says what the result is, for logs.
func (r CheckResult) String() string {
	switch r.Verdict {
	case Match:
		return fmt.Sprintf("sample %q (%s): %d ids, the same as engine %s's", r.Sample, r.Form, len(r.Local), r.EngineURL)
	case Mismatch:
		return fmt.Sprintf("sample %q (%s): the ids differ first at position %d (local %d ids, engine %s %d): local %v, engine %v",
			r.Sample, r.Form, r.Pos, len(r.Local), r.EngineURL, len(r.Engine), around(r.Local, r.Pos), around(r.Engine, r.Pos))
	}
	return fmt.Sprintf("sample %q (%s): %s: %v", r.Sample, r.Form, r.Verdict, r.Err)
}

// around is the ids from a few before pos to a few after, for logs.
func around(ids []uint64, pos int) []uint64 {
	return ids[min(max(pos-3, 0), len(ids)):min(pos+4, len(ids))]
}

// FirstDiff is the first position where a and b differ, -1 when they
// are equal (the shorter's length when one is a prefix of the other).
func FirstDiff(a, b []uint64) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// FormResult is the result that decides form f among rs: the first
// mismatch or local failure (the form must not be tokenized locally),
// else the first sample still unchecked or refused by the engine (not
// known), else the first the local tokenizer declined, else a match. ok
// is false when rs has no sample of the form.
func FormResult(rs []CheckResult, f Form) (r CheckResult, ok bool) {
	rank := func(v Verdict) int {
		switch v {
		case Mismatch, LocalFailed:
			return 0
		case Unchecked, EngineRefused:
			return 1
		case LocalDeclined:
			return 2
		}
		return 3
	}
	for _, x := range rs {
		if x.Form == f && (!ok || rank(x.Verdict) < rank(r.Verdict)) {
			r, ok = x, true
		}
	}
	return r, ok
}

// compareLocal is the sample's result once the local side is known:
// Unchecked, with its ids, unless the local tokenizer declined or failed.
func compareLocal(ctx context.Context, local Tokenizer, model string, s CheckSample) CheckResult {
	r := CheckResult{Sample: s.Name, Form: FormOf(&s.Input)}
	ids, err := local.Tokenize(ctx, model, s.Input)
	switch {
	case errors.Is(err, ErrChatTemplate), errors.Is(err, ErrChatUnsupported):
		r.Verdict, r.Err = LocalDeclined, err
	case err != nil && ctx.Err() != nil:
		r.Err = err // not the tokenizer's failure: asked again next round
	case err != nil:
		r.Verdict, r.Err = LocalFailed, err
	default:
		r.Local = ids
	}
	return r
}

// compareEngine completes r, whose local ids are known, with engine's.
func compareEngine(ctx context.Context, engine *HTTP, model string, r CheckResult, in Input) CheckResult {
	ids, err := engine.Tokenize(ctx, model, in)
	r.EngineURL = engine.URL()
	if err != nil {
		r.Err = err
		var se *StatusError
		if errors.As(err, &se) && se.StatusCode >= 400 && se.StatusCode < 500 || errors.Is(err, ErrInvalidInput) {
			r.Verdict = EngineRefused
		}
		return r
	}
	r.Engine, r.Err = ids, nil
	if r.Pos = FirstDiff(r.Local, ids); r.Pos >= 0 {
		r.Verdict = Mismatch
	} else {
		r.Verdict, r.Pos = Match, 0
	}
	return r
}

// CheckConfig configures CheckEngines; the zero value is usable.
type CheckConfig struct {
	// Model is named in the requests to the engines ("" names none:
	// vLLM then tokenizes for the model it serves).
	Model string
	// Samples are the inputs compared (CheckSamples if nil).
	Samples []CheckSample
	// RetryMin and RetryMax bound the wait between rounds while some
	// sample is unchecked: it starts at RetryMin and doubles up to
	// RetryMax (DefaultCheckRetryMin and DefaultCheckRetryMax if 0).
	RetryMin, RetryMax time.Duration
	// Timeout bounds each request to an engine (HTTPConfig's default if
	// 0).
	Timeout time.Duration
	// Logger hears, at debug level, of each round that left a sample
	// unchecked; none if nil.
	Logger *slog.Logger
}

// The wait between CheckEngines' rounds.
const (
	DefaultCheckRetryMin = time.Second
	DefaultCheckRetryMax = 30 * time.Second
)

// CheckEngines compares local's tokenization of the samples with the
// engines' own (their /tokenize, as HTTP asks it), so that a local
// tokenizer or chat template that differs from what the engines run is
// caught: its ids would match none of the engines' cached blocks. Each
// round asks the engines engines() lists (base URLs, e.g.
// http://10.0.0.5:8000) in turn, each for the samples still unchecked,
// until every sample has a verdict; between rounds it waits, with
// backoff. It returns the results once every sample has a verdict, or
// the results so far and ctx's error when ctx ends first.
func CheckEngines(ctx context.Context, local Tokenizer, engines func() []string, cfg CheckConfig) ([]CheckResult, error) {
	samples := cfg.Samples
	if samples == nil {
		samples = CheckSamples()
	}
	wait, maxWait := cfg.RetryMin, cfg.RetryMax
	if wait <= 0 {
		wait = DefaultCheckRetryMin
	}
	if maxWait <= 0 {
		maxWait = DefaultCheckRetryMax
	}
	out := make([]CheckResult, len(samples))
	haveLocal := make([]bool, len(samples))
	client := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	defer client.CloseIdleConnections()
	for {
		for i, s := range samples {
			if !haveLocal[i] {
				out[i] = compareLocal(ctx, local, cfg.Model, s)
				haveLocal[i] = out[i].Verdict.final() || out[i].Err == nil
			}
		}
		urls := engines()
		for _, u := range urls {
			if done(out) {
				break
			}
			engine, err := NewHTTP(HTTPConfig{BaseURL: u, CacheEntries: -1, Timeout: cfg.Timeout, Client: client})
			if err != nil {
				if cfg.Logger != nil {
					cfg.Logger.Debug("tokenizer check: engine skipped", "engine", u, "err", err)
				}
				continue
			}
			for i, s := range samples {
				if haveLocal[i] && !out[i].Verdict.final() {
					out[i] = compareEngine(ctx, engine, cfg.Model, out[i], s.Input)
				}
			}
		}
		if done(out) {
			return out, nil
		}
		if cfg.Logger != nil {
			var errs []string
			for _, r := range out {
				if !r.Verdict.final() {
					errs = append(errs, fmt.Sprint(r.Err))
				}
			}
			cfg.Logger.Debug("tokenizer check: no engine answered /tokenize yet; trying again", "engines", len(urls), "retry_in", wait, "errs", slices.Compact(errs))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return out, ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, maxWait)
	}
}

func done(rs []CheckResult) bool {
	return !slices.ContainsFunc(rs, func(r CheckResult) bool { return !r.Verdict.final() })
}
