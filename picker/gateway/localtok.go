package gateway

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/api/server"
	"github.com/kvindex/kvindex/internal/promptinput"
	"github.com/kvindex/kvindex/tokenizer"
)

// What became of a prompt Config.Tokenizer was given, or kept from
// (kvindex_picker_local_tokenize_total): in every case but ok the
// prompt goes to the index as it came, which tokenizes it.
const (
	localOK          = "ok"          // tokenized in the picker
	localUnsupported = "unsupported" // declined: a form or request it cannot tokenize exactly
	localDisabled    = "disabled"    // its form is off (CheckTokenizer)
	localError       = "error"       // failed
)

// A form's state with Config.Tokenizer (kvindex_picker_local_tokenizer_verified).
const (
	formUnchecked int32 = -1 // not verified (yet): tokenized in the picker
	formOff       int32 = 0  // the engine tokenizes it otherwise, or the tokenizer does not do it: not tokenized in the picker
	formVerified  int32 = 1  // the same ids as an engine's: tokenized in the picker
)

// localTokenizer is Config.Tokenizer at work: what it did, and the state
// of each form (by tokenizer.Forms' order).
type localTokenizer struct {
	tok     tokenizer.Tokenizer
	model   string
	forms   [2]atomic.Int32
	results *prometheus.CounterVec
	// ids recycles the id buffers of prompts tokenized here (*[]uint64;
	// Service.release): a 16k-token chat's ids are 128 KiB a request.
	ids sync.Pool
}

// maxPooledIDs bounds the id buffers kept for reuse: one huge prompt's
// buffer is left to the garbage collector.
const maxPooledIDs = 1 << 18

func (lt *localTokenizer) getIDs() []uint64 {
	if p, ok := lt.ids.Get().(*[]uint64); ok {
		return (*p)[:0]
	}
	return nil
}

func (lt *localTokenizer) putIDs(ids []uint64) {
	if ids != nil && cap(ids) <= maxPooledIDs {
		ids = ids[:0]
		lt.ids.Put(&ids)
	}
}

