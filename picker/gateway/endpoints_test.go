package gateway_test

import (
	"context"
	"errors"
	"testing"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/picker/gateway"
)

// noIndex is an index that never answers: picks go by load alone.
type noIndex struct{}

func (noIndex) LongestPrefix(context.Context, *kvindexv1.LongestPrefixRequest) (*kvindexv1.LongestPrefixResponse, error) {
	return nil, errors.New("no index")
}

// A Dynamic service starts without endpoints and follows SetEndpoints;
// an endpoint listed again keeps its in-flight count.
func TestSetEndpoints(t *testing.T) {
	a := gateway.Endpoint{Pod: "pod-a", Addr: "10.0.0.1:8000"}
	b := gateway.Endpoint{Pod: "pod-b", Addr: "10.0.0.2:8000"}
	svc, err := gateway.New(gateway.Config{Dynamic: true}, noIndex{})
	if err != nil {
		t.Fatal(err)
	}
	var done []func()
	t.Cleanup(func() {
		for _, d := range done {
			d()
		}
	})
	for _, step := range []struct {
		name     string
		set      []gateway.Endpoint
		setErr   bool
		want     string // pod picked; "" = no endpoint
		noPick   bool
		inFlight map[string]int
	}{
		{name: "none yet", want: ""},
		{name: "a", set: []gateway.Endpoint{a}, want: "pod-a", inFlight: map[string]int{a.Addr: 1}},
		{name: "a and b: a keeps its request", set: []gateway.Endpoint{a, b}, want: "pod-b", inFlight: map[string]int{a.Addr: 1, b.Addr: 1}},
		{name: "duplicate pod refused, set unchanged", set: []gateway.Endpoint{a, {Pod: "pod-a", Addr: "10.0.0.3:8000"}}, setErr: true, noPick: true, inFlight: map[string]int{a.Addr: 1, b.Addr: 1}},
		{name: "b only", set: []gateway.Endpoint{b}, want: "pod-b", inFlight: map[string]int{a.Addr: 0, b.Addr: 2}},
		{name: "empty again", set: []gateway.Endpoint{}, want: ""},
	} {
		if step.set != nil {
			err := svc.SetEndpoints(step.set)
			if (err != nil) != step.setErr {
				t.Fatalf("%s: SetEndpoints: %v, want error %v", step.name, err, step.setErr)
			}
		}
		if step.noPick {
			for addr, n := range step.inFlight {
				if got := svc.InFlight(addr); got != n {
					t.Errorf("%s: %s has %d in flight, want %d", step.name, addr, got, n)
				}
			}
			continue
		}
		d, fin, err := svc.Pick(context.Background(), nil, nil)
		if step.want == "" {
			if !errors.Is(err, gateway.ErrNoEndpoint) {
				t.Fatalf("%s: Pick: %v, %v; want ErrNoEndpoint", step.name, d.Pod, err)
			}
			continue
		}
		if err != nil || d.Pod != step.want {
			t.Fatalf("%s: picked %q (%v), want %s", step.name, d.Pod, err, step.want)
		}
		done = append(done, fin)
		for addr, n := range step.inFlight {
			if got := svc.InFlight(addr); got != n {
				t.Errorf("%s: %s has %d in flight, want %d", step.name, addr, got, n)
			}
		}
	}
}

// A service built with fixed endpoints refuses SetEndpoints, and one
// without endpoints must say they come later.
func TestSetEndpointsFixed(t *testing.T) {
	if _, err := gateway.New(gateway.Config{}, noIndex{}); err == nil {
		t.Error("New without endpoints and not Dynamic: no error")
	}
	svc, err := gateway.New(gateway.Config{Endpoints: []gateway.Endpoint{{Pod: "pod-a", Addr: "10.0.0.1:8000"}}}, noIndex{})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.SetEndpoints(nil); err == nil {
		t.Error("SetEndpoints on fixed endpoints: no error")
	}
}
