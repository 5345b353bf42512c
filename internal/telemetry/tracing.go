package telemetry

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
)

// TracerName names the tracer of kvindex's own spans (tokenize, hash,
// index walk, pick).
const TracerName = "github.com/kvindex/kvindex"

// FlushTimeout bounds the flush of the spans still queued when the
// process stops: a collector that does not answer delays the stop by
// this much at most, and the spans are dropped.
const FlushTimeout = 5 * time.Second

// Propagator is the trace context kvindex reads and writes: W3C
// traceparent and tracestate.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// Tracing is tracing at work: the tracer provider and its exporter. A
// nil *Tracing is tracing off, and every method installs nothing.
type Tracing struct {
	cfg    Config
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
}

// New builds the tracer provider c configures, nil when c is off. The
// exporter connects lazily: nothing is dialled before the first export.
//
// Spans wait for export in the batch processor's queue, bounded by the
// SDK's default of 2048 spans (OTEL_BSP_MAX_QUEUE_SIZE); beyond it new
// spans are dropped. That memory is not part of --memory-budget.
func New(c Config) (*Tracing, error) {
	if !c.Enabled() {
		return nil, nil
	}
	exp, err := otlptracegrpc.New(context.Background(), otlptracegrpc.WithEndpointURL(c.Endpoint))
	if err != nil {
		return nil, err
	}
	// The default resource reads OTEL_RESOURCE_ATTRIBUTES; the service
	// name is the resolved one (OTEL_SERVICE_NAME, else the command's).
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", c.ServiceName)))
	if err != nil {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithSampler(c.Sampler), sdktrace.WithResource(res))
	return &Tracing{cfg: c, tp: tp, tracer: tp.Tracer(TracerName)}, nil
}

// Enabled reports whether tracing is on.
func (t *Tracing) Enabled() bool { return t != nil }

// Tracer is the tracer of kvindex's own spans; nil when off.
func (t *Tracing) Tracer() trace.Tracer {
	if t == nil {
		return nil
	}
	return t.tracer
}

// Provider is the tracer provider; nil when off.
func (t *Tracing) Provider() *sdktrace.TracerProvider {
	if t == nil {
		return nil
	}
	return t.tp
}

// Log says, once at start, where the traces go.
func (t *Tracing) Log(log *slog.Logger) {
	if t == nil {
		return
	}
	log.Info("tracing on: spans exported over OTLP/gRPC", "endpoint", t.cfg.Endpoint, "service", t.cfg.ServiceName, "sampler", t.cfg.Sampler.Description())
}

// Shutdown flushes the queued spans and stops the exporter, within ctx
// and FlushTimeout.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, FlushTimeout)
	defer cancel()
	return t.tp.Shutdown(ctx)
}

// otelgrpcOptions: kvindex's provider and propagator, no metrics
// (Prometheus has them), and no spans for health checks.
func (t *Tracing) otelgrpcOptions() []otelgrpc.Option {
	return []otelgrpc.Option{
		otelgrpc.WithTracerProvider(t.tp), otelgrpc.WithPropagators(Propagator),
		otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()),
		otelgrpc.WithFilter(func(info *stats.RPCTagInfo) bool {
			return !strings.HasPrefix(info.FullMethodName, "/grpc.health.v1.")
		}),
	}
}

// ServerOptions trace a gRPC server's calls (a server span each, child
// of the caller's traceparent); none when off.
func (t *Tracing) ServerOptions() []grpc.ServerOption {
	if t == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(t.otelgrpcOptions()...))}
}

// DialOptions trace a gRPC client's calls and send their trace context;
// none when off.
func (t *Tracing) DialOptions() []grpc.DialOption {
	if t == nil {
		return nil
	}
	return []grpc.DialOption{grpc.WithStatsHandler(otelgrpc.NewClientHandler(t.otelgrpcOptions()...))}
}

// Handler traces h's API requests (paths under /v1/; not /metrics or
// the probes), each a server span, child of the request's traceparent;
// h itself when off.
func (t *Tracing) Handler(h http.Handler) http.Handler {
	if t == nil {
		return h
	}
	return otelhttp.NewHandler(h, "kvindex",
		otelhttp.WithTracerProvider(t.tp), otelhttp.WithPropagators(Propagator),
		otelhttp.WithMeterProvider(metricnoop.NewMeterProvider()),
		otelhttp.WithFilter(func(r *http.Request) bool { return strings.HasPrefix(r.URL.Path, "/v1/") }),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method + " " + r.URL.Path }),
	)
}
