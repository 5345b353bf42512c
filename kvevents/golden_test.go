package kvevents_test

import (
	"testing"

	"github.com/kvindex/kvindex/internal/goldenfile"
)

// TestGoldenGenerator checks that wire_vectors.json names the script in this
// repository that regenerates it.
func TestGoldenGenerator(t *testing.T) {
	if _, err := goldenfile.Generator("testdata/wire_vectors.json"); err != nil {
		t.Fatal(err)
	}
}
