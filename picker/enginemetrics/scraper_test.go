package enginemetrics_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/picker"
	"github.com/kvindex/kvindex/picker/enginemetrics"
)

// newScraper scrapes the engines on a settable clock.
func newScraper(t testing.TB, clk *clock, cfg enginemetrics.Config, engines ...*engine) *enginemetrics.Scraper {
	t.Helper()
	eps := map[string]string{}
	for _, e := range engines {
		eps[e.pod] = e.MetricsURL()
	}
	cfg.Now = clk.Now
	s, err := enginemetrics.New(cfg, eps, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestFleetFractionFromEngines sends conversations to simulated engines
// through their HTTP front and checks that the fleet fraction is the
// engines' own hits over queries, per model and overall, and that the
// responses' usage, observed through the picker, tells the same.
func TestFleetFractionFromEngines(t *testing.T) {
	clk := newClock()
	engines := []*engine{newEngine(t, "pod-a", 1), newEngine(t, "pod-b", 2), newEngine(t, "pod-c", 1)}
	s := newScraper(t, clk, enginemetrics.Config{}, engines...)
	fleet := s.Fleet()
	ctx := context.Background()

	// A first request before the baseline: what an engine counted before
	// kvindex first saw it is in no window.
	engines[0].Chat(conversation("warm-up", 1)...)
	s.Scrape(ctx)
	q0, h0 := engines[0].Counters()
	if q0 == 0 {
		t.Fatal("the warm-up request was not counted by the engine")
	}

	clk.Advance(time.Second)
	var prompt, cached int
	for i, e := range engines {
		// Each turn resends the conversation so far: the engine holds its
		// prefix from the turn before.
		turns := conversation(fmt.Sprintf("topic %d", i), 4)
		for n := 1; n <= len(turns); n++ {
			u := e.Chat(turns[:n]...)
			if err := fleet.Observe(testModel, u.PromptTokens, u.PromptTokensDetails.CachedTokens); err != nil {
				t.Fatal(err)
			}
			fleet.Predict(testModel, u.PromptTokensDetails.CachedTokens)
			prompt += u.PromptTokens
			cached += u.PromptTokensDetails.CachedTokens
		}
	}
	clk.Advance(time.Second)
	s.Scrape(ctx)

	var want enginemetrics.Fraction
	for _, e := range engines {
		q, h := e.Counters()
		want.Queries += q
		want.Hits += h
	}
	want.Queries -= q0
	want.Hits -= h0
	if want.Hits == 0 || want.Hits == want.Queries {
		t.Fatalf("engines counted %+v: want some hits and some misses", want)
	}
	for _, model := range []string{testModel, enginemetrics.Overall} {
		if got := fleet.Engines(model); got != want {
			t.Errorf("Engines(%q) = %+v, want the engines' own counters %+v", model, got, want)
		}
	}
	obs := enginemetrics.Fraction{Queries: float64(prompt), Hits: float64(cached)}
	if got := fleet.Observed(testModel); got != obs {
		t.Errorf("Observed = %+v, want the responses' usage %+v", got, obs)
	}
	// Every request after the baseline passed through the "picker", so
	// the responses' usage and the engines' counters agree.
	if obs != want {
		t.Errorf("observed usage %+v, engines' counters %+v: want equal", obs, want)
	}

	wantFrac := want.Hits / want.Queries
	sum := fleet.Summary()
	if len(sum.Models) != 2 || sum.Models[0].EnginesFraction == nil || *sum.Models[0].EnginesFraction != wantFrac ||
		sum.Models[1].Model != testModel || sum.Models[1].Engines != want {
		t.Errorf("Summary = %+v, want the overall fraction %v, then %s's", sum, wantFrac, testModel)
	}
	m := gather(t, s.Collector())
	for _, model := range []string{testModel, ""} {
		if got := m["kvindex_fleet_cached_fraction"][model]; got != wantFrac {
			t.Errorf("kvindex_fleet_cached_fraction{model=%q} = %v, want %v", model, got, wantFrac)
		}
	}
	if got := m["kvindex_picker_predicted_cached_tokens_total"][testModel]; got != float64(cached) {
		t.Errorf("predicted cached tokens = %v, want %d", got, cached)
	}
	if got := m["kvindex_picker_observed_cached_tokens_total"][testModel]; got != float64(cached) {
		t.Errorf("observed cached tokens = %v, want %d", got, cached)
	}
	for _, e := range engines {
		if got, ok := m["kvindex_engine_requests_waiting"][e.pod]; !ok || got != 0 {
			t.Errorf("kvindex_engine_requests_waiting{pod=%q} = %v, %v; want 0", e.pod, got, ok)
		}
		if got := s.Metrics(e.pod); got.ScrapedAt != clk.Now() {
			t.Errorf("Metrics(%s).ScrapedAt = %v, want the last scrape %v", e.pod, got.ScrapedAt, clk.Now())
		}
	}

	// Each pod's own figures are its increments since the baseline.
	for i, st := range s.Status() {
		q, h := engines[i].Counters()
		if i == 0 {
			q, h = q-q0, h-h0
		}
		if w := (enginemetrics.Fraction{Queries: q, Hits: h}); st.Pod != engines[i].pod || st.Cache != w {
			t.Errorf("Status()[%d] = %s %+v, want %s's own increments %+v", i, st.Pod, st.Cache, engines[i].pod, w)
		}
	}

	// The window slides past the traffic: no fraction, not 0.
	clk.Advance(enginemetrics.DefaultWindow)
	if f := fleet.Engines(enginemetrics.Overall); f != (enginemetrics.Fraction{}) {
		t.Errorf("after the window: Engines = %+v, want none", f)
	}
	for _, st := range s.Status() {
		if st.Cache != (enginemetrics.Fraction{}) {
			t.Errorf("after the window: %s's Cache = %+v, want none", st.Pod, st.Cache)
		}
	}
	if _, ok := gather(t, s.Collector())["kvindex_fleet_cached_fraction"]; ok {
		t.Error("kvindex_fleet_cached_fraction exported with no traffic in the window")
	}
}

// TestCounterReset restarts an engine between scrapes: its counters go
// back to zero, and what the new process counted is added, not
// subtracted.
func TestCounterReset(t *testing.T) {
	clk := newClock()
	e := newEngine(t, "pod-a", 1)
	s := newScraper(t, clk, enginemetrics.Config{}, e)
	ctx := context.Background()
	s.Scrape(ctx) // baseline: zero

	turns := conversation("restarts", 6)
	for n := 1; n <= len(turns); n++ {
		e.Chat(turns[:n]...)
	}
	clk.Advance(time.Second)
	s.Scrape(ctx)
	q1, h1 := e.Counters()

	e.Restart()
	e.Chat(turns[:1]...)
	q2, h2 := e.Counters()
	if q2 >= q1 {
		t.Fatalf("the restarted engine counted %v queries, the first process %v: want fewer", q2, q1)
	}
	clk.Advance(time.Second)
	s.Scrape(ctx)

	want := enginemetrics.Fraction{Queries: q1 + q2, Hits: h1 + h2}
	if got := s.Fleet().Engines(testModel); got != want {
		t.Fatalf("after a restart: Engines = %+v, want both processes' counts %+v", got, want)
	}
}

// TestDeadEndpoint stops an engine: its scrapes fail and are counted,
// and its last sample ages out of Latest, Metrics and the exported
// gauges.
func TestDeadEndpoint(t *testing.T) {
	clk := newClock()
	live, dead := newEngine(t, "pod-live", 1), newEngine(t, "pod-dead", 1)
	s := newScraper(t, clk, enginemetrics.Config{}, live, dead)
	ctx := context.Background()
	s.Scrape(ctx)
	if _, ok := s.Latest(dead.pod); !ok {
		t.Fatal("no sample of the engine while it is up")
	}

	dead.srv.Close()
	maxAge := picker.DefaultConfig().MetricsMaxAge
	clk.Advance(maxAge / 2)
	s.Scrape(ctx)
	// Within MaxAge the last sample stands: one failed scrape is not an
	// engine gone.
	if sm, ok := s.Latest(dead.pod); !ok || sm.ScrapedAt != clk.Now().Add(-maxAge/2) {
		t.Fatalf("Latest within MaxAge = %+v, %v; want the sample of the first scrape", sm, ok)
	}
	clk.Advance(maxAge)
	s.Scrape(ctx)

	if _, ok := s.Latest(dead.pod); ok {
		t.Error("Latest of the dead engine: still a sample past MaxAge")
	}
	if got := s.Metrics(dead.pod); got != (picker.Metrics{}) {
		t.Errorf("Metrics of the dead engine = %+v, want never scraped", got)
	}
	if _, ok := s.Latest(live.pod); !ok {
		t.Error("Latest of the live engine: none")
	}
	var st enginemetrics.PodStatus
	for _, p := range s.Status() {
		if p.Pod == dead.pod {
			st = p
		}
	}
	if st.Errors != 2 || st.LastError == "" {
		t.Errorf("dead engine's status %+v: want 2 errors and the last one", st)
	}
	m := gather(t, s.Collector())
	if got := m["kvindex_engine_scrape_errors_total"]; got[dead.pod] != 2 || got[live.pod] != 0 {
		t.Errorf("kvindex_engine_scrape_errors_total = %v, want 2 for %s and 0 for %s", got, dead.pod, live.pod)
	}
	for _, name := range []string{"kvindex_engine_requests_waiting", "kvindex_engine_kv_cache_usage"} {
		if _, ok := m[name][dead.pod]; ok {
			t.Errorf("%s exported for the dead engine's stale sample", name)
		}
		if _, ok := m[name][live.pod]; !ok {
			t.Errorf("%s not exported for the live engine", name)
		}
	}
}

// TestBoundedResponse serves metrics pages larger than MaxBytes: each
// scrape is refused and counted, whether the page declares its length or
// streams without end.
func TestBoundedResponse(t *testing.T) {
	const limit = 64 << 10
	line := "vllm:num_requests_waiting{model_name=\"m\",engine=\"0\"} 1\n"
	tests := []struct {
		name    string
		handler http.HandlerFunc
	}{
		{"streamed without end", func(w http.ResponseWriter, r *http.Request) {
			// Writes until the client goes away (or far past the limit).
			for range 100 * limit / len(line) {
				if _, err := w.Write([]byte(line)); err != nil {
					return
				}
			}
		}},
		{"declared length", func(w http.ResponseWriter, r *http.Request) {
			body := strings.Repeat(line, 2*limit/len(line))
			w.Header().Set("Content-Length", fmt.Sprint(len(body)))
			w.Write([]byte(body)) //nolint:errcheck // the client may hang up
		}},
		{"comments only", func(w http.ResponseWriter, r *http.Request) {
			for range 100 * limit / 16 {
				if _, err := w.Write([]byte("# padding......\n")); err != nil {
					return
				}
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(tt.handler)
			defer srv.Close()
			clk := newClock()
			s, err := enginemetrics.New(enginemetrics.Config{MaxBytes: limit, Now: clk.Now}, map[string]string{"hostile": srv.URL + "/metrics"}, nil)
			if err != nil {
				t.Fatal(err)
			}
			s.Scrape(context.Background())
			st := s.Status()[0]
			if st.Errors != 1 || !strings.Contains(st.LastError, "too large") {
				t.Fatalf("status %+v: want one error, page too large", st)
			}
			if _, ok := s.Latest("hostile"); ok {
				t.Fatal("a sample from a refused page")
			}
		})
	}
}

// TestScrapeErrors checks that each kind of bad endpoint is counted with
// a clear error.
func TestScrapeErrors(t *testing.T) {
	tests := []struct {
		name    string
		handler http.HandlerFunc
		want    string
	}{
		{"server error", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", http.StatusInternalServerError) }, "500"},
		{"not vllm", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "go_goroutines 3") }, "no vLLM engine metrics"},
		{"not metrics", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "<html>hello</html>") }, "parse"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(tt.handler)
			defer srv.Close()
			s, err := enginemetrics.New(enginemetrics.Config{}, map[string]string{"p": srv.URL}, nil)
			if err != nil {
				t.Fatal(err)
			}
			s.Scrape(context.Background())
			if st := s.Status()[0]; st.Errors != 1 || !strings.Contains(st.LastError, tt.want) {
				t.Fatalf("status %+v: want one error containing %q", st, tt.want)
			}
		})
	}
}

