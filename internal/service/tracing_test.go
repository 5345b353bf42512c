package service

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvindex/kvindex/api/server"
	"github.com/kvindex/kvindex/internal/telemetry"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/picker/gateway"
)

// collector is an OTLP/gRPC trace collector on loopback that keeps every
// span it is sent, with its resource's service.name.
type collector struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []span
}

// span is one collected span and the service that sent it.
type span struct {
	service string
	*tracepb.Span
}

func (c *collector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		svc := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				svc = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				c.spans = append(c.spans, span{svc, sp})
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// trace is the spans collected so far of the trace id.
func (c *collector) trace(id []byte) []span {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []span
	for _, s := range c.spans {
		if string(s.GetTraceId()) == string(id) {
			out = append(out, s)
		}
	}
	return out
}

// startCollector serves a collector on loopback until the test ends and
// returns it with its OTLP endpoint URL.
func startCollector(t *testing.T) (*collector, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{}
	gs := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(gs, c)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return c, "http://" + lis.Addr().String()
}

// tracingTo is tracing to endpoint, every trace sampled, as the flags
// would configure it.
func tracingTo(t *testing.T, endpoint, service string) telemetry.Config {
	t.Helper()
	f := telemetry.Flags{Endpoint: endpoint, ServiceName: service}
	if err := f.Ratio.Set("1"); err != nil {
		t.Fatal(err)
	}
	c, err := f.Config(func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The gateway's trace context: its trace id and the span id of its
// span, which the picker's pick must be a child of.
const (
	gatewayTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	gatewaySpanID  = "00f067aa0ba902b7"
	traceparent    = "00-" + gatewayTraceID + "-" + gatewaySpanID + "-01"
)

// tracedPrompt is a text prompt the picker tokenizes itself (its
// --tokenizer) and hashes into the index's block keys.
var tracedPrompt = strings.Repeat("The quick brown fox jumps over the lazy dog. ", 20)

// startTracedFleet starts an index service and a picker (with its own
// tokenizer) asking it over loopback gRPC, with the given tracing.
func startTracedFleet(t *testing.T, serveTracing, pickerTracing telemetry.Config) (*started, *PickerService) {
	t.Helper()
	_, eca := newEngine(t, "pod-a")
	o := baseOptions(eca)
	o.Tracing = serveTracing
	s := startService(t, o)
	po := &PickerServiceOptions{
		Picker: PickerOptions{Gateway: gateway.Config{Endpoints: []gateway.Endpoint{
			{Pod: "pod-a", Addr: testutil.FreeAddr(t)},
		}, IndexTimeout: testDeadline}, ExtProcAddr: "127.0.0.1:0"},
		Index: s.GRPCAddr(), Dial: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		HTTPAddr: "127.0.0.1:0", TokenizerFile: qwenTokenizerFile, Tracing: pickerTracing,
	}
	log, _ := testLogger(t)
	pk, _ := startPicker(t, po, log)
	return s, pk
}

// pickExtProc routes one request over ext_proc as Envoy would, its
// headers carrying the gateway's traceparent, and returns the
// destination.
func pickExtProc(t *testing.T, addr string) string {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	st, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hdr := &corev3.HeaderMap{}
	for _, kv := range [][2]string{{":method", "POST"}, {":path", "/v1/completions"}, {"content-type", "application/json"}, {"traceparent", traceparent}} {
		hdr.Headers = append(hdr.Headers, &corev3.HeaderValue{Key: kv[0], RawValue: []byte(kv[1])})
	}
	body := fmt.Sprintf(`{"model":%q,"prompt":%q}`, testModel, tracedPrompt)
	for _, req := range []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdr}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}},
	} {
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == gateway.HeaderDestination {
			return string(h.GetHeader().GetRawValue())
		}
	}
	t.Fatalf("ext_proc answered %v, no destination", resp)
	return ""
}

