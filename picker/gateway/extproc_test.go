package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/api/server"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/enginesim/simhttp"
	"github.com/kvindex/kvindex/kvevents/enginesim/simzmq"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
	"github.com/kvindex/kvindex/picker"
	"github.com/kvindex/kvindex/picker/enginemetrics"
	"github.com/kvindex/kvindex/picker/gateway"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"
)

const (
	testModel = "qwen"
	bs        = 16
	waitFor   = 10 * time.Second
)

// fleet is kvindex fed by simulated engines over real ZMQ, each engine
// with its OpenAI HTTP front: what a gateway routes to.
type fleet struct {
	ix        *indexer.Index
	srv       *server.Server
	indexAddr string
	engines   map[string]*simzmq.Engine
	endpoints []gateway.Endpoint
	podOf     map[string]string // endpoint address -> pod
}

func newFleet(t *testing.T, pods ...string) *fleet {
	t.Helper()
	h, err := blockhash.New(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: bs})
	if err != nil {
		t.Fatal(err)
	}
	ix, err := indexer.New(indexer.Options{Hasher: h})
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{ix: ix, engines: map[string]*simzmq.Engine{}, podOf: map[string]string{}}
	var ecs []zmqtransport.EngineConfig
	for _, pod := range pods {
		eng, err := simzmq.New(enginesim.Config{Pod: pod, Model: testModel, Hasher: h, CapacityBlocks: 512},
			zmqtransport.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { eng.Close() })
		f.engines[pod] = eng
		ecs = append(ecs, zmqtransport.EngineConfig{Name: pod, Model: testModel, Endpoint: eng.PubEndpoint(), ReplayEndpoint: eng.ReplayEndpoint()})
		front, err := simhttp.New(simhttp.Config{Ranks: []*enginesim.Engine{eng.Engine}})
		if err != nil {
			t.Fatal(err)
		}
		if err := front.Start("127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { front.Close() })
		addr := front.Addr().String()
		f.endpoints = append(f.endpoints, gateway.Endpoint{Pod: pod, Addr: addr})
		f.podOf[addr] = pod
	}
	sub, err := zmqtransport.NewSubscriber(zmqtransport.SubscriberConfig{Engines: ecs}, ix, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	f.srv, err = server.New(server.Config{Index: ix, BlockSize: bs, Hasher: h, Streams: sub, DefaultModel: testModel, ReadyGrace: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.srv.Shutdown)
	f.indexAddr = serveGRPC(t, f.srv.Register)
	// A PUB socket gives no sign of a subscription: publish harmless
	// AllBlocksCleared batches until each engine's arrive.
	for _, pod := range pods {
		eng := f.engines[pod]
		testutil.Await(t, waitFor, "the subscription to "+pod, func() bool {
			if err := eng.Clear(); err != nil {
				t.Fatal(err)
			}
			for _, st := range sub.Streams() {
				if st.Engine == eng.EngineID() && st.Batches > 0 {
					return true
				}
			}
			return false
		})
	}
	return f
}

// held is how many blocks of ids the index says pod holds.
func (f *fleet) held(t *testing.T, pod string, ids []uint64) int {
	var res indexer.Result
	if err := f.ix.LongestPrefix(&indexer.Query{Model: testModel, Tokens: ids}, &res); err != nil {
		t.Fatal(err)
	}
	for _, p := range res.Pods {
		if p.Engine.Pod == pod {
			return p.MatchedBlocks
		}
	}
	return 0
}

func serveGRPC(t *testing.T, register func(grpc.ServiceRegistrar), opts ...grpc.ServerOption) string {
	addr, _ := serveGRPCServer(t, register, opts...)
	return addr
}

func serveGRPCServer(t *testing.T, register func(grpc.ServiceRegistrar), opts ...grpc.ServerOption) (string, *grpc.Server) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(opts...)
	register(gs)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	return lis.Addr().String(), gs
}

func mustVec(t testing.TB, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	if m := metricOf(t, reg, name, label); m != nil {
		return m.GetCounter().GetValue()
	}
	return 0
}

// metricOf is the series of name whose label has the value label, or nil.
func metricOf(t testing.TB, reg *prometheus.Registry, name, label string) *dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == label {
					return m
				}
			}
		}
	}
	return nil
}

// fallbacks counts the requests routed without the index, every reason.
func fallbacks(tb testing.TB, reg *prometheus.Registry) float64 {
	tb.Helper()
	var n float64
	for _, f := range picker.Fallbacks {
		n += mustVec(tb, reg, "kvindex_picker_index_fallbacks_total", string(f))
	}
	return n
}

