package tokenizer

import (
	"testing"

	"github.com/kvindex/kvindex/internal/goldenfile"
)

// TestGoldenGenerator checks that golden.json names the script in this
// repository that regenerates it.
func TestGoldenGenerator(t *testing.T) {
	if _, err := goldenfile.Generator("testdata/golden.json"); err != nil {
		t.Fatal(err)
	}
}
