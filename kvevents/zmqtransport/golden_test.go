package zmqtransport

import (
	"testing"

	"github.com/kvindex/kvindex/internal/goldenfile"
)

// TestGoldenGenerator checks that wire_payloads.json names the script in this
// repository that regenerates it.
func TestGoldenGenerator(t *testing.T) {
	if _, err := goldenfile.Generator("testdata/interop/wire_payloads.json"); err != nil {
		t.Fatal(err)
	}
}
