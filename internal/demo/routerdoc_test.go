package demo

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvindex/kvindex/internal/testutil/docgen"
)

// README.md's generated lists sit between begin and end markers; the hint
// tells whoever edits README.md where the text comes from.
const (
	readmePath        = "../../README.md"
	readmeRoutersHint = "<!-- Generated from internal/demo/routerdoc.go: edit the text there, then run\n" +
		"     go test ./internal/demo -run TestREADMERouters -update -->\n"
)

// TestREADMERouters checks that README.md lists the routers exactly as
// RoutersMarkdown renders routerDocs, and what changes with several
// gateway replicas as GatewaysMarkdown does. After editing routerDocs,
// rewrite README.md's blocks with
//
//	go test ./internal/demo -run TestREADMERouters -update
func TestREADMERouters(t *testing.T) {
	for _, tc := range []struct {
		block string
		text  func() string
	}{
		{"demo-routers", RoutersMarkdown},
		{"demo-gateways", GatewaysMarkdown},
	} {
		docgen.Check(t, readmePath, tc.block, "\n"+readmeRoutersHint+tc.text(), *update)
	}
}

// TestRouterDocs checks that every router is described once, in report
// order, in the form the renderers assume.
func TestRouterDocs(t *testing.T) {
	var names []string
	for _, d := range RouterDocs() {
		names = append(names, d.Name)
		if d.Summary == "" || strings.HasSuffix(d.Summary, ".") {
			t.Errorf("%s: summary %q: want a phrase without a final period", d.Name, d.Summary)
		}
		if !strings.HasSuffix(d.Explanation, ".") {
			t.Errorf("%s: explanation %q: want whole sentences", d.Name, d.Explanation)
		}
		if Why(d.Name) != d.Explanation {
			t.Errorf("Why(%q) is not its explanation", d.Name)
		}
		// The gateways scenario runs the standard routers only.
		switch std := slices.Contains(Routers, d.Name); {
		case std && !strings.HasSuffix(d.Gateways, "."):
			t.Errorf("%s: gateways text %q: want whole sentences", d.Name, d.Gateways)
		case !std && d.Gateways != "":
			t.Errorf("%s: gateways text for a row the gateways scenario does not run", d.Name)
		}
	}
	if want := append(slices.Clone(Routers), PreciseNoLoad, RouterSessionAffinity); !reflect.DeepEqual(names, want) {
		t.Fatalf("described %v, want %v", names, want)
	}
	if Why("nope") != "" {
		t.Error("Why of an unknown router is not empty")
	}
	for _, line := range strings.Split(strings.TrimSuffix(RoutersHelp(), "\n"), "\n") {
		if n := utf8.RuneCountInString(line); n > 80 {
			t.Errorf("help line of %d columns: %q", n, line)
		}
	}
	for _, line := range strings.Split(strings.TrimSuffix(RoutersMarkdown()+GatewaysMarkdown(), "\n"), "\n") {
		if n := utf8.RuneCountInString(line); n > 100 {
			t.Errorf("markdown line of %d columns: %q", n, line)
		}
	}
}

func TestWrap(t *testing.T) {
	for _, tc := range []struct {
		text  string
		width int
		want  string
	}{
		{"a b c", 80, "> a b c\n"},
		{"aa bb cc dd", 7, "> aa bb\n  cc dd\n"},
		{"short averyveryverylongword x", 8, "> short\n  averyveryverylongword\n  x\n"},
		{"", 10, "> \n"},
	} {
		if got := wrap(tc.text, tc.width, "> ", "  "); got != tc.want {
			t.Errorf("wrap(%q, %d) = %q, want %q", tc.text, tc.width, got, tc.want)
		}
	}
}

// TestOracleIsPreciseWithoutDelay backs the oracle's description: in a
// steady fleet with an instant event path, kvindex's view is the engines'
// true state, so precise and the oracle decide alike and score alike; any
// difference at the default delay is the delay's. (With churn they part
// at the restart: kvindex learns that the cache is gone only when the new
// engine process first publishes.)
func TestOracleIsPreciseWithoutDelay(t *testing.T) {
	for _, sc := range []string{ScenarioAgents, ScenarioHotPrefix} {
		t.Run(sc, func(t *testing.T) {
			o := small(sc, 1)
			o.Delay = 0
			o.Routers = []string{RouterPrecise, RouterOracle}
			rep, err := Run(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			p, or := *rep.Router(RouterPrecise), *rep.Router(RouterOracle)
			p.Name = RouterOracle
			if !reflect.DeepEqual(p, or) {
				t.Fatalf("at delay 0 precise and oracle differ:\nprecise %+v\noracle  %+v", p, or)
			}
		})
	}
}