func remote(t *testing.T, addr string) gateway.Source {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	c, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return gateway.Remote{Client: c}
}

// startPicker serves svc's ext_proc front on loopback and returns a client.
func startPicker(t *testing.T, svc *gateway.Service) (extprocv3.ExternalProcessorClient, *grpc.ClientConn) {
	t.Helper()
	xp := svc.ExtProc()
	addr := serveGRPC(t, func(r grpc.ServiceRegistrar) { xp.Register(r.(*grpc.Server)) }, xp.ServerOptions()...)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return extprocv3.NewExternalProcessorClient(conn), conn
}

// envoy plays Envoy's part of one request: it opens a full-duplex
// ext_proc stream, sends the request headers (with the subset hint when
// not nil) and the body in frames of at most frame bytes, and reads the
// picker's answers as Envoy would: the destination from the request
// headers' mutation (checked against the envoy.lb metadata) and the body
// from the streamed body mutation. finish, when the stream is still
// open, sends the upstream's response through the stream and closes it.
type envoy struct {
	stream extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
	dest   string
	body   []byte
	status int // an immediate response's status, else 0
	// indexSeq is the kvindex.picker metadata's index_seq.
	indexSeq string
	// fallback is the x-kvindex-fallback header set on the request,
	// checked against the kvindex.picker metadata's fallback.
	fallback string
}

func send(t *testing.T, c extprocv3.ExternalProcessorClient, path string, hdr map[string]string, subset []string, body string, frame int) *envoy {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := c.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e := &envoy{stream: st, cancel: cancel}
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte(path)},
		{Key: "content-type", RawValue: []byte("application/json")},
	}}
	for k, v := range hdr {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	req := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm}}}
	if subset != nil {
		vals := make([]*structpb.Value, len(subset))
		for i, s := range subset {
			vals[i] = structpb.NewStringValue(s)
		}
		req.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			gateway.SubsetNamespace: {Fields: map[string]*structpb.Value{gateway.SubsetKey: structpb.NewListValue(&structpb.ListValue{Values: vals})}},
		}}
	}
	if err := st.Send(req); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(body); i += frame {
		end := min(i+frame, len(body))
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: []byte(body[i:end]), EndOfStream: end == len(body)}}}); err != nil {
			// io.EOF: the picker answered (a refusal mid-body) and ended
			// the stream; its answer is read below.
			if err == io.EOF {
				break
			}
			t.Fatal(err)
		}
	}
	for {
		resp, err := st.Recv()
		if err != nil {
			t.Fatalf("reading the picker's answer: %v", err)
		}
		switch r := resp.Response.(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			e.status = int(r.ImmediateResponse.GetStatus().GetCode())
			e.body = r.ImmediateResponse.GetBody()
			return e
		case *extprocv3.ProcessingResponse_RequestHeaders:
			for _, h := range r.RequestHeaders.GetResponse().GetHeaderMutation().GetSetHeaders() {
				switch h.GetHeader().GetKey() {
				case gateway.HeaderDestination:
					e.dest = string(h.GetHeader().GetRawValue())
				case gateway.HeaderFallback:
					e.fallback = string(h.GetHeader().GetRawValue())
				}
			}
			pick := resp.GetDynamicMetadata().GetFields()[gateway.PickNamespace].GetStructValue().GetFields()
			if fb := pick[gateway.FallbackKey].GetStringValue(); fb != e.fallback {
				t.Fatalf("fallback header %q and kvindex.picker metadata %q disagree", e.fallback, fb)
			}
			md := resp.GetDynamicMetadata().GetFields()[gateway.MetadataNamespace].GetStructValue().GetFields()[gateway.HeaderDestination].GetStringValue()
			if md != e.dest || e.dest == "" {
				t.Fatalf("destination header %q and envoy.lb metadata %q disagree", e.dest, md)
			}
			e.indexSeq = resp.GetDynamicMetadata().GetFields()[gateway.PickNamespace].GetStructValue().GetFields()[gateway.IndexSeqKey].GetStringValue()
		case *extprocv3.ProcessingResponse_RequestBody:
			sr := r.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			e.body = append(e.body, sr.GetBody()...)
			if sr.GetEndOfStream() {
				if string(e.body) != body {
					t.Fatalf("the picker changed the body: %q", e.body)
				}
				return e
			}
		default:
			t.Fatalf("unexpected answer %T", r)
		}
	}
}

