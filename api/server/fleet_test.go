package server

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
)

// fakeFleet is a FleetSource with fixed figures.
type fakeFleet []FleetCache

func (f fakeFleet) FleetCache() []FleetCache { return f }

func ptr(v float64) *float64 { return &v }

// ListPods carries the fleet's cached fraction from the source, over
// gRPC and in the HTTP JSON view, filtered by the request's model.
func TestListPodsFleet(t *testing.T) {
	src := fakeFleet{
		{Model: "", Hits: 300, Queries: 400, Window: time.Minute},
		{Model: "idle", Window: time.Minute},
		{Model: testModel, Hits: 300, Queries: 400, Window: time.Minute},
		{Model: "skewed", Hits: 12, Queries: 10, Window: time.Minute},
	}
	overall := client.FleetCacheJSON{Model: "", Fraction: ptr(0.75), HitTokens: 300, QueryTokens: 400, WindowSeconds: 60}
	idle := client.FleetCacheJSON{Model: "idle", WindowSeconds: 60}
	qwen := client.FleetCacheJSON{Model: testModel, Fraction: ptr(0.75), HitTokens: 300, QueryTokens: 400, WindowSeconds: 60}
	skewed := client.FleetCacheJSON{Model: "skewed", Fraction: ptr(1), HitTokens: 12, QueryTokens: 10, WindowSeconds: 60}
	tests := []struct {
		name  string
		src   FleetSource
		model string
		want  []client.FleetCacheJSON
	}{
		{"no source", nil, "", nil},
		{"source with nothing yet", fakeFleet(nil), "", nil},
		{"every model", src, "", []client.FleetCacheJSON{overall, idle, qwen, skewed}},
		{"one model", src, testModel, []client.FleetCacheJSON{qwen}},
		{"model without figures", src, "other", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, func(c *Config) { c.Fleet = tt.src })
			r, err := f.client.Index.ListPods(context.Background(), &kvindexv1.ListPodsRequest{Model: tt.model})
			if err != nil {
				t.Fatal(err)
			}
			if got := client.PodsJSONOf(r, time.Now()).Fleet; !reflect.DeepEqual(got, tt.want) {
				t.Errorf("gRPC fleet:\n got %s\nwant %s", jsonOf(t, got), jsonOf(t, tt.want))
			}
			resp, err := http.Get(f.url + "/v1/pods?model=" + tt.model)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body client.PodsJSON
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(body.Fleet, tt.want) {
				t.Errorf("HTTP fleet:\n got %s\nwant %s", jsonOf(t, body.Fleet), jsonOf(t, tt.want))
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
