package top

import (
	"strings"
	"testing"
)

func TestParseMetrics(t *testing.T) {
	page := `# HELP kvindex_ingest_events_total Events applied.
# TYPE kvindex_ingest_events_total counter
kvindex_ingest_events_total{dp_rank="0",model="m",pod="a"} 10
kvindex_ingest_events_total{dp_rank="1",model="m",pod="a"} 5
# TYPE kvindex_fleet_cached_fraction gauge
kvindex_fleet_cached_fraction{model=""} 0.25
kvindex_fleet_cached_fraction{model="m"} 0.5
# TYPE go_goroutines gauge
go_goroutines 12
`
	m, err := ParseMetrics(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := m["go_goroutines"]; ok {
		t.Error("kept a family top does not show")
	}
	for _, tc := range []struct {
		name  string
		match map[string]string
		sum   float64
		ok    bool
	}{
		{metricEvents, nil, 15, true},
		{metricEvents, map[string]string{"pod": "a", "dp_rank": "1"}, 5, true},
		{metricEvents, map[string]string{"pod": "b"}, 0, false},
		{metricFleetFraction, map[string]string{"model": ""}, 0.25, true},
		{metricGaps, nil, 0, false},
	} {
		if got, ok := m.Sum(tc.name, tc.match); got != tc.sum || ok != tc.ok {
			t.Errorf("Sum(%s, %v) = %v, %v; want %v, %v", tc.name, tc.match, got, ok, tc.sum, tc.ok)
		}
	}
	if got, ok := m.Max(metricFleetFraction, nil); got != 0.5 || !ok {
		t.Errorf("Max = %v, %v; want 0.5, true", got, ok)
	}
	if got := m.Values(metricFleetFraction, "model"); len(got) != 2 || got[0] != "" || got[1] != "m" {
		t.Errorf("Values = %q", got)
	}
}

func TestParseMetricsRefusesOtherText(t *testing.T) {
	for _, page := range []string{"<html>not metrics</html>", "kvindex_ingest_events_total{pod=\"a\" 1\n"} {
		if _, err := ParseMetrics(strings.NewReader(page)); err == nil {
			t.Errorf("ParseMetrics(%q): no error", page)
		}
	}
}

func TestMetricsURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"localhost:8080", "http://localhost:8080/metrics"},
		{"http://picker:9090", "http://picker:9090/metrics"},
		{"https://kvindex:8080/", "https://kvindex:8080/metrics"},
		{"http://picker:9090/custom", "http://picker:9090/custom"},
	} {
		if got, err := MetricsURL(tc.in); err != nil || got != tc.want {
			t.Errorf("MetricsURL(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"ftp://host/x", "http://", "http://a b:1"} {
		if got, err := MetricsURL(bad); err == nil {
			t.Errorf("MetricsURL(%q) = %q, no error", bad, got)
		}
	}
	if got := DefaultServeMetrics("kvindex:50051", ":8080", true); got != "https://kvindex:8080/metrics" {
		t.Errorf("DefaultServeMetrics = %q", got)
	}
}
