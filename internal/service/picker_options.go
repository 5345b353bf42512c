package service

import (
	"cmp"
	"fmt"
	"io"
	"time"

	"github.com/kvindex/kvindex/internal/bytesize"
	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/picker/gateway"
)

// PickerSettings are the endpoint picker's settings as kvindex picker and
// kvindex serve --picker take them, before they are checked (Options).
type PickerSettings struct {
	// Endpoints are the candidates, each "POD=HOST:PORT".
	Endpoints    []string
	ExtProcAddr  string
	IndexTimeout time.Duration
	// IndexTimeoutPer1K grows IndexTimeout with the prompt
	// (gateway.IndexBudget).
	IndexTimeoutPer1K time.Duration
	MaxBody           int
	PickHold          time.Duration
	ScrapeInterval    time.Duration
	// UnknownModel is gateway.UnknownModel's "route" or "reject".
	UnknownModel string
}

// Options checks the settings into the picker's options o. With
// discovered the candidates come from discovery, and listing any is an
// error; without, at least one must be listed.
func (s *PickerSettings) Options(discovered bool, o *PickerOptions) error {
	cfg := gateway.Config{Dynamic: discovered, IndexTimeout: s.IndexTimeout, IndexTimeoutPer1K: s.IndexTimeoutPer1K, MaxBody: s.MaxBody, PickHold: s.PickHold}
	switch {
	case discovered && len(s.Endpoints) > 0:
		return configerr.New("Picker.Endpoints", "%v and %v: give one (the candidates are either listed or discovered)", configerr.Field("Picker.Endpoints"), configerr.Field("Discover"))
	case !discovered && len(s.Endpoints) == 0:
		return configerr.New("Picker.Endpoints", "give at least one %v POD=HOST:PORT", configerr.Field("Picker.Endpoints"))
	case s.ExtProcAddr == "":
		return configerr.New("Picker.ExtProcAddr", "%v must not be empty", configerr.Field("Picker.ExtProcAddr"))
	}
	for _, spec := range s.Endpoints {
		e, err := gateway.ParseEndpoint(spec)
		if err != nil {
			return configerr.New("Picker.Endpoints", "%v: %v", configerr.Field("Picker.Endpoints"), err)
		}
		cfg.Endpoints = append(cfg.Endpoints, e)
	}
	var err error
	if cfg.UnknownModel, err = gateway.ParseUnknownModel(s.UnknownModel); err != nil {
		return configerr.New("Picker.UnknownModel", "%v %q: %v", configerr.Field("Picker.UnknownModel"), s.UnknownModel, err)
	}
	o.Gateway, o.ExtProcAddr, o.ScrapeInterval = cfg, s.ExtProcAddr, s.ScrapeInterval
	return nil
}

// CheckPicker builds the picker's configuration from o without
// connecting or listening, and writes what kvindex picker would run.
func CheckPicker(w io.Writer, o *PickerServiceOptions) error {
	if o.Discover != nil {
		if err := o.Discover.Validate(); err != nil {
			return err
		}
	}
	if err := o.localTokenizer(); err != nil {
		return err
	}
	cfg := o.Picker.Gateway
	cfg.MemoryBudget = o.MemoryBudget
	svc, err := gateway.New(cfg, gateway.Local{}) // checks the configuration; never asked
	if err != nil {
		return configerr.New("Picker", "%v", err)
	}
	g := &o.Picker.Gateway
	fmt.Fprintf(w, "settings ok: index %s, ext_proc %s, HTTP %s, index timeout %v + %v per 1k tokens, max body %d, unknown model %s, memory budget %s\n",
		o.Index, o.Picker.ExtProcAddr, cmp.Or(o.HTTPAddr, "none"), cmp.Or(g.IndexTimeout, gateway.DefaultIndexTimeout), max(cmp.Or(g.IndexTimeoutPer1K, gateway.DefaultIndexTimeoutPer1K), 0),
		svc.MaxBody(), cmp.Or(g.UnknownModel, gateway.UnknownModelRoute), bytesize.Format(o.MemoryBudget))
	for _, e := range g.Endpoints {
		fmt.Fprintf(w, "  endpoint %s: %s\n", e.Pod, e.Addr)
	}
	if d := o.Discover; d != nil {
		fmt.Fprintf(w, "  discover pods %s in namespace %s, at %s\n", d.Selector, cmp.Or(d.Namespace, "(kvindex's own)"), d.Metrics)
	}
	fmt.Fprintf(w, "  tokenizer: %s\n", pickerTokenizerSummary(o))
	if o.Tracing.Enabled() {
		fmt.Fprintf(w, "  tracing: %s\n", o.Tracing)
	}
	return nil
}

// pickerTokenizerSummary says who tokenizes text and chat prompts.
func pickerTokenizerSummary(o *PickerServiceOptions) string {
	if o.TokenizerFile == "" {
		return "the index (text and chat prompts are sent as they are)"
	}
	s := "local " + localTokenizerSummary(o.TokenizerFile, o.ChatTemplateFile)
	if o.ChatTemplateFile == "" {
		s += " (chat prompts: the index)"
	}
	if o.TokenizerModel != "" {
		s += ", for model " + o.TokenizerModel + " (other models: the index)"
	}
	return s + ", checked at start against an endpoint's /tokenize"
}
