package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/kvevents"
)

// healthStatesTable renders the stream health states as a markdown table
// from their one home, the doc comment of kvevents.Health: each "- HealthX:
// text" item becomes a row named by the state's word (Health.String, as
// the API's JSON views and `kvindex pods` print it).
func healthStatesTable(t *testing.T) string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "../../kvevents/health.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var doc string
	ast.Inspect(f, func(n ast.Node) bool {
		if g, ok := n.(*ast.GenDecl); ok && g.Tok == token.TYPE {
			for _, s := range g.Specs {
				if ts := s.(*ast.TypeSpec); ts.Name.Name == "Health" {
					doc = g.Doc.Text()
				}
			}
		}
		return true
	})
	items := map[string]string{}
	var cur string
	for _, l := range strings.Split(doc, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "- Health"):
			name, text, _ := strings.Cut(strings.TrimPrefix(l, "- "), ": ")
			cur = name
			items[cur] = text
		case l == "":
			cur = ""
		case cur != "":
			items[cur] += " " + l
		}
	}
	var b strings.Builder
	b.WriteString("| state | meaning, and how an engine leaves it |\n|---|---|\n")
	states := []kvevents.Health{kvevents.HealthOK, kvevents.HealthRestored, kvevents.HealthUnconfirmed, kvevents.HealthDegraded}
	identifier := map[kvevents.Health]string{}
	for name := range items {
		for _, h := range states {
			if strings.EqualFold(strings.TrimPrefix(name, "Health"), h.String()) {
				identifier[h] = name
			}
		}
	}
	for _, h := range states {
		text := items[identifier[h]]
		if text == "" {
			t.Fatalf("kvevents.Health's doc has no item for %s", h)
		}
		for _, o := range states { // the doc names states by identifier, the table by word
			text = strings.ReplaceAll(text, identifier[o], "`"+o.String()+"`")
		}
		b.WriteString("| `" + h.String() + "` | " + text + " |\n")
	}
	return b.String()
}

func TestDocsHealthStates(t *testing.T) {
	checkGenerated(t, "../../api/README.md", "health-states", healthStatesTable(t))
}
