package enginemetrics_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/picker/enginemetrics"
)

// TestObservedWindow checks the sliding window of the responses' usage:
// each observation counts for Window seconds after its own, then drops
// out, per model and overall.
func TestObservedWindow(t *testing.T) {
	type obs struct {
		at             time.Duration // since the start
		model          string
		prompt, cached int
	}
	tests := []struct {
		name   string
		window time.Duration
		obs    []obs
		at     time.Duration
		model  string
		want   enginemetrics.Fraction
	}{
		{"empty", 10 * time.Second, nil, 0, enginemetrics.Overall, enginemetrics.Fraction{}},
		{"one second", 10 * time.Second, []obs{{0, "a", 100, 40}, {0, "a", 100, 60}}, 0, "a",
			enginemetrics.Fraction{Queries: 200, Hits: 100}},
		{"inside the window", 10 * time.Second, []obs{{0, "a", 100, 40}, {9 * time.Second, "a", 100, 60}}, 9 * time.Second, "a",
			enginemetrics.Fraction{Queries: 200, Hits: 100}},
		{"oldest slid out", 10 * time.Second, []obs{{0, "a", 100, 40}, {9 * time.Second, "a", 100, 60}}, 10 * time.Second, "a",
			enginemetrics.Fraction{Queries: 100, Hits: 60}},
		{"all slid out", 10 * time.Second, []obs{{0, "a", 100, 40}}, time.Hour, "a", enginemetrics.Fraction{}},
		{"a bucket reused after a lap", 2 * time.Second, []obs{{0, "a", 100, 40}, {2 * time.Second, "a", 10, 1}}, 2 * time.Second, "a",
			enginemetrics.Fraction{Queries: 10, Hits: 1}},
		{"models apart", 10 * time.Second, []obs{{0, "a", 100, 40}, {0, "b", 50, 50}}, 0, "b",
			enginemetrics.Fraction{Queries: 50, Hits: 50}},
		{"overall", 10 * time.Second, []obs{{0, "a", 100, 40}, {0, "b", 50, 50}, {0, "", 10, 0}}, 0, enginemetrics.Overall,
			enginemetrics.Fraction{Queries: 160, Hits: 90}},
		{"unknown model", 10 * time.Second, []obs{{0, "a", 100, 40}}, 0, "c", enginemetrics.Fraction{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := newClock()
			start := clk.Now()
			s, err := enginemetrics.New(enginemetrics.Config{Window: tt.window, Now: clk.Now}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			f := s.Fleet()
			for _, o := range tt.obs {
				clk.Advance(start.Add(o.at).Sub(clk.Now()))
				if err := f.Observe(o.model, o.prompt, o.cached); err != nil {
					t.Fatal(err)
				}
			}
			clk.Advance(start.Add(tt.at).Sub(clk.Now()))
			if got := f.Observed(tt.model); got != tt.want {
				t.Fatalf("Observed(%q) = %+v, want %+v", tt.model, got, tt.want)
			}
			if got := f.Engines(tt.model); got != (enginemetrics.Fraction{}) {
				t.Fatalf("Engines(%q) = %+v: responses' usage leaked into the engines' figures", tt.model, got)
			}
		})
	}
}

func TestObserveBadUsage(t *testing.T) {
	tests := []struct{ prompt, cached int }{{-1, 0}, {10, -1}, {10, 11}}
	s, err := enginemetrics.New(enginemetrics.Config{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := s.Fleet()
	for i, tt := range tests {
		if err := f.Observe("m", tt.prompt, tt.cached); !errors.Is(err, enginemetrics.ErrBadUsage) {
			t.Errorf("Observe(%d, %d): error %v, want ErrBadUsage", tt.prompt, tt.cached, err)
		}
		if got := f.BadUsage(); got != uint64(i+1) {
			t.Errorf("BadUsage = %d, want %d", got, i+1)
		}
	}
	if got := f.Totals("m"); got != (enginemetrics.Totals{}) {
		t.Errorf("refused usage counted: %+v", got)
	}
	if got := gather(t, s.Collector())["kvindex_picker_bad_usage_total"][""]; got != float64(len(tests)) {
		t.Errorf("kvindex_picker_bad_usage_total = %v, want %d", got, len(tests))
	}
}

// TestMaxModels checks that models past the limit count in the overall
// figures only, so that request-supplied names cannot grow the label
// sets.
func TestMaxModels(t *testing.T) {
	s, err := enginemetrics.New(enginemetrics.Config{MaxModels: 2}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := s.Fleet()
	for i := range 5 {
		f.Predict(fmt.Sprint("model-", i), 10)
		if err := f.Observe(fmt.Sprint("model-", i), 20, 10); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.Totals(enginemetrics.Overall); got != (enginemetrics.Totals{Predicted: 50, ObservedCached: 50, ObservedPrompt: 100}) {
		t.Errorf("overall totals %+v, want every model's", got)
	}
	if got := f.Totals("model-4"); got != (enginemetrics.Totals{}) {
		t.Errorf("model past the limit tracked: %+v", got)
	}
	sum := f.Summary()
	if len(sum.Models) != 3 || sum.Models[0].Model != enginemetrics.Overall || sum.Models[1].Model != "model-0" || sum.Models[2].Model != "model-1" {
		t.Errorf("Summary models %+v, want overall, model-0, model-1", sum.Models)
	}
	m := gather(t, s.Collector())
	if got := len(m["kvindex_picker_predicted_cached_tokens_total"]); got != 2 {
		t.Errorf("%d predicted series, want 2", got)
	}
}

// TestConcurrencyBound scrapes more engines than Concurrency allows at
// once: the pages are held until Concurrency scrapes are in flight, and
// no more may then arrive.
func TestConcurrencyBound(t *testing.T) {
	const limit, pods = 2, 6
	var mu sync.Mutex
	cur, most := 0, 0
	gate := make(chan struct{})
	var once sync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		cur++
		most = max(most, cur)
		if cur == limit {
			once.Do(func() { close(gate) })
		}
		mu.Unlock()
		<-gate
		w.Write([]byte("vllm:num_requests_waiting 1\n")) //nolint:errcheck
		mu.Lock()
		cur--
		mu.Unlock()
	}))
	defer srv.Close()
	eps := map[string]string{}
	for i := range pods {
		eps[fmt.Sprint("pod-", i)] = fmt.Sprintf("%s/metrics/%d", srv.URL, i)
	}
	s, err := enginemetrics.New(enginemetrics.Config{Concurrency: limit, Timeout: time.Minute}, eps, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Scrape(context.Background())
	if got := len(s.Samples()); got != pods {
		t.Fatalf("%d samples, want %d", got, pods)
	}
	if most != limit {
		t.Fatalf("%d scrapes in flight at most, want %d", most, limit)
	}
}

// TestSetEndpoints checks that a pod kept keeps its state and a pod
// removed or moved starts over.
func TestSetEndpoints(t *testing.T) {
	a, b := newEngine(t, "pod-a", 1), newEngine(t, "pod-b", 1)
	clk := newClock()
	s := newScraper(t, clk, enginemetrics.Config{}, a, b)
	s.Scrape(context.Background())
	if err := s.SetEndpoints(map[string]string{a.pod: a.MetricsURL(), b.pod: a.MetricsURL()}); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Latest(a.pod); !ok {
		t.Error("pod kept with its URL lost its sample")
	}
	if _, ok := s.Latest(b.pod); ok {
		t.Error("pod moved to another URL kept the old engine's sample")
	}
	if err := s.SetEndpoints(map[string]string{"x": "not a url"}); !errors.Is(err, enginemetrics.ErrConfig) {
		t.Errorf("SetEndpoints with a bad URL: %v, want ErrConfig", err)
	}
	if len(s.Status()) != 2 {
		t.Error("a refused SetEndpoints changed the pods")
	}
}
