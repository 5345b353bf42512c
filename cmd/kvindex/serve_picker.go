package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"

	"github.com/kvindex/kvindex/api/server"
	"github.com/kvindex/kvindex/api/server/security"
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
	fs.IntVar(&f.maxBody, "max-body", gateway.DefaultMaxBody, "largest request body read, in bytes (larger: 413)")
	fs.DurationVar(&f.scrapeInterval, "scrape-interval", enginemetrics.DefaultInterval, "how often each --endpoint's http://HOST:PORT/metrics (vLLM's queue, KV usage and prefix-cache counters) is read for the load score and kvindex_fleet_cached_fraction; 0: never")
	fs.DurationVar(&f.pickHold, "pick-hold", gateway.DefaultPickHold, "how long a /v1/pick decision counts as in flight on its pod (its caller never reports the end)")
}

// config validates the flags into the picker's configuration. With
// discovered (--discover-selector) the candidates come from Kubernetes
// and --endpoint is refused.
func (f *pickFlags) config(discovered bool) (gateway.Config, error) {
	if discovered {
		if len(f.endpoints) > 0 {
			return gateway.Config{}, errors.New("--endpoint and --discover-selector: give one (the candidates are either listed or discovered)")
		}
		if f.extprocAddr == "" {
			return gateway.Config{}, errors.New("--extproc-addr must not be empty")
		}
		return gateway.Config{Dynamic: true, IndexTimeout: f.indexTimeout, MaxBody: f.maxBody, PickHold: f.pickHold}, nil
	}
	eps, err := parseEndpoints(f.endpoints)
	if err != nil {
		return gateway.Config{}, err
	}
	if f.extprocAddr == "" {
		return gateway.Config{}, errors.New("--extproc-addr must not be empty")
	}
	return gateway.Config{Endpoints: eps, IndexTimeout: f.indexTimeout, MaxBody: f.maxBody, PickHold: f.pickHold}, nil
}

// pickerOptions are kvindex serve --picker's validated settings.
type pickerOptions struct {
	cfg            gateway.Config
	extprocAddr    string
	scrapeInterval time.Duration
	// fleet is the server's FleetSource, fed by the picker's scraper.
	fleet *fleetRelay
}

// fleetSource is the server's source of the fleet cached fraction: nil
// without --picker or without scraping.
func (o *pickerOptions) fleetSource() server.FleetSource {
	if o == nil || o.scrapeInterval == 0 {
		return nil
	}
	return o.fleet
}

// servePicker is the endpoint picker inside kvindex serve: it asks the
// index in the same process, so no query crosses a network.
type servePicker struct {
	svc    *gateway.Service
	grpc   *grpc.Server
	lis    net.Listener
	addr   string                 // resolved ext_proc address
	sc     *enginemetrics.Scraper // nil without scraping
	scrape func(context.Context)  // reads the engines' /metrics until its context ends
	cancel context.CancelFunc     // ends scrape
}

// listenPicker builds the picker over srv and listens on its ext_proc
// address; nil (and no error) without --picker.
func listenPicker(o *pickerOptions, srv *server.Server, log *slog.Logger) (*servePicker, error) {
	if o == nil {
		return nil, nil
	}
	cfg := o.cfg
	cfg.Registry, cfg.Logger = srv.Registry(), log.With("component", "picker")
	scrape, sc, err := withEngineMetrics(o.scrapeInterval, &cfg, srv.Registry(), cfg.Logger)
	if err != nil {
		return nil, err
	}
	if sc != nil {
		o.fleet.sc.Store(sc)
	}
	svc, err := gateway.New(cfg, gateway.Local{Server: srv})
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", o.extprocAddr)
	if err != nil {
		return nil, fmt.Errorf("--extproc-addr %s: %w", o.extprocAddr, err)
	}
	gs := grpc.NewServer(grpc.MaxRecvMsgSize(svc.MaxBody() + 1<<20))
	svc.ExtProc().Register(gs)
	log.Info("picker serving", "extproc", lis.Addr().String(), "endpoints", len(cfg.Endpoints))
	return &servePicker{svc: svc, grpc: gs, lis: lis, addr: lis.Addr().String(), sc: sc, scrape: scrape, cancel: func() {}}, nil
}

// handler serves POST /v1/pick beside serve's own API, to the callers
// with the query scope (it reveals what a query does).
func (p *servePicker) handler(api http.Handler, srv *server.Server) http.Handler {
	if p == nil {
		return api
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/pick", srv.Guard(security.ScopeQuery, "Pick", p.svc.Handler()))
	mux.Handle("/", api)
	return mux
}

// serve runs the ext_proc server until stop.
func (p *servePicker) serve(wg *sync.WaitGroup, errs chan<- error) {
	if p == nil {
		return
	}
	wg.Go(func() {
		if err := p.grpc.Serve(p.lis); err != nil {
			errs <- fmt.Errorf("picker ext_proc server: %w", err)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	wg.Go(func() { p.scrape(ctx) })
}

// stop lets the open ext_proc streams finish, within ctx.
func (p *servePicker) stop(ctx context.Context) {
	if p == nil {
		return
	}
	p.cancel()
	stopped := make(chan struct{})
	go func() {
		p.grpc.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-ctx.Done():
		p.grpc.Stop()
		<-stopped
	}
}

// close releases the listener of a picker that never served.
func (p *servePicker) close() {
	if p != nil {
		p.lis.Close()
	}
}

// pickerOptions validates serve's picker flags: nil without --picker,
// where giving any of them is a mistake.
func (f *serveFlags) pickerOptions(discovered bool) (*pickerOptions, error) {
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
	return &pickerOptions{cfg: cfg, extprocAddr: f.pick.extprocAddr, scrapeInterval: f.pick.scrapeInterval, fleet: &fleetRelay{}}, nil
}
