package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/internal/bytesize"
	"github.com/kvindex/kvindex/internal/service"
	"github.com/kvindex/kvindex/picker/gateway"
)

// pickerFlags are the flags of kvindex picker: where the index is, the
// picker's own flags (shared with kvindex serve --picker) and its HTTP
// address.
type pickerFlags struct {
	index    string
	pick     pickFlags
	httpAddr string
	sec      clientSecurityFlags
	discover discoverFlags
	budget   bytesize.Value
}

func (f *pickerFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.index, "index", client.DefaultAddr, "address of the kvindex gRPC API to ask: HOST[:PORT]")
	f.pick.register(fs)
	fs.StringVar(&f.httpAddr, "http-addr", ":9003", "address of the HTTP server: POST /v1/pick and /metrics; empty: none")
	f.sec.register(fs)
	f.discover.register(fs, false, true)
	memoryBudgetFlag(fs, &f.budget, "memory the picker may use", "")
}

func newPickerCmd() *cobra.Command {
	var f pickerFlags
	cmd := &cobra.Command{
		Use:   "picker --index HOST:PORT (--endpoint POD=HOST:PORT ... | --discover-selector LABELS)",
		Short: "Pick the engine for each inference request, for Envoy (ext_proc) or any gateway (HTTP)",
		Long: `picker is an endpoint picker for gateways. For each inference request it asks
kvindex (--index) which pods hold the prompt's prefix, scores the pods
(--endpoint) on the cached prefix, the requests it has in flight on each, the
session and the turn's priority, and says where the request goes.

Envoy and the gateways built on it (Envoy Gateway, Envoy AI Gateway, kgateway,
Istio, NGINX Gateway Fabric) call it over ext_proc on --extproc-addr, as the
Gateway API Inference Extension's Endpoint Picker Protocol defines: the
request's headers and body (OpenAI /v1/completions, /v1/chat/completions or
the Responses API) in, the header x-gateway-destination-endpoint and the
envoy.lb dynamic metadata out (and kvindex.picker's index_seq: the index
sequence of the answer the pick scored), honouring the gateway's subset
hint; 503 when no endpoint may serve. Other gateways POST the request body to /v1/pick on
--http-addr and read the same decision as JSON.

On Kubernetes, --discover-selector replaces --endpoint: the Ready pods the
selector picks are the candidates, each at the host:port of its
--discover-metrics URL (vLLM serves /metrics on its API port).

Headers: x-session-id names the conversation (else the Responses API's
previous_response_id does); x-request-priority: background marks a turn
nobody waits on.

The index is asked within --index-timeout; when it does not answer in time,
or fails, the request is routed by load and session alone, and
kvindex_picker_index_fallbacks_total counts it. The connection to the index
is opened and warmed before the first request, and again after each
reconnect, so that a connection's setup never lands on a request.

Every flag can also be set in a YAML --config file, keyed by flag name;
flags on the command line override the file.`,
		Example: `  kvindex picker --index kvindex:50051 \
      --endpoint pod-a=10.0.0.5:8000 --endpoint pod-b=10.0.0.6:8000
  curl -s localhost:9003/v1/pick -H 'x-session-id: s1' \
      -d '{"model":"Qwen/Qwen2.5-7B","messages":[{"role":"user","content":"hi"}]}'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := f.options()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			p, err := service.NewPicker(o, slog.Default())
			if err == nil {
				err = p.Run(ctx)
			}
			return configUsage(err, serveFlagNames)
		},
	}
	f.register(cmd.Flags())
	return cmd
}

func parseEndpoints(specs []string) ([]gateway.Endpoint, error) {
	if len(specs) == 0 {
		return nil, errors.New("give at least one --endpoint POD=HOST:PORT")
	}
	var eps []gateway.Endpoint
	for _, s := range specs {
		e, err := gateway.ParseEndpoint(s)
		if err != nil {
			return nil, fmt.Errorf("--endpoint: %w", err)
		}
		eps = append(eps, e)
	}
	return eps, nil
}

// options turns the flags into the picker service's options.
func (f *pickerFlags) options() (*service.PickerServiceOptions, error) {
	disc, err := f.discover.options()
	if err != nil {
		return nil, err
	}
	cfg, err := f.pick.config(disc != nil)
	if err != nil {
		return nil, err
	}
	cf := clientFlags{server: f.index, sec: f.sec}
	target, dial, err := cf.target()
	if err != nil {
		return nil, err
	}
	return &service.PickerServiceOptions{Picker: *f.pick.options(cfg), Index: target, Dial: dial,
		HTTPAddr: f.httpAddr, Discover: disc, MemoryBudget: int64(f.budget)}, nil
}
