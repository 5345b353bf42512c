package faultlab

import (
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/bytesize"
	"github.com/kvindex/kvindex/internal/memlimit"
	"github.com/kvindex/kvindex/internal/testutil/docgen"
)

var update = flag.Bool("update", false, "rewrite the flood row's limit in README.md's fault table")

// TestREADMEFloodLimit checks the limit in README.md's fault table for
// the flood (a measured peak beside it, copied by hand from make faults)
// against memlimit.ProcessBound of the flood's budget; -update rewrites
// it. It needs no kvindex binary: go test -short -run TestREADMEFloodLimit.
func TestREADMEFloodLimit(t *testing.T) {
	const readme = "../../README.md"
	body := strings.TrimSuffix(mib(memlimit.ProcessBound(floodBudget)), "MiB") // as make faults prints it
	docgen.Check(t, readme, "flood-rss-limit", body, *update)

	doc, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(doc), "\n") {
		if strings.Contains(l, "<!-- flood-rss-limit:begin -->") {
			if budget := "`--memory-budget " + bytesize.Format(floodBudget) + "`"; !strings.Contains(l, budget) {
				t.Errorf("README.md's flood row does not name the flood's budget, %s:\n%s", budget, l)
			}
		}
	}
}
