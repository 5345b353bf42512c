package enginemetrics_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/kvindex/kvindex/picker"
	"github.com/kvindex/kvindex/picker/enginemetrics"
)

// An engine's page, as vLLM serves it, scraped twice.
func Example() {
	page := `vllm:num_requests_waiting{model_name="m",engine="0"} 3
vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.5
vllm:prefix_cache_queries_total{model_name="m",engine="0"} %d
vllm:prefix_cache_hits_total{model_name="m",engine="0"} %d
`
	queries, hits := 1000, 100
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, page, queries, hits)
	}))
	defer srv.Close()

	sc, err := enginemetrics.New(enginemetrics.Config{}, map[string]string{
		"pod-a": enginemetrics.MetricsURL(strings.TrimPrefix(srv.URL, "http://")),
	}, nil)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	sc.Scrape(ctx) // the baseline
	queries, hits = 2000, 900
	sc.Scrape(ctx)

	cand := picker.Candidate{Pod: "pod-a", Metrics: sc.Metrics("pod-a")}
	fmt.Println("waiting:", cand.Metrics.Waiting, "kv usage:", cand.Metrics.KVUsage)
	f, _ := sc.Fleet().Engines(enginemetrics.Overall).Value()
	fmt.Println("fleet cached fraction:", f)
	// Output:
	// waiting: 3 kv usage: 0.5
	// fleet cached fraction: 0.8
}