// TestRun scrapes on the interval until the context ends; NextRound
// reports each round.
func TestRun(t *testing.T) {
	e := newEngine(t, "pod-a", 1)
	s, err := enginemetrics.New(enginemetrics.Config{Interval: 10 * time.Millisecond}, map[string]string{e.pod: e.MetricsURL()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	next := s.NextRound()
	go func() {
		s.Run(ctx)
		close(done)
	}()
	<-next
	first, ok := s.Latest(e.pod)
	if !ok {
		t.Fatal("no sample after the first round")
	}
	// Rounds go on: wait for one that starts after the first sample.
	for {
		<-s.NextRound()
		if sm, _ := s.Latest(e.pod); sm.ScrapedAt.After(first.ScrapedAt) {
			break
		}
	}
	cancel()
	<-done
}

func TestNewConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  enginemetrics.Config
		eps  map[string]string
	}{
		{"negative interval", enginemetrics.Config{Interval: -1}, nil},
		{"window under a second", enginemetrics.Config{Window: time.Millisecond}, nil},
		{"no scheme", enginemetrics.Config{}, map[string]string{"p": "10.0.0.1:8000/metrics"}},
		{"ftp", enginemetrics.Config{}, map[string]string{"p": "ftp://10.0.0.1/metrics"}},
		{"no host", enginemetrics.Config{}, map[string]string{"p": "http:///metrics"}},
		{"empty pod", enginemetrics.Config{}, map[string]string{"": "http://10.0.0.1:8000/metrics"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := enginemetrics.New(tt.cfg, tt.eps, nil); !errors.Is(err, enginemetrics.ErrConfig) {
				t.Fatalf("New: error %v, want ErrConfig", err)
			}
		})
	}
}
