package kvindexbin

import (
	"os/exec"
	"strings"
	"testing"
)

func TestBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin, err := Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "kvindex") {
		t.Errorf("%s version: %v\n%s", bin, err, out)
	}
}
