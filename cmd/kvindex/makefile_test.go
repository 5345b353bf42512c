package main

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The Makefile builds this binary on a fresh Debian machine: it finds Go
// in its standard install when go is not on PATH, and installs the C
// compiler cgo needs along with libzmq.
func TestMakefileFindsGoAndInstallsCC(t *testing.T) {
	mk, err := exec.LookPath("make")
	if err != nil {
		t.Skip("no make")
	}
	const goInstall = "/usr/local/go/bin/go"
	if _, err := os.Stat(goInstall); err != nil {
		t.Skip("Go is not installed in /usr/local/go")
	}
	cmd := exec.Command(mk, "-n", "build")
	cmd.Dir = "../.."
	cmd.Env = append(withoutEnv(os.Environ(), "GO", "PATH"), "PATH=/usr/bin:/bin") // no go on PATH
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n build: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "\n"+goInstall+" build ") {
		t.Errorf("without go on PATH, make build does not run %s:\n%s", goInstall, out)
	}
	// The deps recipe names every package it installs when missing.
	var pkgs []string
	for _, l := range strings.Split(string(out), "\n") {
		if i := strings.Index(l, "for p in "); i >= 0 {
			pkgs = strings.Fields(l[i+len("for p in ") : strings.Index(l, "; do")])
		}
	}
	if len(pkgs) == 0 {
		t.Fatalf("no package list in make's deps recipe:\n%s", out)
	}
	for _, want := range []string{"gcc", "libzmq3-dev", "pkg-config"} {
		if !strings.Contains(" "+strings.Join(pkgs, " ")+" ", " "+want+" ") {
			t.Errorf("DEB_PKGS %v lacks %s", pkgs, want)
		}
	}
}

// withoutEnv returns env without the variables names.
func withoutEnv(env []string, names ...string) []string {
	var out []string
	for _, e := range env {
		name, _, _ := strings.Cut(e, "=")
		if !slices.Contains(names, name) {
			out = append(out, e)
		}
	}
	return out
}
