package service

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/picker/gateway"
)

// The picker on its own asks a remote kvindex: the prompt an engine
// stored is routed to that engine's endpoint; stopped, it leaves no
// goroutine behind.
func TestPickerServiceRoutesByTheRemoteIndex(t *testing.T) {
	ea, eca := newEngine(t, "pod-a")
	eb, ecb := newEngine(t, "pod-b")
	s := startService(t, baseOptions(eca, ecb))
	warmUp(t, s, "pod-a", ea)
	warmUp(t, s, "pod-b", eb)
	p := testutil.Seq(5000, 6*testBlockSize)
	if _, err := eb.Process(p, nil); err != nil {
		t.Fatal(err)
	}
	s.awaitHeld(t, "pod-b", p)

	before := runtime.NumGoroutine()
	o := &PickerServiceOptions{
		Picker: PickerOptions{Gateway: gateway.Config{Endpoints: []gateway.Endpoint{
			{Pod: "pod-a", Addr: "10.0.0.1:8000"}, {Pod: "pod-b", Addr: "10.0.0.2:8000"},
		}, IndexTimeout: testDeadline}, ExtProcAddr: "127.0.0.1:0"},
		Index: s.GRPCAddr(), Dial: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		HTTPAddr: "127.0.0.1:0",
	}
	log, _ := testLogger(t)
	pk, stop := startPicker(t, o, log)
	body := fmt.Sprintf(`{"model":%q,"prompt":%s}`, testModel, strings.ReplaceAll(fmt.Sprint(p), " ", ","))
	resp, err := http.Post("http://"+pk.HTTPAddr()+"/v1/pick", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var d struct{ Endpoint, Pod string }
	if err := json.Unmarshal(raw, &d); err != nil || resp.StatusCode != http.StatusOK || d.Pod != "pod-b" || d.Endpoint != "10.0.0.2:8000" {
		t.Fatalf("/v1/pick: %d %s; pod-b=10.0.0.2:8000 holds the prompt", resp.StatusCode, raw)
	}
	if pk.ExtProcAddr() == "" {
		t.Error("no ext_proc address")
	}
	stop()
	goroutines(t, before)
}

// A picker started before its index serves at once: it routes by load
// and session (the fallback index_unreachable) and reports not ready,
// over HTTP and gRPC health, until the index answers; then it is ready
// and routes by prefix, without a restart. Its ext_proc port answers
// gRPC reflection.
func TestPickerServiceStartsWithoutItsIndex(t *testing.T) {
	indexAddr := testutil.FreeAddr(t)
	o := &PickerServiceOptions{
		Picker: PickerOptions{Gateway: gateway.Config{Endpoints: []gateway.Endpoint{
			{Pod: "pod-a", Addr: "10.0.0.1:8000"}, {Pod: "pod-b", Addr: "10.0.0.2:8000"},
		}, IndexTimeout: testDeadline}, ExtProcAddr: "127.0.0.1:0"},
		Index: indexAddr, Dial: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		HTTPAddr: "127.0.0.1:0",
	}
	log, logs := testLogger(t)
	pk, _ := startPicker(t, o, log) // without its index
	base := "http://" + pk.HTTPAddr()
	get := func(path string) (int, map[string]string) {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v map[string]string
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return resp.StatusCode, v
	}
	p := testutil.Seq(7000, 6*testBlockSize)
	body := fmt.Sprintf(`{"model":%q,"prompt":%s}`, testModel, strings.ReplaceAll(fmt.Sprint(p), " ", ","))
	pick := func() (pod, fallback string) {
		resp, err := http.Post(base+"/v1/pick", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var d struct{ Pod, Fallback string }
		if err := json.NewDecoder(resp.Body).Decode(&d); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("/v1/pick: %d %v", resp.StatusCode, err)
		}
		if h := resp.Header.Get(gateway.HeaderFallback); h != d.Fallback {
			t.Errorf("fallback header %q, JSON %q", h, d.Fallback)
		}
		return d.Pod, d.Fallback
	}
	conn, err := grpc.NewClient(pk.ExtProcAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	readiness := func() healthpb.HealthCheckResponse_ServingStatus {
		r, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: "readiness"})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetStatus()
	}

	if code, v := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(v["reason"], indexAddr) {
		t.Errorf("/readyz without the index: %d %v, want 503 naming %s", code, v, indexAddr)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}
	if st := readiness(); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC readiness without the index: %v", st)
	}
	if _, fb := pick(); fb != "index_unreachable" {
		t.Errorf("fallback %q without the index, want index_unreachable", fb)
	}
	if got := listServices(t, conn); !slices.Contains(got, "envoy.service.ext_proc.v3.ExternalProcessor") || !slices.Contains(got, "grpc.health.v1.Health") {
		t.Errorf("reflection lists %v", got)
	}

	// The index comes up where the picker looks for it.
	ea, eca := newEngine(t, "pod-a")
	eb, ecb := newEngine(t, "pod-b")
	ix := baseOptions(eca, ecb)
	ix.GRPCAddr = indexAddr
	s := startService(t, ix)
	warmUp(t, s, "pod-a", ea)
	warmUp(t, s, "pod-b", eb)
	if _, err := eb.Process(p, nil); err != nil {
		t.Fatal(err)
	}
	s.awaitHeld(t, "pod-b", p)
	testutil.Await(t, 3*testDeadline, "the picker to report ready", func() bool { code, _ := get("/readyz"); return code == http.StatusOK })
	if st := readiness(); st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC readiness with the index: %v", st)
	}
	if pod, fb := pick(); pod != "pod-b" || fb != "" {
		t.Errorf("picked %s (fallback %q); pod-b holds the prompt", pod, fb)
	}
	out := logs.String()
	if down, up := strings.Count(out, "the index is unreachable"), strings.Count(out, "the index answers"); down != 1 || up != 1 {
		t.Errorf("logged down %d and up %d times, want once each", down, up)
	}
}

// listServices asks the server's gRPC reflection for its services, as
// grpcurl's list does.
func listServices(t *testing.T, conn *grpc.ClientConn) []string {
	t.Helper()
	st, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer st.CloseSend()
	if err := st.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	r, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range r.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	return names
}
