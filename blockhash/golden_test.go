package blockhash_test

import (
	"testing"

	"github.com/kvindex/kvindex/internal/goldenfile"
)

// TestGoldenGenerators checks that each golden file names the script in
// this repository that regenerates it.
func TestGoldenGenerators(t *testing.T) {
	for _, file := range []string{"testdata/vllm_vectors.json", "testdata/pickle_edges.json"} {
		if _, err := goldenfile.Generator(file); err != nil {
			t.Error(err)
		}
	}
}
