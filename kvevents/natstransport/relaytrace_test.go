package natstransport_test

import (
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvindex/kvindex/kvevents/natstransport"
)

// With a tracer each record published is one producer span, ended once
// JetStream acknowledged it, naming its subject.
func TestRelayPublishSpans(t *testing.T) {
	ns := startNATS(t)
	_, js := connect(t, ns.url())
	ensureStream(t, js)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	traced := startRelay(t, js, natstransport.RelayConfig{Tracer: tp.Tracer("test")})
	f := newFleet(t, 1, 1)
	feed(traced, f.run(t, 10))
	awaitPublished(t, traced, traced.Stats().Batches)
	spans := rec.Ended()
	if uint64(len(spans)) != traced.Stats().Published {
		t.Fatalf("%d spans for %d records published", len(spans), traced.Stats().Published)
	}
	for _, s := range spans {
		subject := attrOf(s.Attributes(), "messaging.destination.name")
		if s.Name() != natstransport.SpanPublish || s.SpanKind() != trace.SpanKindProducer || subject == "" {
			t.Errorf("span %q kind %v subject %q", s.Name(), s.SpanKind(), subject)
		}
	}

}

func attrOf(kvs []attribute.KeyValue, key string) string {
	for _, kv := range kvs {
		if string(kv.Key) == key {
			return kv.Value.AsString()
		}
	}
	return ""
}
