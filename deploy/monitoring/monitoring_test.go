package monitoring

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

var update = flag.Bool("update", false, "rewrite prometheusrule.yaml and deploy/README.md's table of alerts from rules.yaml")

const (
	rulesFile          = "rules.yaml"
	prometheusRuleFile = "prometheusrule.yaml"
	dashboardFile      = "kvindex-dashboard.json"
	rulesTestFile      = "testdata/rules_test.yaml"
	readmeFile         = "../README.md"
	// moduleRoot is where exportedMetrics reads kvindex's source.
	moduleRoot = "../.."
)

// engineMetrics are the engines' own vLLM metrics the dashboard may read
// directly from Prometheus (if it scrapes the engines): kvindex does not
// re-export them, it computes kvindex_fleet_cached_fraction from them.
var engineMetrics = map[string]bool{
	"vllm:prefix_cache_hits_total":    true,
	"vllm:prefix_cache_queries_total": true,
}

// ruleFile is the layout of a Prometheus rules file, decoded strictly so
// that a misspelt or misplaced field fails.
type ruleFile struct {
	Groups []ruleGroup `yaml:"groups"`
}

type ruleGroup struct {
	Name     string `yaml:"name"`
	Interval string `yaml:"interval,omitempty"`
	Rules    []rule `yaml:"rules"`
}

type rule struct {
	Alert       string            `yaml:"alert,omitempty"`
	Record      string            `yaml:"record,omitempty"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for,omitempty"`
	Labels      map[string]string `yaml:"labels,omitempty"`
	Annotations map[string]string `yaml:"annotations,omitempty"`
}

// prometheusRule is the PrometheusRule (monitoring.coreos.com/v1) fields
// the generated file sets.
type prometheusRule struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Spec ruleFile `yaml:"spec"`
}

func decodeStrict(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// renderPrometheusRule wraps rules.yaml's groups, as they are written
// (block styles included), in a PrometheusRule.
func renderPrometheusRule(rules []byte) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(rules, &doc); err != nil {
		return nil, err
	}
	if len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, errors.New("rules.yaml: not a mapping")
	}
	var groups *yaml.Node
	for i, top := 0, doc.Content[0]; i+1 < len(top.Content); i += 2 {
		if top.Content[i].Value == "groups" {
			groups = top.Content[i+1]
		}
	}
	if groups == nil {
		return nil, errors.New("rules.yaml: no groups")
	}
	var out yaml.Node
	if err := yaml.Unmarshal([]byte(`apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: kvindex
  labels:
    app.kubernetes.io/name: kvindex
spec:
  groups: []
`), &out); err != nil {
		return nil, err
	}
	spec := out.Content[0].Content[7]
	spec.Content[1] = groups
	var buf bytes.Buffer
	buf.WriteString("# Generated from rules.yaml by `go test ./deploy/monitoring -run Generated -update`:\n" +
		"# edit rules.yaml, not this file. Apply it where the Prometheus Operator runs;\n" +
		"# its Prometheus selects rules by label (ruleSelector): add yours to metadata.labels.\n")
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&out); err != nil {
		return nil, err
	}
	return buf.Bytes(), enc.Close()
}

// TestGeneratedPrometheusRule: prometheusrule.yaml is rules.yaml's
// rules, as rendered now; -update rewrites it.
func TestGeneratedPrometheusRule(t *testing.T) {
	rules, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	want, err := renderPrometheusRule(rules)
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(prometheusRuleFile, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(prometheusRuleFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from what %s renders: run go test ./deploy/monitoring -run Generated -update", prometheusRuleFile, rulesFile)
	}
	// And the same rules once decoded, whatever the rendering.
	var plain ruleFile
	var pr prometheusRule
	decodeStrict(t, rulesFile, &plain)
	decodeStrict(t, prometheusRuleFile, &pr)
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" || pr.Metadata.Name == "" {
		t.Errorf("%s: %s %s %q, want a named monitoring.coreos.com/v1 PrometheusRule", prometheusRuleFile, pr.APIVersion, pr.Kind, pr.Metadata.Name)
	}
	a, _ := json.Marshal(plain)
	b, _ := json.Marshal(pr.Spec)
	if !bytes.Equal(a, b) {
		t.Errorf("%s's groups differ from %s's", prometheusRuleFile, rulesFile)
	}
}

