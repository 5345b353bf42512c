package memlimit

import (
	"flag"
	"fmt"
	"testing"

	"github.com/kvindex/kvindex/internal/testutil/docgen"
)

var update = flag.Bool("update", false, "rewrite README.md's statement of the process bound")

// TestREADMEProcessBound checks README.md's statement of the process
// bound ("Reliability") against ProcessBound's shares; -update rewrites it.
func TestREADMEProcessBound(t *testing.T) {
	if 100%slackDiv != 0 || FixedOverhead%(1<<20) != 0 {
		t.Fatalf("the statement needs a whole percentage and whole MiB: budget/%d, %d B", slackDiv, FixedOverhead)
	}
	body := fmt.Sprintf("the budget + %d%% + a fixed %d MiB", 100/slackDiv, FixedOverhead>>20)
	docgen.Check(t, "../../README.md", "process-bound", body, *update)
}
