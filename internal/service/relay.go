package service

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvindex/kvindex/internal/buildinfo"
	"github.com/kvindex/kvindex/internal/bytesize"
	"github.com/kvindex/kvindex/internal/kubediscovery"
	"github.com/kvindex/kvindex/internal/lifecycle"
	"github.com/kvindex/kvindex/kvevents/natstransport"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// RelayOptions configure a relay: the engines it follows (listed or
// discovered), the NATS stream it publishes to and its HTTP address.
type RelayOptions struct {
	Engines  []zmqtransport.EngineConfig
	Discover *DiscoverOptions // nil: the engines are listed
	Model    string
	Conn     NATSConn
	Stream   natstransport.StreamConfig
	Relay    natstransport.RelayConfig
	// HTTPAddr serves /metrics, /healthz and /readyz.
	HTTPAddr string
}

// Relay follows engines over ZMQ, exactly as the index service does
// (replay of gaps, restart detection), and publishes each batch to
// JetStream for the replicas.
type Relay struct {
	o     *RelayOptions
	log   *slog.Logger
	group lifecycle.Group

	nc    *nats.Conn
	js    jetstream.JetStream
	relay *natstransport.Relay
	sub   *zmqtransport.Subscriber
	lis   net.Listener
}

// NewRelay builds the relay; nothing connects or listens yet.
func NewRelay(o *RelayOptions, log *slog.Logger) (*Relay, error) {
	if o.Discover != nil {
		if err := o.Discover.Validate(); err != nil {
			return nil, err
		}
	}
	auth, err := o.Conn.Auth()
	if err != nil {
		return nil, err
	}
	if o.Relay.Auth = auth; auth == nil {
		log.Warn(insecureWarning)
	}
	r := &Relay{o: o, log: log}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildInfoGauge(buildinfo.Read()))
	var hs *http.Server
	g := &r.group
	g.StopTimeout, g.Logger = ShutdownGrace, log
	g.Add(lifecycle.Part{
		Name: "NATS connection",
		Start: func(context.Context) error {
			host, _ := os.Hostname()
			var err error
			r.nc, r.js, err = o.Conn.connect(RoleRelay, "kvindex-relay "+host, log.With("component", "nats"))
			return err
		},
		// Last: the relay has flushed what it holds.
		Stop: func(context.Context) error { r.nc.Close(); log.Info("relay stopped"); return nil },
	})
	g.Add(listenPart("HTTP listener", "HTTPAddr", o.HTTPAddr, &r.lis))
	g.Add(lifecycle.Part{
		Name: "relay",
		Start: func(ctx context.Context) error {
			var err error
			if r.relay, err = natstransport.NewRelay(r.js, o.Relay, log.With("component", "relay")); err != nil {
				return err
			}
			if r.sub, err = zmqtransport.NewSubscriber(zmqtransport.SubscriberConfig{Engines: o.Engines}, r.relay, log.With("component", "kvevents")); err != nil {
				return err
			}
			r.relay.SetStreams(r.sub.Streams)
			for _, c := range r.relay.Collectors() {
				reg.MustRegister(c)
			}
			log.Info("kvindex relay starting", "nats", r.nc.ConnectedUrlRedacted(), "stream", o.Stream.Name, "model", o.Model,
				"engines", len(o.Engines), "buffer", bytesize.Format(o.Relay.MaxBuffer))
			// The relay's own work ends with its context: the group's,
			// which ends when the relay is asked to stop.
			return r.relay.Start(ctx)
		},
		// Flushes what it holds; the subscriber is closed by then.
		Stop: func(context.Context) error { return r.relay.Close() },
	})
	// The stream is ensured in the background: the events of an engine
	// are buffered (up to the relay buffer) until it exists.
	g.Go("stream", func(ctx context.Context) error {
		if err := ensureStream(ctx, r.js, o.Stream, log); err != nil && ctx.Err() == nil {
			log.Error("giving up on the stream", "err", err)
		}
		return nil
	})
	g.Add(lifecycle.Part{
		Name:  "event subscriber",
		Start: func(context.Context) error { return r.sub.Start() },
		Stop:  func(context.Context) error { return r.sub.Close() },
	})
	if o.Discover != nil {
		g.Add(o.Discover.part(log, func() func([]kubediscovery.Engine) {
			return o.Discover.engineFollower(o.Model, log.With("component", "discovery"), r.sub.AddEngine, func(name string) { r.sub.RemoveEngine(name) })
		}))
	}
	g.Add(lifecycle.Part{
		Name: "HTTP server",
		Start: func(context.Context) error {
			mux := http.NewServeMux()
			mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
			handleHealth(mux, func() (bool, string) {
				if !r.nc.IsConnected() {
					return false, "NATS not connected"
				}
				return true, ""
			})
			hs = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute}
			log.Info("relaying", "http", r.lis.Addr().String())
			logBeyondLoopback(log, "may read its metrics (engine names and counts); bind --http-addr to loopback or the pod's address", r.lis.Addr().String())
			return nil
		},
		Run:  func(context.Context) error { return serveHTTP(hs, r.lis) },
		Stop: func(ctx context.Context) error { return hs.Shutdown(ctx) },
	})
	return r, nil
}

// Run relays until ctx ends or a part fails.
func (r *Relay) Run(ctx context.Context) error { return r.group.Run(ctx) }

// Start brings the relay up; Wait reports how it stopped.
func (r *Relay) Start(ctx context.Context) error { return r.group.Start(ctx) }

// Wait blocks until the relay has stopped.
func (r *Relay) Wait() error { return r.group.Wait() }

// HTTPAddr is the HTTP listener's address once started.
func (r *Relay) HTTPAddr() string { return addrOf(r.lis) }

// Subscriber is the relay's ZMQ subscriber, once started.
func (r *Relay) Subscriber() *zmqtransport.Subscriber { return r.sub }
