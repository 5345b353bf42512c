package demo

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"flag"
	"html"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/ and the router list in README.md")

// sampleReport is a fixed report, so the formats can be pinned.
func sampleReport() *Report {
	rep := &Report{
		Scenario: ScenarioHotPrefix, Pods: 8, Seed: 1, Sessions: 16, Requests: 1024, CapacityBlocks: 2906,
		Setup: []string{"working set: 16 conversations x ~15.4k tokens + 2.0k shared = 248k tokens", "traffic: 1024 requests"},
		marks: []mark{{request: 410, label: "pod-4 restarts"}},
	}
	for i, name := range append(slices.Clone(Routers), PreciseNoLoad) {
		r := RouterResult{
			Name: name, CachedFraction: round(0.12*float64(i+1), 4), PrefillTokens: int64(1_000_000 * (7 - i)),
			TTFTP50: 100 * float64(7-i), TTFTP90: 2500 * float64(7-i), Imbalance: round(1+0.1*float64(i), 2), EngineHitRate: round(0.13*float64(i+1), 4),
			Timeline: []float64{round(0.1*float64(i), 2), 0.5, round(0.12*float64(i+1), 2)},
		}
		if name == PreciseNoLoad {
			rep.Extra = append(rep.Extra, r)
		} else {
			rep.Routers = append(rep.Routers, r)
		}
	}
	return rep
}

// sampleTraceReport is a fixed report of a replayed trace: the trace
// section, the ceiling and each router's share of it.
func sampleTraceReport() *Report {
	rep := sampleReport()
	rep.Scenario, rep.Sessions, rep.marks = ScenarioTrace, 0, nil
	rep.Setup = []string{"trace: conversations.jsonl, Mooncake format (detected): 1,312 requests", "ceiling: one unlimited cache would serve 90.0%"}
	rep.Trace = &TraceInfo{File: "conversations.jsonl", Format: "mooncake", BlockTokens: 512, Requests: 1024,
		SpanSeconds: 219.9, TimeScale: 1, PromptTokens: 6_500_000, Load: 0.5, Ceiling: 0.9}
	for _, rows := range [][]RouterResult{rep.Routers, rep.Extra} {
		for i := range rows {
			share := round(rows[i].CachedFraction/rep.Trace.Ceiling, 4)
			rows[i].OfCeiling = &share
		}
	}
	return rep
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from the golden file (go test -update rewrites it):\n%s", name, got)
	}
}

func TestReportFormats(t *testing.T) {
	for _, tc := range []struct {
		file   string
		write  func(io.Writer, *Report) error
		report func() *Report
	}{
		{"report.json", WriteJSON, sampleReport},
		{"table.txt", WriteTable, sampleReport},
		{"chart.svg", WriteSVG, sampleReport},
		{"report.html", WriteHTML, sampleReport},
		{"trace-report.json", WriteJSON, sampleTraceReport},
		{"trace-table.txt", WriteTable, sampleTraceReport},
	} {
		t.Run(tc.file, func(t *testing.T) {
			var b bytes.Buffer
			if err := tc.write(&b, tc.report()); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.file, b.Bytes())
		})
	}
}

// TestJSONContract pins the field names other tools read.
func TestJSONContract(t *testing.T) {
	var b bytes.Buffer
	if err := WriteJSON(&b, sampleReport()); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Scenario string           `json:"scenario"`
		Pods     int              `json:"pods"`
		Routers  []map[string]any `json:"routers"`
		Extra    []map[string]any `json:"extra_routers"`
	}
	if err := json.Unmarshal(b.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Scenario != ScenarioHotPrefix || doc.Pods != 8 {
		t.Fatalf("scenario %q pods %d", doc.Scenario, doc.Pods)
	}
	var names []string
	for _, r := range doc.Routers {
		names = append(names, r["name"].(string))
		for _, k := range []string{"fleet_cached_fraction", "prefill_tokens", "ttft_p50_ms", "ttft_p90_ms", "imbalance", "engine_hit_rate"} {
			if _, ok := r[k].(float64); !ok {
				t.Fatalf("router %v lacks numeric %q", r["name"], k)
			}
		}
	}
	if !slices.Equal(names, Routers) {
		t.Fatalf("routers %v, want %v in that order", names, Routers)
	}
	if len(doc.Extra) != 1 || doc.Extra[0]["name"] != PreciseNoLoad {
		t.Fatalf("extra_routers %v", doc.Extra)
	}
}

func TestSVGIsWellFormed(t *testing.T) {
	var b bytes.Buffer
	if err := WriteSVG(&b, sampleReport()); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(&b)
	polylines := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			polylines++
		}
	}
	if polylines != 7 {
		t.Fatalf("%d timeline lines, want one per router (7)", polylines)
	}
}

func TestFormatHelpers(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{commas(0), "0"}, {commas(999), "999"}, {commas(1000), "1,000"}, {commas(-1234567), "-1,234,567"},
		{kTokens(980), "980"}, {kTokens(13_600), "13.6k"}, {kTokens(218_000), "218k"}, {kTokens(1_250_000), "1.2M"},
		{msText(1234.4), "1,234 ms"}, {msText(17_800), "17.8 s"}, {pct(0.1234), "12.3%"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	if p := percentile([]time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 0.9); p != 9 {
		t.Errorf("p90 of 1..10 = %v, want 9 (nearest rank)", p)
	}
	if !strings.Contains(summary(sampleReport()), "precise served") {
		t.Error("no summary line")
	}
}

// TestRowsPlaceExtrasAfterTheirAnchor checks the table order: an extra
// row with an anchor follows it, the others come last.
func TestRowsPlaceExtrasAfterTheirAnchor(t *testing.T) {
	rep := sampleReport()
	rep.Extra = append(rep.Extra, RouterResult{Name: RouterSessionAffinity})
	var got []string
	for _, r := range rep.rows() {
		got = append(got, r.Name)
	}
	want := []string{RouterRoundRobin, RouterLeastLoaded, RouterConsistentHash, RouterSessionAffinity,
		RouterApproximate, RouterPrecise, RouterOracle, PreciseNoLoad}
	if !slices.Equal(got, want) {
		t.Fatalf("rows %v, want %v", got, want)
	}
}

// TestHTMLExplainsGatewayReplicas checks that the HTML report of the
// gateways scenario, and only that one, adds what replicas change.
func TestHTMLExplainsGatewayReplicas(t *testing.T) {
	for _, tc := range []struct {
		scenario string
		want     bool
	}{
		{ScenarioGateways, true},
		{ScenarioAgents, false},
	} {
		rep := sampleReport()
		rep.Scenario = tc.scenario
		var b bytes.Buffer
		if err := WriteHTML(&b, rep); err != nil {
			t.Fatal(err)
		}
		note := html.EscapeString("With 3 gateway replicas: " + routerDoc(RouterApproximate).Gateways)
		if got := strings.Contains(b.String(), note); got != tc.want {
			t.Errorf("%s: gateway note present %v, want %v", tc.scenario, got, tc.want)
		}
	}
}
