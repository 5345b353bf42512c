package client

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// goTool finds the go command on PATH: the dependency check is part of
// the test suite, so a missing go command fails rather than skips it.
func goTool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("go")
	if err != nil {
		t.Fatal("the dependency check needs the go command on PATH:", err)
	}
	return p
}

// forbiddenDeps are the packages a program importing the client must not
// pull in: the server and what it stands on (the index, tokenizers, event
// decoding and transport, libzmq, Prometheus).
// Each entry forbids a package and everything below it.
var forbiddenDeps = []struct{ root, why string }{
	{"github.com/kvindex/kvindex/api/server", "the server"},
	{"github.com/kvindex/kvindex/api/watchhub", "the watch hub"},
	{"github.com/kvindex/kvindex/indexer", "the index"},
	{"github.com/kvindex/kvindex/kvevents", "event decoding and transport"},
	{"github.com/kvindex/kvindex/tokenizer", "the tokenizers"},
	{"github.com/pebbe/zmq4", "libzmq"},
	{"github.com/prometheus", "Prometheus"},
}

// A router that only asks kvindex questions imports the client without
// the server or its dependencies.
func TestDependencies(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command")
	}
	out, err := exec.Command(goTool(t), "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	for _, d := range deps {
		for _, f := range forbiddenDeps {
			if d == f.root || strings.HasPrefix(d, f.root+"/") {
				t.Errorf("the client depends on %s (%s)", d, f.why)
			}
		}
	}
	t.Logf("%d non-standard packages (this one included)", len(deps))
}

// The client builds without cgo, so that it can go into static binaries.
func TestBuildsWithoutCgo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command")
	}
	cmd := exec.Command(goTool(t), "build", "-o", os.DevNull, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build: %v\n%s", err, out)
	}
}