// TestRenderPrometheusRule: the rendering keeps every group and rule,
// and refuses what is not a rules file.
func TestRenderPrometheusRule(t *testing.T) {
	out, err := renderPrometheusRule([]byte("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: |-\n          up\n            == 0\n"))
	if err != nil {
		t.Fatal(err)
	}
	var pr prometheusRule
	if err := yaml.Unmarshal(out, &pr); err != nil {
		t.Fatal(err)
	}
	if len(pr.Spec.Groups) != 1 || pr.Spec.Groups[0].Name != "g" || len(pr.Spec.Groups[0].Rules) != 1 ||
		pr.Spec.Groups[0].Rules[0].Expr != "up\n  == 0" {
		t.Errorf("rendered %+v", pr.Spec)
	}
	for _, bad := range []string{"", "- a\n", "rules: []\n"} {
		if _, err := renderPrometheusRule([]byte(bad)); err == nil {
			t.Errorf("%q: rendered, want an error", bad)
		}
	}
}

// alertTable renders the rules as deploy/README.md's table of alerts.
func alertTable(rf ruleFile) string {
	var b strings.Builder
	b.WriteString("| alert | severity | fires when | for |\n|---|---|---|---|\n")
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			expr := strings.Join(strings.Fields(r.Expr), " ")
			expr = strings.ReplaceAll(expr, "|", `\|`)
			expr = strings.ReplaceAll(expr, "( ", "(")
			expr = strings.ReplaceAll(expr, " )", ")")
			b.WriteString("| `" + r.Alert + "` | " + r.Labels["severity"] + " | `" + expr + "` | " + cmp.Or(r.For, "at once") + " |\n")
		}
	}
	return b.String()
}

// TestGeneratedReadmeAlerts: deploy/README.md lists rules.yaml's alerts,
// between its alerts markers; -update rewrites the list.
func TestGeneratedReadmeAlerts(t *testing.T) {
	const begin, end = "<!-- alerts:begin -->\n", "<!-- alerts:end -->"
	var rf ruleFile
	decodeStrict(t, rulesFile, &rf)
	readme, err := os.ReadFile(readmeFile)
	if err != nil {
		t.Fatal(err)
	}
	before, rest, ok1 := strings.Cut(string(readme), begin)
	_, after, ok2 := strings.Cut(rest, end)
	if !ok1 || !ok2 {
		t.Fatalf("%s: no %q ... %q", readmeFile, begin, end)
	}
	want := before + begin + alertTable(rf) + end + after
	if *update {
		if err := os.WriteFile(readmeFile, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if string(readme) != want {
		t.Errorf("%s's table of alerts differs from %s: run go test ./deploy/monitoring -run Generated -update", readmeFile, rulesFile)
	}
}

// TestRules: every alert has a duration, a severity and both
// annotations, and a unique name.
func TestRules(t *testing.T) {
	var rf ruleFile
	decodeStrict(t, rulesFile, &rf)
	seen := map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s: a rule that is no alert: %q", g.Name, r.Expr)
				continue
			}
			if seen[r.Alert] {
				t.Errorf("%s: twice", r.Alert)
			}
			seen[r.Alert] = true
			if s := r.Labels["severity"]; !slices.Contains([]string{"critical", "warning", "info"}, s) {
				t.Errorf("%s: severity %q, want critical, warning or info", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: needs a summary and a description", r.Alert)
			}
		}
	}
}

// promtool returns promtool's path, or skips the test.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not found: install Debian's prometheus package (make test-deps) to check the rules")
	}
	return p
}

func TestPromtoolCheckRules(t *testing.T) {
	out, err := exec.Command(promtool(t), "check", "rules", "--lint=all", "--lint-fatal", rulesFile).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
}

// TestPromtoolTestRules runs the alerts' unit tests: input series, and
// the alerts (labels and rendered annotations) they must raise.
func TestPromtoolTestRules(t *testing.T) {
	out, err := exec.Command(promtool(t), "test", "rules", rulesTestFile).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}

// grafanaIntervals are the interval variables Grafana substitutes in
// queries, with a value for checking them.
var grafanaIntervals = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "6h")