func newLocalTokenizer(cfg *Config) (*localTokenizer, error) {
	if cfg.Tokenizer == nil {
		return nil, nil
	}
	lt := &localTokenizer{tok: cfg.Tokenizer, model: cfg.TokenizerModel, results: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvindex_picker_local_tokenize_total",
		Help: "Text and chat prompts the picker's own tokenizer (kvindex picker --tokenizer) was given, by result: ok (tokenized: sent to the index as block keys, or ids), unsupported (a request it cannot tokenize exactly, such as content parts or a request's own chat_template), disabled (its form is off: the startup check found the engine's ids differ, or the tokenizer has no chat template), error; all but ok go to the index as text, which tokenizes them.",
	}, []string{"result"})}
	for _, r := range []string{localOK, localUnsupported, localDisabled, localError} {
		lt.results.WithLabelValues(r)
	}
	// The tokenizer's own counters (its segment cache), named as kvindex
	// serve names its local tokenizer's.
	cs := []prometheus.Collector{lt.results, server.TokenizerMetrics{{Source: client.SourceLocal, Tokenizer: cfg.Tokenizer}}}
	for i, f := range tokenizer.Forms {
		lt.forms[i].Store(formUnchecked)
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "kvindex_picker_local_tokenizer_verified",
			Help:        "Whether the picker's own tokenizer gives an engine's ids (its /tokenize, on built-in samples, at start), by form (completion, chat): 1 the same (tokenized in the picker), 0 off (the ids differ, or the tokenizer does not do the form: such prompts go to the index as text), -1 not verified yet (tokenized in the picker).",
			ConstLabels: prometheus.Labels{"form": string(f)},
		}, func() float64 { return float64(lt.forms[i].Load()) }))
	}
	if cfg.Registry != nil {
		for _, c := range cs {
			if err := cfg.Registry.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return lt, nil
}

// formIndex is f's index in tokenizer.Forms.
func formIndex(f tokenizer.Form) int {
	if f == tokenizer.FormChat {
		return 1
	}
	return 0
}

// tokenize gives r's text or chat prompt token ids (r.Tokens, and the
// prompt sent as them) when the tokenizer can, so that the request takes
// the ids' way: hashed into block keys here. Otherwise r is left as it
// was, and the index tokenizes the prompt.
func (lt *localTokenizer) tokenize(ctx context.Context, s *Service, r *Request) {
	if r.Tokens != nil || (lt.model != "" && r.Model != lt.model) {
		return
	}
	in, ok, err := promptinput.Of(r.Prompt)
	if !ok {
		return
	}
	if err == nil && lt.forms[formIndex(tokenizer.FormOf(&in))].Load() == formOff {
		lt.results.WithLabelValues(localDisabled).Inc()
		return
	}
	var ids []uint64
	if err == nil {
		ids, err = s.tracedTokenize(ctx, lt.tok, lt.getIDs(), r.Model, in)
	}
	switch {
	case err == nil && len(ids) > 0:
		lt.results.WithLabelValues(localOK).Inc()
		r.Tokens, r.pooledIDs = ids, true
		r.Prompt = &kvindexv1.Prompt{Input: &kvindexv1.Prompt_Tokens{Tokens: &kvindexv1.TokenIds{Ids: ids}},
			LoraName: r.Prompt.GetLoraName(), CacheSalt: r.Prompt.GetCacheSalt()}
	case errors.Is(err, tokenizer.ErrChatUnsupported), errors.Is(err, tokenizer.ErrChatTemplate), errors.Is(err, tokenizer.ErrUnsupported):
		lt.results.WithLabelValues(localUnsupported).Inc()
	default:
		lt.results.WithLabelValues(localError).Inc()
		s.log.Debug("picker: tokenizing the prompt failed; the index tokenizes it", "model", r.Model, "err", err, "ids", len(ids))
	}
	if r.Tokens == nil {
		lt.putIDs(ids)
	}
}

// release recycles the ids the picker tokenized r's prompt into, once
// r's pick is over, unless they went to the index as ids (an in-process
// index takes them over: Local). r.Tokens and r.Prompt are then nil.
func (s *Service) release(r *Request) {
	if r == nil || !r.pooledIDs || r.idsSent || s.lt == nil {
		return
	}
	s.lt.putIDs(r.Tokens)
	r.Tokens, r.Prompt, r.pooledIDs = nil, nil, false
}

// CheckTokenizer verifies Config.Tokenizer against the engines: it
// compares its ids with an endpoint's own (tokenizer.CheckEngines, asking
// http://ADDR/tokenize, vLLM's), on built-in samples of each form, and
// asks the endpoints again, with backoff, until one answers. A form
// whose ids differ is tokenized by the index from then on (a WARN says
// which sample differed, and where): templates the engine renders
// differently (a custom --chat-template on vLLM) stay on the engine's
// /tokenize. Until an engine has answered, both forms are tokenized in
// the picker. It returns once each form has a verdict, or ctx ends;
// without a Tokenizer, at once. cfg.Model, when empty, is
// Config.TokenizerModel; cfg.Logger is the Service's.
func (s *Service) CheckTokenizer(ctx context.Context, cfg tokenizer.CheckConfig) {
	lt := s.lt
	if lt == nil {
		return
	}
	if cfg.Model == "" {
		cfg.Model = lt.model
	}
	cfg.Logger = s.log
	engines := func() []string {
		eps := s.set.Load().eps
		urls := make([]string, len(eps))
		for i, e := range eps {
			urls[i] = "http://" + e.Addr
		}
		return urls
	}
	rs, err := tokenizer.CheckEngines(ctx, lt.tok, engines, cfg)
	if err != nil {
		return // stopped before an engine answered
	}
	for i, f := range tokenizer.Forms {
		r, ok := tokenizer.FormResult(rs, f)
		if !ok {
			continue
		}
		switch r.Verdict {
		case tokenizer.Match:
			lt.forms[i].Store(formVerified)
			s.log.Info("picker: the local tokenizer gives the engine's ids; "+string(f)+" prompts are tokenized in the picker", "check", r.String())
		case tokenizer.LocalDeclined:
			lt.forms[i].Store(formOff)
			s.log.Info("picker: the local tokenizer does not tokenize "+string(f)+" prompts; the index does", "check", r.String())
		case tokenizer.EngineRefused:
			s.log.Warn("picker: the engine refused to tokenize the check's sample: the local tokenizer is not verified for "+string(f)+" prompts, and tokenizes them", "check", r.String())
		default: // Mismatch, LocalFailed
			lt.forms[i].Store(formOff)
			s.log.Warn("picker: the local tokenizer's ids differ from the engine's: "+string(f)+" prompts go to the index as text, for its tokenizer (the engine's /tokenize, with kvindex serve --tokenize-url)", "check", r.String())
		}
	}
}
