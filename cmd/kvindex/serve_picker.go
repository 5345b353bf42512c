package main

import (
	"errors"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/internal/service"
	"github.com/kvindex/kvindex/picker/enginemetrics"
	"github.com/kvindex/kvindex/picker/gateway"
)

// pickFlags are the endpoint picker's flags, the same in kvindex picker
// and kvindex serve --picker.
type pickFlags struct {
	endpoints    []string
	extprocAddr  string
	indexTimeout time.Duration
	maxBody      int
	pickHold     time.Duration
	// scrapeInterval: how often the endpoints' /metrics are read.
	scrapeInterval time.Duration
}

func (f *pickFlags) register(fs *pflag.FlagSet) {
	fs.StringArrayVar(&f.endpoints, "endpoint", nil, "a pod requests may go to, POD=HOST:PORT: its name as kvindex knows it and its inference address (repeatable)")
	fs.StringVar(&f.extprocAddr, "extproc-addr", ":9002", "address of the Envoy ext_proc gRPC server (Endpoint Picker Protocol, with gRPC health)")
	fs.DurationVar(&f.indexTimeout, "index-timeout", gateway.DefaultIndexTimeout, "deadline of each index query; past it the request is routed by load and session only")
	fs.IntVar(&f.maxBody, "max-body", gateway.DefaultMaxBody, "largest request body read, in bytes (larger: 413); the bodies buffered at once are bounded at 4 of this size, or the --memory-budget share (beyond: 429)")
	fs.DurationVar(&f.scrapeInterval, "scrape-interval", enginemetrics.DefaultInterval, "how often each --endpoint's http://HOST:PORT/metrics (vLLM's queue, KV usage and prefix-cache counters) is read for the load score and kvindex_fleet_cached_fraction; 0: never")
	fs.DurationVar(&f.pickHold, "pick-hold", gateway.DefaultPickHold, "how long a /v1/pick decision counts as in flight on its pod (its caller never reports the end)")
}

// config validates the flags into the picker's configuration. With
// discovered (--discover-selector) the candidates come from Kubernetes
// and --endpoint is refused.
func (f *pickFlags) config(discovered bool) (gateway.Config, error) {
	cfg := gateway.Config{Dynamic: discovered, IndexTimeout: f.indexTimeout, MaxBody: f.maxBody, PickHold: f.pickHold}
	var err error
	if discovered && len(f.endpoints) > 0 {
		return cfg, errors.New("--endpoint and --discover-selector: give one (the candidates are either listed or discovered)")
	} else if !discovered {
		if cfg.Endpoints, err = parseEndpoints(f.endpoints); err != nil {
			return cfg, err
		}
	}
	if f.extprocAddr == "" {
		return cfg, errors.New("--extproc-addr must not be empty")
	}
	return cfg, nil
}

// options are the picker's options with configuration cfg.
func (f *pickFlags) options(cfg gateway.Config) *service.PickerOptions {
	return &service.PickerOptions{Gateway: cfg, ExtProcAddr: f.extprocAddr, ScrapeInterval: f.scrapeInterval}
}

// pickerOptions validates serve's picker flags: nil without --picker,
// where giving any of them is a mistake.
func (f *serveFlags) pickerOptions(discovered bool) (*service.PickerOptions, error) {
	if !f.picker {
		if len(f.pick.endpoints) > 0 {
			return nil, usagef("--endpoint needs --picker")
		}
		return nil, nil
	}
	cfg, err := f.pick.config(discovered)
	if err != nil {
		return nil, usagef("--picker: %v", err)
	}
	return f.pick.options(cfg), nil
}
