package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"

	"github.com/kvindex/kvindex/api/client"
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
}

func (f *pickerFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.index, "index", client.DefaultAddr, "address of the kvindex gRPC API to ask: HOST[:PORT]")
	f.pick.register(fs)
	fs.StringVar(&f.httpAddr, "http-addr", ":9003", "address of the HTTP server: POST /v1/pick and /metrics; empty: none")
	f.sec.register(fs)
	f.discover.register(fs, false, true)
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
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			disc, err := f.discover.options()
			if err != nil {
				return err
			}
			cfg, err := f.pick.config(disc != nil)
			if err != nil {
				return err
			}
			cf := clientFlags{server: f.index, timeout: 10 * time.Second, sec: f.sec}
			c, err := cf.dial(ctx)
			if err != nil {
				return fmt.Errorf("--index %s: %w", f.index, err)
			}
			defer c.Close()
			log := slog.Default()
			reg := prometheus.NewRegistry()
			cfg.Registry, cfg.Logger = reg, log
			scrape, sc, err := withEngineMetrics(f.pick.scrapeInterval, &cfg, reg, log)
			if err != nil {
				return err
			}
			go scrape(ctx)
			svc, err := gateway.New(cfg, gateway.Remote{Client: c})
			if err != nil {
				return err
			}
			if disc != nil {
				run, err := disc.watchPods(log, disc.candidateSetter(log, setCandidates(svc, sc, log)))
				if err != nil {
					return err
				}
				go func() {
					if err := run(ctx); err != nil {
						log.Error("discovery stopped", "err", err)
					}
				}()
			}
			// Logged and counted by Warm; the picker serves regardless,
			// routing by load until the index answers.
			_ = svc.Warm(ctx, 0)
			return runPicker(ctx, svc, reg, f.pick.extprocAddr, f.httpAddr, log)
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

// runPicker serves svc's ext_proc front on extprocAddr and its HTTP front
// (with reg's metrics) on httpAddr until ctx ends.
func runPicker(ctx context.Context, svc *gateway.Service, reg *prometheus.Registry, extprocAddr, httpAddr string, log *slog.Logger) error {
	lis, err := net.Listen("tcp", extprocAddr)
	if err != nil {
		return fmt.Errorf("--extproc-addr: %w", err)
	}
	gs := grpc.NewServer(grpc.MaxRecvMsgSize(svc.MaxBody() + 1<<20))
	svc.ExtProc().Register(gs)
	var hs *http.Server
	var hlis net.Listener
	if httpAddr != "" {
		if hlis, err = net.Listen("tcp", httpAddr); err != nil {
			lis.Close()
			return fmt.Errorf("--http-addr: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/v1/pick", svc.Handler())
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		hs = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	}
	log.Info("picker serving", "extproc", lis.Addr().String(), "http", addrOf(hlis))
	errs := make(chan error, 2)
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := gs.Serve(lis); err != nil {
			errs <- fmt.Errorf("ext_proc server: %w", err)
		}
	})
	if hs != nil {
		wg.Go(func() {
			if err := hs.Serve(hlis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errs <- fmt.Errorf("HTTP server: %w", err)
			}
		})
	}
	var cause error
	select {
	case <-ctx.Done():
	case cause = <-errs:
	}
	if hs != nil {
		sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		cause = errors.Join(cause, hs.Shutdown(sctx))
		cancel()
	}
	gs.GracefulStop()
	wg.Wait()
	return cause
}

func addrOf(l net.Listener) string {
	if l == nil {
		return "none"
	}
	return l.Addr().String()
}
