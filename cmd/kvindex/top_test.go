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

// terminal is a tmux session on a private socket running a plain sh,
// which leaves the terminal's modes as the last program set them, so that
// stty shows what kvindex top restored. It is killed when the test ends.
type terminal struct {
	t          *testing.T
	tmux, sock string
}

// startTerminal starts a 160x40 terminal at its shell prompt, and builds
// the kvindex binary it runs (its path is returned); it skips the test
// when tmux is missing or under -short.
func startTerminal(t *testing.T) (*terminal, string) {
	tmux, err := exec.LookPath("tmux")
	if err != nil {
		t.Skip("tmux is not installed (apt-get install tmux): the kvindex top terminal tests drive it in tmux")
	}
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(buildKvindex(t), "kvindex")
	term := &terminal{t: t, tmux: tmux, sock: fmt.Sprintf("kvindex-top-%d-%d", os.Getpid(), time.Now().UnixNano())}
	term.run("new-session", "-d", "-s", "top", "-x", "160", "-y", "40", "env", "PS1=shell$ ", "TERM=xterm", "sh")
	t.Cleanup(func() { exec.Command(tmux, "-L", term.sock, "kill-server").Run() })
	term.await("the shell's prompt", func(s string) bool { return strings.Contains(s, "shell$") })
	return term, bin
}

// run runs a tmux command on the terminal's server.
func (term *terminal) run(args ...string) string {
	term.t.Helper()
	out, err := exec.Command(term.tmux, append([]string{"-L", term.sock, "-f", "/dev/null"}, args...)...).CombinedOutput()
	if err != nil {
		term.t.Fatalf("tmux %q: %v: %s", args, err, out)
	}
	return string(out)
}

// keys types keys (tmux send-keys names: "Enter", "C-c") into the terminal.
func (term *terminal) keys(keys ...string) {
	term.run(append([]string{"send-keys", "-t", "top"}, keys...)...)
}

// await polls the screen until cond holds of it, failing the test after
// topScreen, and returns it.
func (term *terminal) await(what string, cond func(string) bool) string {
	term.t.Helper()
	deadline := time.Now().Add(topScreen)
	for {
		s := term.run("capture-pane", "-p", "-t", "top")
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			term.t.Fatalf("timed out after %v waiting for %s; the screen:\n%s", topScreen, what, s)
		}
		time.Sleep(testutil.PollInterval)
	}
}

// awaitShellBack waits for the command line ending in "echo top exited
// $?; stty -a" to finish and checks that top exited 0 and gave the shell
// its screen (the command line typed on it, no frame, the prompt last) and
// its terminal modes back.
func (term *terminal) awaitShellBack() {
	term.t.Helper()
	// Done once stty has printed and the shell's prompt is back after it.
	s := term.await("top to exit and the shell to prompt again", func(s string) bool {
		f := strings.Fields(s)
		return strings.Contains(s, "top exited ") && strings.Contains(s, "speed") && f[len(f)-1] == "shell$"
	})
	if !strings.Contains(s, "top exited 0") {
		term.t.Errorf("top did not exit 0:\n%s", s)
	}
	if lines := strings.Fields(s); strings.Contains(s, "(q quits)") || !strings.Contains(s, "echo top exited $?") || lines[len(lines)-1] != "shell$" {
		term.t.Errorf("the shell's screen is not back (its command line above, no frame left, its prompt last):\n%s", s)
	}
	modes := " " + strings.Join(strings.Fields(s[strings.Index(s, "speed"):]), " ") + " "
	for _, mode := range []string{"icanon", "echo", "opost", "isig"} {
		if !strings.Contains(modes, " "+mode+" ") {
			term.t.Errorf("terminal mode %s not restored: stty -a shows\n%s", mode, s)
		}
	}
}

// kvindex top in a real terminal (tmux): the engines and their health
// appear, rates follow from the second scrape, the frame is laid out
// again when the terminal narrows, q quits and the shell gets its screen
// and terminal modes back.
func TestTopTerminal(t *testing.T) {
	term, bin := startTerminal(t)
	x := startE2E(t, []string{"pod-a", "pod-b"})

	line := fmt.Sprintf("%s top --server %s --metrics %s --interval 200ms; echo top exited $?; stty -a", bin, x.svc.GRPCAddr(), x.svc.HTTPAddr())
	term.keys(line, "Enter")
	rows := map[string]*regexp.Regexp{}
	for _, pod := range []string{"pod-a", "pod-b"} {
		rows[pod] = regexp.MustCompile(`(?m)^` + pod + `\s+\S+\s+ok\s+(?:GPU:)?\d+\s+\d+\.\d`) // ENGINE MODEL HEALTH BLOCKS (by medium) EVENTS/S
	}
	s := term.await("both engines, ok, with their events/s", func(s string) bool {
		return rows["pod-a"].MatchString(s) && rows["pod-b"].MatchString(s)
	})
	if !strings.Contains(s, "(q quits)") || strings.Contains(s, "shell$") {
		t.Errorf("top does not have the screen to itself:\n%s", s)
	}

	// Narrower, the frame is laid out again to fit: the replays column
	// goes first.
	term.run("resize-window", "-t", "top", "-x", "90")
	s = term.await("the frame laid out for 90 columns", func(s string) bool {
		return strings.Contains(s, "ENGINE") && !strings.Contains(s, "REPLAYS OK/FAILED")
	})
	for _, l := range strings.Split(s, "\n") {
		if len([]rune(l)) > 90 {
			t.Errorf("a line wider than the terminal's 90 columns: %q", l)
		}
	}

	term.keys("q")
	term.awaitShellBack()
}

// kvindex top against a kvindex that is not there shows why, frame after
// frame, and still quits on Ctrl-C as on q.
func TestTopTerminalUnreachable(t *testing.T) {
	term, bin := startTerminal(t)
	addr := testutil.FreeAddr(t) // nothing listens there
	term.keys(fmt.Sprintf("%s top --server %s --metrics %s --interval 200ms; echo top exited $?; stty -a", bin, addr, addr), "Enter")
	title := regexp.MustCompile(`kvindex top .* UTC`)
	first := term.await("the error line", func(s string) bool { return strings.Contains(s, "! cannot reach kvindex at "+addr) })
	term.await("a later frame, still with the error line", func(s string) bool {
		return title.FindString(s) != title.FindString(first) && strings.Contains(s, "! cannot reach kvindex at "+addr)
	})
	term.keys("C-c")
	term.awaitShellBack()
}
