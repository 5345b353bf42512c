// Package kvindexbin builds the kvindex binary for tests that run it as a
// process (to kill it, read its memory, or run README examples verbatim).
package kvindexbin

import (
	"fmt"
	"os/exec"
	"path/filepath"
)

// Build builds cmd/kvindex into dir and returns the binary's path.
func Build(dir string) (string, error) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("building kvindex needs the go command on PATH: %w", err)
	}
	bin := filepath.Join(dir, "kvindex")
	if out, err := exec.Command(goCmd, "build", "-o", bin, "github.com/kvindex/kvindex/cmd/kvindex").CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
}