// forward sends the request where the picker said, as Envoy would, then
// passes the upstream's response through the stream and ends it.
func (e *envoy) forward(t *testing.T, path string) {
	t.Helper()
	resp, err := http.Post("http://"+e.dest+path, "application/json", strings.NewReader(string(e.body)))
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("upstream %s: %d %s", e.dest, resp.StatusCode, out)
	}
	e.finish(t, out)
}

func (e *envoy) finish(t *testing.T, respBody []byte) {
	t.Helper()
	msgs := []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{}}},
		{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: respBody, EndOfStream: true}}},
	}
	for _, m := range msgs {
		if err := e.stream.Send(m); err != nil {
			t.Fatal(err)
		}
		r, err := e.stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if rh := r.GetResponseHeaders(); rh != nil {
			var fb string
			for _, h := range rh.GetResponse().GetHeaderMutation().GetSetHeaders() {
				if h.GetHeader().GetKey() == gateway.HeaderFallback {
					fb = string(h.GetHeader().GetRawValue())
				}
			}
			if fb != e.fallback {
				t.Fatalf("fallback on the response %q, on the request %q", fb, e.fallback)
			}
		}
	}
	e.stream.CloseSend()
	if _, err := e.stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("stream end: %v", err)
	}
}

func idsBody(ids []uint64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = fmt.Sprint(id)
	}
	return fmt.Sprintf(`{"model":%q,"prompt":[%s],"max_tokens":1}`, testModel, strings.Join(s, ","))
}

// noSpeculation: the picker's own speculative entries would keep turn 2
// on turn 1's pod without the index; the tests are about the index.
func noSpeculation() picker.Config {
	c := picker.DefaultConfig()
	c.SpeculativeTTL = 0
	c.BlockSize = bs
	return c
}

func newService(t *testing.T, f *fleet, src gateway.Source, edit func(*gateway.Config)) (*gateway.Service, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := gateway.Config{Endpoints: f.endpoints, Scorer: noSpeculation(), IndexTimeout: waitFor, Registry: reg}
	if edit != nil {
		edit(&cfg)
	}
	svc, err := gateway.New(cfg, src)
	if err != nil {
		t.Fatal(err)
	}
	return svc, reg
}

// Turn 2 of a conversation goes to the pod that served turn 1, because
// the index heard that pod store turn 1's blocks; with the index asked
// in-process or over gRPC.
func TestExtProcConversationSticks(t *testing.T) {
	f := newFleet(t, "pod-a", "pod-b", "pod-c")
	sources := []struct {
		name string
		src  gateway.Source
	}{
		{"remote", remote(t, f.indexAddr)},
		{"in-process", gateway.Local{Server: f.srv}},
	}
	for i, s := range sources {
		t.Run(s.name, func(t *testing.T) {
			svc, _ := newService(t, f, s.src, nil)
			c, _ := startPicker(t, svc)
			turn1 := testutil.Seq(1000*(i+1), 8*bs)
			e := send(t, c, "/v1/completions", nil, nil, idsBody(turn1), 100)
			first := f.podOf[e.dest]
			e.forward(t, "/v1/completions")
			testutil.Await(t, waitFor, "the index to hear turn 1", func() bool { return f.held(t, first, turn1) == 8 })
			turn2 := append(append([]uint64{}, turn1...), testutil.Seq(50000, 4*bs)...)
			for range 3 {
				e := send(t, c, "/v1/completions", nil, nil, idsBody(turn2), 333)
				if got := f.podOf[e.dest]; got != first {
					t.Fatalf("turn 2 went to %s; turn 1's prefix is on %s", got, first)
				}
				e.forward(t, "/v1/completions")
			}
			if n := svc.InFlight(e.dest); n != 0 {
				t.Errorf("%d requests still in flight after their streams ended", n)
			}
		})
	}
}

