package loadgen_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/loadgen"
	"github.com/kvindex/kvindex/internal/service"
	"github.com/kvindex/kvindex/internal/sim"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/testutil/simtest"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
	"github.com/kvindex/kvindex/picker/gateway"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// awaitBound bounds every wait for a condition: it only turns a hang into
// a failure, no result depends on it.
const awaitBound = time.Minute

// fleet is kvindex sim's engines with their HTTP fronts, kvindex serve
// following them and kvindex picker asking it, all in this process.
type fleet struct {
	endpoints []loadgen.Endpoint
	pickURL   string
}

func startFleet(t *testing.T, engines int) *fleet {
	t.Helper()
	evPorts, httpPorts := testutil.FreePorts(t, 2*engines), testutil.FreePorts(t, engines)
	so := sim.DefaultOptions()
	so.Engines, so.Rate, so.Port, so.HTTPPort = engines, 0, evPorts, httpPorts
	follow := simtest.Start(t, so)
	o := service.DefaultOptions()
	o.GRPCAddr, o.HTTPAddr, o.Model = "127.0.0.1:0", "127.0.0.1:0", follow.Model
	o.Index.Hasher = blockhash.MustNew(follow.Hash)
	for _, e := range follow.Engines {
		o.Engines = append(o.Engines, zmqtransport.EngineConfig{Name: e.Pod, Model: follow.Model, Endpoint: e.Endpoint, ReplayEndpoint: e.Replay, Ranks: e.Ranks})
	}
	serve, err := service.New(o, slog.New(slog.NewTextHandler(simtest.Log(t, "serve"), nil)))
	if err != nil {
		t.Fatal(err)
	}
	simtest.Run(t, serve.Start, serve.Wait)
	ctx, cancel := context.WithTimeout(context.Background(), awaitBound)
	defer cancel()
	idx, err := client.Dial(ctx, serve.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer idx.Close()
	testutil.Await(t, awaitBound, "kvindex ready", func() bool { ok, err := idx.Ready(ctx); return err == nil && ok })

	// loadgen never tells the picker that a request ended, so a
	// decision counts as in flight for the pick hold: here turns end in
	// milliseconds, and the default hold would count finished turns as
	// load.
	po := &service.PickerServiceOptions{
		Picker:   service.PickerOptions{Gateway: gateway.Config{PickHold: time.Millisecond}, ExtProcAddr: "127.0.0.1:0"},
		Index:    serve.GRPCAddr(),
		Dial:     []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		HTTPAddr: "127.0.0.1:0",
	}
	f := &fleet{}
	for i := range engines {
		e := loadgen.Endpoint{Pod: fmt.Sprintf("pod-%d", i), Addr: fmt.Sprintf("127.0.0.1:%d", httpPorts+i)}
		f.endpoints = append(f.endpoints, e)
		po.Picker.Gateway.Endpoints = append(po.Picker.Gateway.Endpoints, gateway.Endpoint{Pod: e.Pod, Addr: e.Addr})
	}
	picker, err := service.NewPicker(po, slog.New(slog.NewTextHandler(simtest.Log(t, "picker"), nil)))
	if err != nil {
		t.Fatal(err)
	}
	simtest.Run(t, picker.Start, picker.Wait)
	f.pickURL = "http://" + picker.HTTPAddr()
	return f
}

// TestLoadgenPickBeatsRoundRobin sends the agent workload, as token ids,
// once round robin and once by the picker's choice: the fleet's cached
// fraction, as the engines' own usage reports it, is higher by the
// picker, and neither beats the ceiling.
func TestLoadgenPickBeatsRoundRobin(t *testing.T) {
	f := startFleet(t, 3)
	in := loadgen.DefaultInput()
	in.Sessions, in.Turns, in.Rate = 3, 4, 20
	input, err := loadgen.Load(in)
	if err != nil {
		t.Fatal(err)
	}
	var routes []loadgen.Route
	for _, s := range []string{"round-robin", "pick=" + f.pickURL} {
		r, err := loadgen.ParseRoute(s, f.endpoints)
		if err != nil {
			t.Fatal(err)
		}
		routes = append(routes, r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), awaitBound)
	defer cancel()
	rep, err := loadgen.Compare(ctx, input, routes, loadgen.DefaultOptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	rr, pick := rep.Results[0], rep.Results[1]
	for _, r := range rep.Results {
		t.Logf("%s: %d requests, %d errors, cached %.3f of ceiling %.3f, pods %v, TTFT p50 %.1fms", r.Route, r.Requests, r.Errors, r.CachedFraction, r.Ceiling, r.Pods, r.TTFT.P50)
		if r.Errors > 0 || r.Requests != len(input.Requests) {
			t.Errorf("%s: %d of %d requests sent, %d errors (first: %s)", r.Route, r.Requests, len(input.Requests), r.Errors, r.FirstError)
		}
		if r.CachedFraction > r.Ceiling {
			t.Errorf("%s: cached fraction %.3f above the ceiling %.3f", r.Route, r.CachedFraction, r.Ceiling)
		}
		if r.PromptTokens != input.PromptTokens(len(input.Requests)) {
			t.Errorf("%s: the engines counted %d prompt tokens (marker left out), the input has %d", r.Route, r.PromptTokens, input.PromptTokens(len(input.Requests)))
		}
	}
	if pick.CachedFraction <= rr.CachedFraction {
		t.Errorf("cached fraction by the picker %.3f, want above round robin's %.3f", pick.CachedFraction, rr.CachedFraction)
	}
}

// A gateway that sends everything to one engine makes the fleet one
// cache, large enough for the input: the engine serves exactly what the
// ceiling counts.
func TestLoadgenGatewayOneEngineReachesTheCeiling(t *testing.T) {
	f := startFleet(t, 1)
	in := loadgen.DefaultInput()
	in.Sessions, in.Turns, in.Rate = 3, 3, 50
	input, err := loadgen.Load(in)
	if err != nil {
		t.Fatal(err)
	}
	r, err := loadgen.ParseRoute("gateway="+f.endpoints[0].Addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), awaitBound)
	defer cancel()
	res, err := loadgen.Run(ctx, input, r, loadgen.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors > 0 || res.CachedFraction != res.Ceiling || res.Ceiling == 0 {
		t.Errorf("%d errors (first: %s), cached fraction %v, want the ceiling %v", res.Errors, res.FirstError, res.CachedFraction, res.Ceiling)
	}
}