// pickHTTP routes one request over /v1/pick with the gateway's
// traceparent.
func pickHTTP(t *testing.T, addr string) {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"prompt":%q}`, testModel, tracedPrompt)
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/pick", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("traceparent", traceparent)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/v1/pick: %d %s", resp.StatusCode, raw)
	}
}

// tree is one trace's spans by span id.
type tree map[string]span

func spanID(s span) string   { return hex.EncodeToString(s.GetSpanId()) }
func parentID(s span) string { return hex.EncodeToString(s.GetParentSpanId()) }
func (tr tree) descends(s span, ancestor string) bool {
	for id := parentID(s); id != ""; id = parentID(tr[id]) {
		if id == ancestor {
			return true
		}
		if _, ok := tr[id]; !ok {
			return false
		}
	}
	return false
}

// find is the one span of service named name, or nil.
func (tr tree) find(service, name string, kind tracepb.Span_SpanKind) *span {
	for _, s := range tr {
		if s.service == service && s.GetName() == name && (kind == tracepb.Span_SPAN_KIND_UNSPECIFIED || s.GetKind() == kind) {
			return &s
		}
	}
	return nil
}

// One request's trace, exported over OTLP by both processes, goes from
// the gateway's span through the picker to the index: the same trace id,
// the pick a descendant of the gateway's span (a child, over ext_proc),
// the picker's tokenize and hash spans within the pick, its index call a
// client span within the pick, the index's server span a child of that
// call and the index walk within the server span.
func TestTracePickerToIndex(t *testing.T) {
	const serveName, pickerName = "kvindex-serve", "kvindex-picker"
	const indexMethod = "kvindex.v1.IndexService/LongestPrefix"
	for _, front := range []string{"ext_proc", "/v1/pick"} {
		t.Run(front, func(t *testing.T) {
			col, endpoint := startCollector(t)
			s, pk := startTracedFleet(t, tracingTo(t, endpoint, serveName), tracingTo(t, endpoint, pickerName))
			if front == "ext_proc" {
				pickExtProc(t, pk.ExtProcAddr())
			} else {
				pickHTTP(t, pk.HTTPAddr())
			}
			want := []struct{ service, name string }{
				{pickerName, gateway.SpanPick}, {pickerName, gateway.SpanTokenize}, {pickerName, gateway.SpanHash},
				{pickerName, indexMethod}, {serveName, indexMethod}, {serveName, server.SpanIndexWalk},
			}
			id, _ := hex.DecodeString(gatewayTraceID)
			var tr tree
			await(t, "the request's spans at the collector", func() bool {
				for _, tp := range []*sdktrace.TracerProvider{pk.tracing.Provider(), s.tracing.Provider()} {
					if err := tp.ForceFlush(context.Background()); err != nil {
						t.Fatal(err)
					}
				}
				tr = tree{}
				for _, sp := range col.trace(id) {
					tr[spanID(sp)] = sp
				}
				for _, w := range want {
					if tr.find(w.service, w.name, 0) == nil {
						return false
					}
				}
				return true
			})
			pick := tr.find(pickerName, gateway.SpanPick, 0)
			if front == "ext_proc" && parentID(*pick) != gatewaySpanID {
				t.Errorf("the pick's parent is %s, not the gateway's span %s", parentID(*pick), gatewaySpanID)
			}
			if front == "/v1/pick" && !tr.descends(*pick, gatewaySpanID) {
				t.Errorf("the pick (parent %s) does not descend from the gateway's span %s", parentID(*pick), gatewaySpanID)
			}
			for _, name := range []string{gateway.SpanTokenize, gateway.SpanHash} {
				if sp := tr.find(pickerName, name, 0); parentID(*sp) != spanID(*pick) {
					t.Errorf("%s's parent is %s, not the pick %s", name, parentID(*sp), spanID(*pick))
				}
			}
			call := tr.find(pickerName, indexMethod, tracepb.Span_SPAN_KIND_CLIENT)
			srv := tr.find(serveName, indexMethod, tracepb.Span_SPAN_KIND_SERVER)
			walk := tr.find(serveName, server.SpanIndexWalk, 0)
			switch {
			case call == nil || srv == nil:
				t.Fatalf("no client span (%v) or server span (%v) of %s", call != nil, srv != nil, indexMethod)
			case !tr.descends(*call, spanID(*pick)):
				t.Errorf("the index call (parent %s) is not within the pick %s", parentID(*call), spanID(*pick))
			case parentID(*srv) != spanID(*call):
				t.Errorf("the index's server span's parent is %s, not the picker's call %s", parentID(*srv), spanID(*call))
			case parentID(*walk) != spanID(*srv):
				t.Errorf("the index walk's parent is %s, not the server span %s", parentID(*walk), spanID(*srv))
			}
		})
	}
}

// serve --picker traces the same way without a network between the
// pick and the index: the pick a child of the gateway's span, the
// index's tokenize and walk within the pick.
func TestTraceEmbeddedPicker(t *testing.T) {
	col, endpoint := startCollector(t)
	_, eca := newEngine(t, "pod-a")
	o := baseOptions(eca)
	o.Tracing, o.TokenizerFile = tracingTo(t, endpoint, "kvindex-serve"), qwenTokenizerFile
	o.Picker = &PickerOptions{Gateway: gateway.Config{Endpoints: []gateway.Endpoint{{Pod: "pod-a", Addr: testutil.FreeAddr(t)}},
		IndexTimeout: testDeadline}, ExtProcAddr: "127.0.0.1:0"}
	s := startService(t, o)
	pickExtProc(t, s.PickerAddr())
	id, _ := hex.DecodeString(gatewayTraceID)
	var tr tree
	await(t, "the request's spans at the collector", func() bool {
		if err := s.tracing.Provider().ForceFlush(context.Background()); err != nil {
			t.Fatal(err)
		}
		tr = tree{}
		for _, sp := range col.trace(id) {
			tr[spanID(sp)] = sp
		}
		return tr.find("kvindex-serve", gateway.SpanPick, 0) != nil && tr.find("kvindex-serve", server.SpanTokenize, 0) != nil &&
			tr.find("kvindex-serve", server.SpanIndexWalk, 0) != nil
	})
	pick := tr.find("kvindex-serve", gateway.SpanPick, 0)
	if parentID(*pick) != gatewaySpanID {
		t.Errorf("the pick's parent is %s, not the gateway's span %s", parentID(*pick), gatewaySpanID)
	}
	for _, name := range []string{server.SpanTokenize, server.SpanIndexWalk} {
		if sp := tr.find("kvindex-serve", name, 0); !tr.descends(*sp, spanID(*pick)) {
			t.Errorf("%s (parent %s) is not within the pick %s", name, parentID(*sp), spanID(*pick))
		}
	}
}

// With tracing off nothing is traced: serve's and the picker's tracing
// is nil (which installs nothing: telemetry's TestNew), and no span
// reaches even a recording tracer provider installed as OpenTelemetry's
// global one, which instrumentation falls back to.
func TestTracingOff(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTracerProvider(prevTP); otel.SetTextMapPropagator(prevProp) })

	s, pk := startTracedFleet(t, telemetry.Config{}, telemetry.Config{})
	if s.tracing != nil || pk.tracing != nil {
		t.Fatalf("tracing off, yet serve's is %v and the picker's %v", s.tracing, pk.tracing)
	}
	pickExtProc(t, pk.ExtProcAddr())
	pickHTTP(t, pk.HTTPAddr())
	if n := len(rec.Ended()) + len(rec.Started()); n > 0 {
		names := []string{}
		for _, sp := range rec.Started() {
			names = append(names, sp.Name())
		}
		slices.Sort(names)
		t.Errorf("tracing off, yet %d spans: %v", n, names)
	}
}