// Clients that stop halfway through their bodies (a slow upload) hold no
// body slot while they wait: more of them than there are slots do not
// hold up the next request, and each is routed once its body is complete.
func TestExtProcStalledBodiesHoldNoSlot(t *testing.T) {
	f := newFleet(t, "pod-a", "pod-b")
	svc, reg := newService(t, f, gateway.Local{Server: f.srv}, nil)
	c, _ := startPicker(t, svc)
	body := idsBody(testutil.Seq(1, 4*bs))
	var stalled []extprocv3.ExternalProcessor_ProcessClient
	for range 2*runtime.GOMAXPROCS(0) + 1 {
		st, err := c.Process(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/completions")}}}
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm}}}); err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(body[:10])}}}); err != nil {
			t.Fatal(err)
		}
		stalled = append(stalled, st)
	}
	done := make(chan *envoy)
	go func() { done <- send(t, c, "/v1/completions", nil, nil, body, 100) }()
	select {
	case e := <-done:
		if e.dest == "" {
			t.Fatalf("no destination: %+v", e)
		}
	case <-time.After(waitFor):
		t.Fatalf("a request waited %v behind %d stalled bodies", waitFor, len(stalled))
	}
	// The stalled ones go on when their bodies come.
	for i, st := range stalled {
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(body[10:]), EndOfStream: true}}}); err != nil {
			t.Fatal(err)
		}
		resp, err := st.Recv()
		if err != nil {
			t.Fatalf("stalled request %d: %v", i, err)
		}
		if resp.GetRequestHeaders() == nil {
			t.Fatalf("stalled request %d: answered %T, want its routing", i, resp.Response)
		}
	}
	// Every request's turns are in the histogram. Whether any of them
	// waited depends on how the stalled streams' first frames interleaved;
	// TestBodySlotTurns times the waits on a fake clock.
	if n := metricOf(t, reg, "kvindex_picker_queue_seconds", "body").GetHistogram().GetSampleCount(); n < uint64(len(stalled)+1) {
		t.Errorf("body turns: %d; want at least one per request, %d", n, len(stalled)+1)
	}
	if n := metricOf(t, reg, "kvindex_picker_queue_seconds", "cpu").GetHistogram().GetSampleCount(); n != uint64(len(stalled)+1) {
		t.Errorf("CPU turns: %d; want one per request, %d", n, len(stalled)+1)
	}
}

// A holder with requests in flight yields to an idle pod once its queue
// outweighs the prefix; the subset hint is honoured; and an empty subset
// or an unreadable body is refused as the protocol says.
func TestExtProcLoadAndSubset(t *testing.T) {
	f := newFleet(t, "pod-a", "pod-b")
	svc, _ := newService(t, f, remote(t, f.indexAddr), nil)
	c, _ := startPicker(t, svc)
	turn1 := testutil.Seq(7, 8*bs)
	e := send(t, c, "/v1/completions", nil, nil, idsBody(turn1), 200)
	holder := e.dest
	e.forward(t, "/v1/completions")
	testutil.Await(t, waitFor, "the index to hear turn 1", func() bool { return f.held(t, f.podOf[holder], turn1) == 8 })

	// Requests stay in flight on the holder while their streams are
	// open; within a few the next one goes elsewhere.
	var open []*envoy
	moved := ""
	for range 6 {
		e := send(t, c, "/v1/completions", nil, nil, idsBody(turn1), 500)
		open = append(open, e)
		if e.dest != holder {
			moved = e.dest
			break
		}
	}
	if moved == "" {
		t.Fatalf("the holder kept every request with %d in flight", len(open))
	}
	if len(open) < 2 {
		t.Errorf("the first request left the idle holder")
	}
	for _, e := range open {
		e.finish(t, []byte(`{}`))
	}
	testutil.Await(t, waitFor, "in-flight counts to drop", func() bool { return svc.InFlight(holder) == 0 })

	// Subset hint: only the listed endpoint may be picked, even against
	// the prefix.
	e = send(t, c, "/v1/completions", nil, []string{moved}, idsBody(turn1), 64)
	if e.dest != moved {
		t.Errorf("subset [%s]: routed to %s", moved, e.dest)
	}
	e.finish(t, []byte(`{}`))
	for _, tt := range []struct {
		name   string
		subset []string
		body   string
		want   int
	}{
		{"empty subset", []string{}, idsBody(turn1), http.StatusServiceUnavailable},
		{"unknown subset", []string{"10.0.0.1:1"}, idsBody(turn1), http.StatusServiceUnavailable},
		{"bad body", nil, `{"model":"qwen"}`, http.StatusBadRequest},
		{"not json", nil, `{"prompt`, http.StatusBadRequest},
	} {
		e := send(t, c, "/v1/completions", nil, tt.subset, tt.body, 5)
		if e.status != tt.want {
			t.Errorf("%s: status %d (%s), want %d", tt.name, e.status, e.body, tt.want)
		}
	}
}

// stuckIndex is a kvindex gRPC service that never answers a query.
type stuckIndex struct {
	kvindexv1.UnimplementedIndexServiceServer
	asked chan struct{}
}

func (s *stuckIndex) LongestPrefix(ctx context.Context, _ *kvindexv1.LongestPrefixRequest) (*kvindexv1.LongestPrefixResponse, error) {
	s.asked <- struct{}{}
	<-ctx.Done()
	return nil, ctx.Err()
}

