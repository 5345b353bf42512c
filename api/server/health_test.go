package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
)

// Every stream state reaches every view of an engine's health: ListPods,
// the longest-prefix answers (gRPC and HTTP), /v1/pods and the
// kvindex_engine_health metric.
func TestHealthStates(t *testing.T) {
	tests := []struct {
		name      string
		connected bool
		health    kvevents.Health
		evict     bool // the memory budget evicts a's entries
	}{
		{"ok", true, kvevents.HealthOK, false},
		{"partial", true, kvevents.HealthOK, true},
		{"restored", true, kvevents.HealthRestored, false},
		{"unconfirmed", true, kvevents.HealthUnconfirmed, false},
		{"degraded", true, kvevents.HealthDegraded, false},
		{"disconnected", false, kvevents.HealthRestored, false}, // not heard: whatever it held
		{"degraded", true, kvevents.HealthDegraded, true},       // a worse state says more
	}
	states := []string{"ok", "restored", "unconfirmed", "degraded", "disconnected", "partial"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			streams := &fakeStreams{}
			streams.set(kvevents.StreamStats{Engine: engine("a", 0), Connected: tt.connected, Health: tt.health})
			var opts indexer.Options
			if tt.evict {
				opts.MemoryBudget = 1 << 20
			}
			f := newFixtureIndex(t, opts, func(c *Config) { c.Streams = streams })
			tokens := testutil.Seq(1, 64)
			loadThree(t, f, tokens)
			if tt.evict {
				// a's own blocks outgrow its fair share of the budget,
				// so its oldest go; then it stores the query's blocks
				// again: they match, but a's matches are lower bounds.
				for i := 0; f.index.Engines()[0].Evicted == 0; i++ {
					if i == 10_000 {
						t.Fatal("no eviction")
					}
					f.hub.Apply(engine("a", 0), uint64(i+1), []kvevents.Event{stored(t, testutil.Seq(1<<20+i*8000, 8000), 500)})
				}
				f.hub.Apply(engine("a", 0), 10_001, []kvevents.Event{stored(t, tokens, 4)})
			}
			ctx := context.Background()

			pods, err := f.client.ListPods(ctx, testModel)
			if err != nil {
				t.Fatal(err)
			}
			if got := client.HealthName(pods[0].GetHealth()); pods[0].GetPod() != "a" || got != tt.name {
				t.Errorf("ListPods: %s is %s, want a %s", pods[0].GetPod(), got, tt.name)
			}
			r, err := f.client.LongestPrefixTokens(ctx, testModel, tokens, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := client.HealthName(r.GetPods()[0].GetHealth()); r.GetPods()[0].GetPod() != "a" || got != tt.name {
				t.Errorf("LongestPrefix: %s is %s, want a %s", r.GetPods()[0].GetPod(), got, tt.name)
			}
			ids, _ := json.Marshal(tokens)
			code, body := post(t, f.url+"/v1/longest-prefix", `{"tokens":`+string(ids)+`}`)
			var lp client.LongestPrefixJSON
			if err := json.Unmarshal(body, &lp); err != nil || code != http.StatusOK {
				t.Fatalf("HTTP longest-prefix: %d %s", code, body)
			}
			if got := lp.Pods[0].Health; got != tt.name {
				t.Errorf("HTTP longest-prefix: health %s, want %s", got, tt.name)
			}
			resp, err := http.Get(f.url + "/v1/pods")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var pj client.PodsJSON
			if err := json.Unmarshal(b, &pj); err != nil {
				t.Fatalf("/v1/pods: %v: %s", err, b)
			}
			if got := pj.Pods[0].Health; got != tt.name {
				t.Errorf("/v1/pods: health %s, want %s", got, tt.name)
			}
			text := scrape(t, f.url)
			for _, st := range states {
				v := "0"
				if st == tt.name {
					v = "1"
				}
				want := `kvindex_engine_health{dp_rank="0",model="qwen",pod="a",state="` + st + `"} ` + v + "\n"
				if !strings.Contains(text, want) {
					t.Errorf("metrics lack %s", want)
				}
			}
		})
	}
}

// With more engines than Limits.MetricsEngines, /metrics gives series of
// their own to that many only, the ones not ok first, and still counts
// every engine by health.
func TestMetricsEnginesBounded(t *testing.T) {
	streams := &fakeStreams{}
	var all []kvevents.StreamStats
	for i := range 10 {
		st := kvevents.StreamStats{Engine: engine(fmt.Sprintf("pod-%d", i), 0), Connected: true}
		if i == 7 || i == 8 {
			st.Health = kvevents.HealthDegraded
		}
		all = append(all, st)
	}
	streams.set(all...)
	f := newFixture(t, func(c *Config) { c.Streams, c.Limits.MetricsEngines = streams, 3 })
	text := scrape(t, f.url)
	for _, want := range []string{
		`kvindex_engines{state="ok"} 8` + "\n",
		`kvindex_engines{state="degraded"} 2` + "\n",
		"kvindex_metrics_engines_omitted 7\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	var withSeries []string
	for i := range 10 {
		if strings.Contains(text, fmt.Sprintf(`kvindex_ingest_batches_total{dp_rank="0",model="qwen",pod="pod-%d"}`, i)) {
			withSeries = append(withSeries, fmt.Sprintf("pod-%d", i))
		}
	}
	if want := []string{"pod-0", "pod-7", "pod-8"}; !slices.Equal(withSeries, want) {
		t.Errorf("engines with series of their own: %v, want %v (the degraded ones, then the first healthy one)", withSeries, want)
	}
}
