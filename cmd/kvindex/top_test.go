package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testutil"
)

// topScreen bounds each wait for what kvindex top shows.
const topScreen = time.Minute

// kvindex top --once (and top with stdout not a terminal) prints one
// frame with every engine and its health, rates not yet known.
func TestTopOnce(t *testing.T) {
	x := startE2E(t, []string{"pod-a", "pod-b"})
	out, errOut, code := runCLI(t, "top", "--once", "--server", x.svc.GRPCAddr(), "--metrics", x.svc.HTTPAddr())
	if code != exitOK {
		t.Fatalf("exit %d: %s\n%s", code, errOut, out)
	}
	for _, pod := range []string{"pod-a", "pod-b"} {
		if !regexp.MustCompile(`(?m)^` + pod + `\s+\S+\s+ok\s`).MatchString(out) {
			t.Errorf("no line for %s, health ok:\n%s", pod, out)
		}
	}
	if !strings.Contains(out, "events/s -") || strings.Contains(out, "\x1b[") {
		t.Errorf("a single frame has no rates yet and no terminal codes:\n%q", out)
	}
}

func TestTopUsageAndUnreachable(t *testing.T) {
	for _, args := range [][]string{
		{"top", "--interval", "0s"},
		{"top", "--picker", "ftp://picker"},
		{"top", "--metrics", "http://"},
		{"top", "extra"},
	} {
		if _, errOut, code := runCLI(t, args...); code != exitUsage {
			t.Errorf("%q: exit %d, want %d: %s", args, code, exitUsage, errOut)
		}
	}
	addr := testutil.FreeAddr(t) // nothing listens there
	out, errOut, code := runCLI(t, "top", "--once", "--server", addr, "--metrics", addr)
	if code != exitRuntime || !strings.Contains(out, "! cannot reach kvindex at "+addr) || !strings.Contains(errOut, "cannot reach kvindex") {
		t.Errorf("unreachable: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// kvindex top in a real terminal (tmux): the engines and their health
// appear, rates follow from the second scrape, q quits and the shell gets
// its screen and terminal modes back.
func TestTopTerminal(t *testing.T) {
	tmux, err := exec.LookPath("tmux")
	if err != nil {
		t.Skip("tmux is not installed (apt-get install tmux): TestTopTerminal drives kvindex top in it")
	}
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(buildKvindex(t), "kvindex")
	x := startE2E(t, []string{"pod-a", "pod-b"})

	sock := fmt.Sprintf("kvindex-top-%d-%d", os.Getpid(), time.Now().UnixNano())
	tm := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(tmux, append([]string{"-L", sock, "-f", "/dev/null"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %q: %v: %s", args, err, out)
		}
		return string(out)
	}
	// A plain sh, which leaves the terminal's modes as the last program
	// set them, so that stty shows what top restored.
	tm("new-session", "-d", "-s", "top", "-x", "160", "-y", "40", "env", "PS1=shell$ ", "TERM=xterm", "sh")
	t.Cleanup(func() { exec.Command(tmux, "-L", sock, "kill-server").Run() })
	screen := func() string { return tm("capture-pane", "-p", "-t", "top") }
	await := func(what string, cond func(string) bool) string {
		t.Helper()
		var s string
		deadline := time.Now().Add(topScreen)
		for s = screen(); !cond(s); s = screen() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out after %v waiting for %s; the screen:\n%s", topScreen, what, s)
			}
			time.Sleep(testutil.PollInterval)
		}
		return s
	}
	await("the shell's prompt", func(s string) bool { return strings.Contains(s, "shell$") })

	line := fmt.Sprintf("%s top --server %s --metrics %s --interval 200ms; echo top exited $?; stty -a", bin, x.svc.GRPCAddr(), x.svc.HTTPAddr())
	tm("send-keys", "-t", "top", line, "Enter")
	rows := map[string]*regexp.Regexp{}
	for _, pod := range []string{"pod-a", "pod-b"} {
		rows[pod] = regexp.MustCompile(`(?m)^` + pod + `\s+\S+\s+ok\s+\d+\s+\d+\.\d`) // ENGINE MODEL HEALTH BLOCKS EVENTS/S
	}
	s := await("both engines, ok, with their events/s", func(s string) bool {
		return rows["pod-a"].MatchString(s) && rows["pod-b"].MatchString(s)
	})
	if !strings.Contains(s, "(q quits)") || strings.Contains(s, "shell$") {
		t.Errorf("top does not have the screen to itself:\n%s", s)
	}

	// Narrower, the frame is laid out again to fit: the replays column
	// goes first.
	tm("resize-window", "-t", "top", "-x", "90")
	s = await("the frame laid out for 90 columns", func(s string) bool {
		return strings.Contains(s, "ENGINE") && !strings.Contains(s, "REPLAYS OK/FAILED")
	})
	for _, l := range strings.Split(s, "\n") {
		if len([]rune(l)) > 90 {
			t.Errorf("a line wider than the terminal's 90 columns: %q", l)
		}
	}

	tm("send-keys", "-t", "top", "q")
	s = await("top to exit", func(s string) bool { return strings.Contains(s, "top exited ") && strings.Contains(s, "speed") })
	if !strings.Contains(s, "top exited 0") {
		t.Errorf("top did not exit 0:\n%s", s)
	}
	// The main screen is back: the command line typed on it, no frame,
	// and the shell's prompt last.
	if lines := strings.Fields(s); strings.Contains(s, "ENGINE") || !strings.Contains(s, "echo top exited $?") || lines[len(lines)-1] != "shell$" {
		t.Errorf("the shell's screen is not back (its command line above, no frame left, its prompt last):\n%s", s)
	}
	modes := strings.Fields(s[strings.Index(s, "speed"):])
	for _, mode := range []string{"icanon", "echo", "opost"} {
		if !strings.Contains(" "+strings.Join(modes, " ")+" ", " "+mode+" ") {
			t.Errorf("terminal mode %s not restored: stty -a shows\n%s", mode, s)
		}
	}
}