// A remote index that does not answer within the deadline, or is gone,
// costs a request the deadline at most: it is routed by load alone and
// the fallback counted by reason.
func TestExtProcIndexFallback(t *testing.T) {
	f := newFleet(t, "pod-a", "pod-b")
	stuck := &stuckIndex{asked: make(chan struct{}, 16)}
	stuckAddr := serveGRPC(t, func(r grpc.ServiceRegistrar) { kvindexv1.RegisterIndexServiceServer(r, stuck) })

	svc, reg := newService(t, f, remote(t, stuckAddr), func(c *gateway.Config) { c.IndexTimeout = 20 * time.Millisecond })
	c, _ := startPicker(t, svc)
	e := send(t, c, "/v1/completions", nil, nil, idsBody(testutil.Seq(1, 64)), 40)
	if e.dest == "" || e.status != 0 {
		t.Fatalf("not routed: status %d %s", e.status, e.body)
	}
	<-stuck.asked
	e.forward(t, "/v1/completions")
	if n := mustVec(t, reg, "kvindex_picker_index_fallbacks_total", "timeout"); n != 1 || e.fallback != "timeout" {
		t.Errorf("timeout fallbacks = %v, header %q, want 1", n, e.fallback)
	}

	// Gone: the index stopped after the picker connected.
	deadAddr, gs := serveGRPCServer(t, func(r grpc.ServiceRegistrar) { f.srv.Register(r) })
	src := remote(t, deadAddr)
	gs.Stop()
	svc2, reg2 := newService(t, f, src, nil)
	c2, _ := startPicker(t, svc2)
	e = send(t, c2, "/v1/completions", nil, nil, idsBody(testutil.Seq(1, 64)), 40)
	if e.dest == "" {
		t.Fatalf("not routed: status %d %s", e.status, e.body)
	}
	e.finish(t, nil)
	if n := mustVec(t, reg2, "kvindex_picker_index_fallbacks_total", "index_unreachable"); n != 1 || e.fallback != "index_unreachable" {
		t.Errorf("index_unreachable fallbacks = %v, header %q, want 1", n, e.fallback)
	}
}

func TestExtProcHealth(t *testing.T) {
	f := newFleet(t, "pod-a")
	svc, _ := newService(t, f, gateway.Local{Server: f.srv}, nil)
	_, conn := startPicker(t, svc)
	hc := healthpb.NewHealthClient(conn)
	for _, name := range []string{"", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"} {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q: %v %v", name, r, err)
		}
	}
}

// outcomeLog records what a Service reports to Config.Outcomes.
type outcomeLog struct {
	mu        sync.Mutex
	predicted []int
	responses [][]byte
}

func (o *outcomeLog) Predicted(model string, matched int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if model == testModel {
		o.predicted = append(o.predicted, matched)
	}
}

func (o *outcomeLog) Responded(model string, body []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if model == testModel {
		o.responses = append(o.responses, slices.Clone(body))
	}
}

// Each ext_proc pick reports the cached tokens it predicts, and the
// response that came back through the stream: for turn 2 of a
// conversation, the prefix the index promised is what the engine served
// from cache.
func TestExtProcOutcomes(t *testing.T) {
	f := newFleet(t, "pod-a", "pod-b")
	rec := &outcomeLog{}
	svc, _ := newService(t, f, gateway.Local{Server: f.srv}, func(c *gateway.Config) { c.Outcomes = rec })
	c, _ := startPicker(t, svc)
	turn1 := testutil.Seq(7000, 8*bs)
	e := send(t, c, "/v1/completions", nil, nil, idsBody(turn1), 100)
	e.forward(t, "/v1/completions")
	testutil.Await(t, waitFor, "the index to hear turn 1", func() bool { return f.held(t, f.podOf[e.dest], turn1) == 8 })
	turn2 := append(append([]uint64{}, turn1...), testutil.Seq(80000, 4*bs)...)
	e = send(t, c, "/v1/completions", nil, nil, idsBody(turn2), 100)
	e.forward(t, "/v1/completions")

	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.predicted) != 2 || len(rec.responses) != 2 {
		t.Fatalf("%d predictions and %d responses reported, want 2 each", len(rec.predicted), len(rec.responses))
	}
	u, err := enginemetrics.ParseUsage(rec.responses[1])
	if err != nil {
		t.Fatal(err)
	}
	if rec.predicted[0] != 0 || rec.predicted[1] != 8*bs || u.CachedTokens != 8*bs {
		t.Errorf("predicted %v cached tokens, turn 2's engine served %d from cache; want 0, then %d both", rec.predicted, u.CachedTokens, 8*bs)
	}
}
