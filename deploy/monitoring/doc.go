// Package monitoring holds kvindex's Grafana dashboard and Prometheus
// alerting rules (JSON and YAML, not Go) and the tests that check them
// offline:
//
//   - rules.yaml is the one home of the rules; prometheusrule.yaml, the
//     same rules as a Prometheus Operator PrometheusRule, and the table
//     of alerts in deploy/README.md are generated from it (go test
//     ./deploy/monitoring -run Generated -update), and the tests fail
//     when they differ;
//   - promtool (Debian's prometheus package) checks rules.yaml, runs the
//     alerts' unit tests in testdata/rules_test.yaml and parses every
//     dashboard query; those tests skip, saying so, where promtool is
//     not installed;
//   - every metric the rules' and the dashboard's PromQL select is one
//     kvindex exports (found in its metric constructors), or one of the
//     engines' own vLLM metrics listed in engineMetrics;
//   - every panel and query of the dashboard reads the data source
//     variable DS_PROMETHEUS, so that it imports into any Grafana.
//
// The package has no non-test code.
package monitoring
