package server

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/internal/testutil"
)

// fakeFleet is a FleetSource with fixed figures.
type fakeFleet FleetCache

func (f fakeFleet) FleetCache() FleetCache { return FleetCache(f) }

func ptr(v float64) *float64 { return &v }

// ListPods carries the fleet's and each pod's cached fraction from the
// source, over gRPC and in the HTTP JSON view; a model asked for keeps
// its figures and the pods of the answer.
func TestListPodsFleet(t *testing.T) {
	src := fakeFleet{
		Window: time.Minute,
		Models: []CacheCount{
			{Name: "", Hits: 300, Queries: 400},
			{Name: "idle"},
			{Name: testModel, Hits: 300, Queries: 400},
			{Name: "skewed", Hits: 12, Queries: 10},
		},
		Pods: []CacheCount{{Name: "a", Hits: 100, Queries: 400}, {Name: "x"}},
	}
	overall := client.FleetCacheJSON{Model: "", Fraction: ptr(0.75), HitTokens: 300, QueryTokens: 400, WindowSeconds: 60}
	idle := client.FleetCacheJSON{Model: "idle", WindowSeconds: 60}
	qwen := client.FleetCacheJSON{Model: testModel, Fraction: ptr(0.75), HitTokens: 300, QueryTokens: 400, WindowSeconds: 60}
	skewed := client.FleetCacheJSON{Model: "skewed", Fraction: ptr(1), HitTokens: 12, QueryTokens: 10, WindowSeconds: 60}
	podA := client.PodCacheJSON{Pod: "a", Fraction: ptr(0.25), HitTokens: 100, QueryTokens: 400, WindowSeconds: 60}
	podX := client.PodCacheJSON{Pod: "x", WindowSeconds: 60}
	tests := []struct {
		name  string
		src   FleetSource
		model string
		fleet []client.FleetCacheJSON
		pods  []client.PodCacheJSON
	}{
		{"no source", nil, "", nil, nil},
		{"source with nothing yet", fakeFleet{}, "", nil, nil},
		{"every model", src, "", []client.FleetCacheJSON{overall, idle, qwen, skewed}, []client.PodCacheJSON{podA, podX}},
		{"one model", src, testModel, []client.FleetCacheJSON{qwen}, []client.PodCacheJSON{podA}},
		{"model without figures", src, "other", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, func(c *Config) { c.Fleet = tt.src })
			loadThree(t, f, testutil.Seq(1000, 4*testBlockSize)) // pods a and b of testModel
			r, err := f.client.Index.ListPods(context.Background(), &kvindexv1.ListPodsRequest{Model: tt.model})
			if err != nil {
				t.Fatal(err)
			}
			got := client.PodsJSONOf(r, time.Now())
			if !reflect.DeepEqual(got.Fleet, tt.fleet) || !reflect.DeepEqual(got.PodCache, tt.pods) {
				t.Errorf("gRPC:\n got %s %s\nwant %s %s", jsonOf(t, got.Fleet), jsonOf(t, got.PodCache), jsonOf(t, tt.fleet), jsonOf(t, tt.pods))
			}
			var body client.PodsJSON
			testutil.GetJSON(t, f.url+"/v1/pods?model="+tt.model, &body)
			if !reflect.DeepEqual(body.Fleet, tt.fleet) || !reflect.DeepEqual(body.PodCache, tt.pods) {
				t.Errorf("HTTP:\n got %s %s\nwant %s %s", jsonOf(t, body.Fleet), jsonOf(t, body.PodCache), jsonOf(t, tt.fleet), jsonOf(t, tt.pods))
			}
		})
	}
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
