package main

import (
	"strings"
	"testing"
)

// Usage errors exit 2 with one line naming the help to read; the version
// is printed the same way by the flag and the command.
func TestCLIExitCodesAndVersion(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout string // prefix
		stderr string // exact
	}{
		{"unknown flag", []string{"pods", "--bogus"}, exitUsage, "", "kvindex: unknown flag: --bogus (see 'kvindex pods --help')\n"},
		{"unknown command", []string{"bogus"}, exitUsage, "", "kvindex: unknown command \"bogus\" for \"kvindex\" (see 'kvindex --help')\n"},
		{"stray argument", []string{"pods", "x"}, exitUsage, "", "kvindex: kvindex pods takes no arguments, got \"x\" (see 'kvindex pods --help')\n"},
		{"bad flag value", []string{"pods", "--timeout", "soon"}, exitUsage, "", "kvindex: invalid argument \"soon\" for \"--timeout\" flag: time: invalid duration \"soon\" (see 'kvindex pods --help')\n"},
		{"version flag", []string{"--version"}, exitOK, "kvindex ", ""},
		{"version command", []string{"version"}, exitOK, "kvindex ", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := runCLI(t, tc.args...)
			if code != tc.code || errOut != tc.stderr || !strings.HasPrefix(out, tc.stdout) {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit %d, stdout %q..., stderr %q", code, out, errOut, tc.code, tc.stdout, tc.stderr)
			}
		})
	}
	a, _, _ := runCLI(t, "--version")
	b, _, _ := runCLI(t, "version")
	if a != b || strings.Count(a, "\n") != 1 || !strings.Contains(a, "go1.") {
		t.Errorf("--version %q and version %q: want the same one line naming the Go version", a, b)
	}
}
