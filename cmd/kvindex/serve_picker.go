package main

import (
	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/internal/service"
	"github.com/kvindex/kvindex/picker/enginemetrics"
	"github.com/kvindex/kvindex/picker/gateway"
)

// pickFlags are the endpoint picker's flags, the same in kvindex picker
// and kvindex serve --picker; the service checks them
// (service.PickerSettings.Options).
type pickFlags struct{ service.PickerSettings }

func (f *pickFlags) register(fs *pflag.FlagSet) {
	fs.StringArrayVar(&f.Endpoints, "endpoint", nil, "a pod requests may go to, POD=HOST:PORT: its name as kvindex knows it and its inference address (repeatable)")
	fs.StringVar(&f.ExtProcAddr, "extproc-addr", ":9002", "address of the Envoy ext_proc gRPC server (Endpoint Picker Protocol, with gRPC health and reflection)")
	fs.DurationVar(&f.IndexTimeout, "index-timeout", gateway.DefaultIndexTimeout, "deadline of each index query, plus --index-timeout-per-1k per 1,000 prompt tokens (text: bytes/4); past it the request is routed by load and session only")
	fs.DurationVar(&f.IndexTimeoutPer1K, "index-timeout-per-1k", gateway.DefaultIndexTimeoutPer1K, "what the index deadline grows by per 1,000 prompt tokens (negative: a fixed --index-timeout)")
	fs.IntVar(&f.MaxBody, "max-body", gateway.DefaultMaxBody, "largest request body read, in bytes (larger: 413); the bodies buffered at once are bounded at 4 of this size, or the --memory-budget share (beyond: 429)")
	fs.DurationVar(&f.ScrapeInterval, "scrape-interval", enginemetrics.DefaultInterval, "how often each --endpoint's http://HOST:PORT/metrics (vLLM's queue, KV usage and prefix-cache counters) is read for the load score and kvindex_fleet_cached_fraction; 0: never")
	fs.DurationVar(&f.PickHold, "pick-hold", gateway.DefaultPickHold, "how long a /v1/pick decision counts as in flight on its pod (its caller never reports the end)")
	fs.StringVar(&f.UnknownModel, "unknown-model", string(gateway.UnknownModelRoute), "ext_proc, for a model the index does not know: route (by load and session, header x-kvindex-fallback: unknown_model) or reject (404 at once); /v1/pick always answers 404")
}

// pickerOptions validates serve's picker flags: nil without --picker,
// where giving any of them is a mistake.
func (f *serveFlags) pickerOptions(discovered bool) (*service.PickerOptions, error) {
	if !f.picker {
		if len(f.pick.Endpoints) > 0 {
			return nil, usagef("--endpoint needs --picker")
		}
		return nil, nil
	}
	o := new(service.PickerOptions)
	if err := f.pick.Options(discovered, o); err != nil {
		return nil, usagef("--picker: %v", configUsage(err, serveFlagNames))
	}
	return o, nil
}