// TestPromtoolCheckDashboardQueries parses every dashboard query with
// Prometheus' own parser: promtool checks them as recording rules, with
// Grafana's interval variables given values.
func TestPromtoolCheckDashboardQueries(t *testing.T) {
	bin := promtool(t)
	var rf ruleFile
	g := ruleGroup{Name: "dashboard"}
	for i, p := range allPanels(readDashboard(t).Panels) {
		for j, tg := range p.Targets {
			g.Rules = append(g.Rules, rule{Record: fmt.Sprintf("dashboard:panel%d_query%d", i, j), Expr: grafanaIntervals.Replace(tg.Expr)})
		}
	}
	rf.Groups = append(rf.Groups, g)
	b, err := yaml.Marshal(rf)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboard-queries.yaml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "check", "rules", path).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules on the dashboard's queries: %v\n%s", err, out)
	}
}

// dashboard is the part of Grafana's dashboard JSON the tests read.
type dashboard struct {
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int                      `json:"id"`
	Type       string                   `json:"type"`
	Title      string                   `json:"title"`
	Datasource *datasource              `json:"datasource"`
	GridPos    struct{ H, W, X, Y int } `json:"gridPos"`
	Targets    []struct {
		Datasource *datasource `json:"datasource"`
		Expr       string      `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// allPanels flattens rows.
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// TestDashboard: the dashboard reads its data source from the variable
// DS_PROMETHEUS everywhere, and its panels have unique ids, fit the
// 24-column grid without overlapping and query something.
func TestDashboard(t *testing.T) {
	d := readDashboard(t)
	if d.Title == "" || d.UID == "" {
		t.Error("the dashboard needs a title and a uid")
	}
	hasVar := false
	for _, v := range d.Templating.List {
		if v.Name == "DS_PROMETHEUS" && v.Type == "datasource" && v.Query == "prometheus" {
			hasVar = true
		}
	}
	if !hasVar {
		t.Error("no Prometheus data source variable DS_PROMETHEUS")
	}
	const ds = "${DS_PROMETHEUS}"
	ids := map[int]bool{}
	panels := allPanels(d.Panels)
	for i, p := range panels {
		for _, q := range panels[:i] {
			a, b := p.GridPos, q.GridPos
			if a.X < b.X+b.W && b.X < a.X+a.W && a.Y < b.Y+b.H && b.Y < a.Y+a.H {
				t.Errorf("%q overlaps %q", p.Title, q.Title)
			}
		}
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W <= 0 || p.GridPos.X < 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("%q: gridPos %+v outside the 24 columns", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != ds {
			t.Errorf("%q: data source %+v, want uid %s", p.Title, p.Datasource, ds)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%q: no queries", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.Datasource == nil || tg.Datasource.UID != ds {
				t.Errorf("%q: a query's data source %+v, want uid %s", p.Title, tg.Datasource, ds)
			}
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("%q: an empty query", p.Title)
			}
		}
	}
}

// exprs returns every PromQL expression of the rules and the dashboard,
// each with where it is.
func exprs(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	var rf ruleFile
	decodeStrict(t, rulesFile, &rf)
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			out[rulesFile+": "+r.Alert+r.Record] = r.Expr
		}
	}
	for _, p := range allPanels(readDashboard(t).Panels) {
		for i, tg := range p.Targets {
			out[dashboardFile+": "+p.Title+" #"+string(rune('A'+i))] = tg.Expr
		}
	}
	return out
}

// TestMetricsExported: every metric the rules and the dashboard select
// is one kvindex exports, or one of the engines' listed in engineMetrics,
// and the dashboard shows every metric an alert fires on.
func TestMetricsExported(t *testing.T) {
	exported, err := exportedMetrics(moduleRoot)
	if err != nil {
		t.Fatal(err)
	}
	// The inventory itself: a few names from each component's
	// constructors, so that a reader that finds nothing cannot pass.
	for _, name := range []string{
		"kvindex_engine_health",                           // api/server
		"kvindex_query_duration_seconds_bucket",           // api/server, a histogram
		"kvindex_fleet_cached_fraction",                   // picker/enginemetrics
		"kvindex_picker_index_fallbacks_total",            // picker/gateway
		"kvindex_relay_dropped_batches_total",             // kvevents/natstransport
		"kvindex_nats_index_stream_sequence",              // internal/service
		"kvindex_snapshot_last_success_timestamp_seconds", // internal/snapstore
	} {
		if !exported[name] {
			t.Errorf("the inventory of kvindex's metrics lacks %s", name)
		}
	}
	used := map[string]bool{}
	for where, expr := range exprs(t) {
		names, err := metricNames(expr)
		if err != nil {
			t.Errorf("%s: %v", where, err)
			continue
		}
		if len(names) == 0 {
			t.Errorf("%s: selects no metric: %q", where, expr)
		}
		for _, n := range names {
			used[n] = true
			if !exported[n] && !engineMetrics[n] {
				t.Errorf("%s: %s is neither a metric kvindex exports nor a listed engine metric", where, n)
			}
		}
	}
	for n := range engineMetrics {
		if !used[n] {
			t.Errorf("engineMetrics lists %s, which nothing uses", n)
		}
	}
}

// TestMetricNames: the PromQL reader finds the names and only them.
func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
		err  bool
	}{
		{expr: `up`, want: []string{"up"}},
		{expr: `kvindex_engine_health{state=~"ok|partial", pod!="a}b"} == 1`, want: []string{"kvindex_engine_health"}},
		{expr: `rate(a_total[5m]) / ignoring (reason) group_left sum without (result) (rate(b_total[$__rate_interval]))`, want: []string{"a_total", "b_total"}},
		{expr: `histogram_quantile(0.99, sum by (le, api) (rate(x_bucket[5m]))) > 0.05`, want: []string{"x_bucket"}},
		{expr: `avg_over_time(f[30m]) < 0.7 * avg_over_time(f[1d] offset 30m)`, want: []string{"f"}},
		{expr: `changes(s[10m]) == 0 and on () sum(rate(r[10m])) > 0`, want: []string{"r", "s"}},
		{expr: `label_replace(m, "engine", "$1", "pod", "(.*)")`, want: []string{"m"}},
		{expr: `rate(vllm:prefix_cache_hits_total[${interval}]) or vector(0) * 1e3`, want: []string{"vllm:prefix_cache_hits_total"}},
		{expr: `time() - max(t > 0)`, want: []string{"t"}},
		{expr: `sum BY (x) (y) unless Z`, want: []string{"Z", "y"}},
		{expr: `topk(5, sum by (instance) (q)) and inf > NaN`, want: []string{"q"}},
		{expr: `m{a="b"`, err: true},
		{expr: `rate(m[5m)`, err: true},
		{expr: `m{a="b}`, err: true},
	} {
		got, err := metricNames(tc.expr)
		if (err != nil) != tc.err {
			t.Errorf("%q: error %v, want one: %v", tc.expr, err, tc.err)
			continue
		}
		if !tc.err && !slices.Equal(got, tc.want) {
			t.Errorf("%q: %q, want %q", tc.expr, got, tc.want)
		}
	}
}

// TestExportedMetricsReadsConstructors: the inventory takes the names of
// the constructors' shapes, and no other kvindex_ literal.
func TestExportedMetricsReadsConstructors(t *testing.T) {
	dir := t.TempDir()
	src := `package p

import "github.com/prometheus/client_golang/prometheus"

var (
	a = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvindex_a_total"})
	h = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvindex_h_seconds"})
	d = prometheus.NewDesc("kvindex_d", "help", nil, nil)
	w = wrap("kvindex_w_bytes", "help")
	notAMetric = map[string]int{"kvindex_label_value": 1}
	prefix = "kvindex_" + "built"
)

func wrap(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
`
	if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "p_test.go"), []byte(`package p
var _ = wrap("kvindex_in_a_test", "")
`), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := exportedMetrics(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for n := range got {
		names = append(names, n)
	}
	slices.Sort(names)
	want := []string{"kvindex_a_total", "kvindex_d", "kvindex_h_seconds", "kvindex_h_seconds_bucket", "kvindex_h_seconds_count", "kvindex_h_seconds_sum", "kvindex_w_bytes"}
	if !slices.Equal(names, want) {
		t.Errorf("got %q, want %q", names, want)
	}
}
