package top

import (
	"context"
	"errors"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"
)

// The terminal is driven with golang.org/x/term (raw mode, size) and a
// handful of ANSI sequences rather than a full screen library: a frame is
// whole lines redrawn in place and the only input is one key, which needs
// neither cell diffing, colours nor mouse, and x/term is pure Go and
// already in the module graph.
const (
	enterScreen = "\x1b[?1049h\x1b[?25l" // alternate screen, cursor hidden
	leaveScreen = "\x1b[?25h\x1b[?1049l" // cursor shown, main screen back
	home        = "\x1b[H"
	clearEOL    = "\x1b[K"
	clearEOS    = "\x1b[J"
)

// DefaultInterval is how often top polls unless told otherwise.
const DefaultInterval = time.Second

// fallbackWidth and fallbackHeight are used when the terminal does not
// tell its size.
const fallbackWidth, fallbackHeight = 80, 24

// Run polls with p every interval and shows the frames on out until ctx
// ends, q (or Ctrl-C) is pressed on in, or SIGINT or SIGTERM arrives,
// restoring the terminal as it was. When out is not a terminal, or with
// once, it prints one frame and returns, with an error if kvindex could
// not be read.
func Run(ctx context.Context, p *Poller, h Header, once bool, in io.Reader, out io.Writer) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	outFile, _ := out.(*os.File)
	tty := outFile != nil && term.IsTerminal(int(outFile.Fd()))
	if once || !tty {
		s := p.Poll(ctx)
		width := 0
		if tty {
			width, _ = size(outFile)
		}
		h.Interactive = false
		if _, err := io.WriteString(out, strings.Join(Render(Build(h, nil, s), width, 0), "\n")+"\n"); err != nil {
			return err
		}
		if s.PodsErr != "" {
			return errors.New(s.PodsErr)
		}
		return nil
	}

	ctx, quit := context.WithCancel(ctx)
	defer quit()
	if inFile, ok := in.(*os.File); ok && term.IsTerminal(int(inFile.Fd())) {
		old, err := term.MakeRaw(int(inFile.Fd()))
		if err != nil {
			return err
		}
		defer term.Restore(int(inFile.Fd()), old)
		go readKeys(inFile, quit)
	}
	io.WriteString(out, enterScreen)
	defer io.WriteString(out, leaveScreen)

	h.Interactive = true
	tick := time.NewTicker(h.Interval)
	defer tick.Stop()
	resize, stopResize := resized()
	defer stopResize()
	var prev *Sample
	for {
		cur := p.Poll(ctx)
		if ctx.Err() != nil {
			return nil
		}
		m := Build(h, prev, cur)
		prev = cur
		for redraw := true; redraw; {
			width, height := size(outFile)
			if _, err := io.WriteString(out, draw(Render(m, width, height))); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				return nil
			case <-resize:
			case <-tick.C:
				redraw = false
			}
		}
	}
}

// draw is a frame as written over the last one: from the top left, each
// line cleared to its end, the rest of the screen cleared. Lines end in
// \r\n since the terminal is raw.
func draw(lines []string) string {
	var b strings.Builder
	b.WriteString(home)
	for i, l := range lines {
		if i > 0 {
			b.WriteString("\r\n")
		}
		b.WriteString(l + clearEOL)
	}
	b.WriteString(clearEOS)
	return b.String()
}

// readKeys calls quit on q, Q or Ctrl-C (a raw terminal delivers it as a
// byte, not a signal), or when in ends.
func readKeys(in io.Reader, quit func()) {
	defer quit()
	buf := make([]byte, 64)
	for {
		n, err := in.Read(buf)
		for _, k := range buf[:n] {
			if k == 'q' || k == 'Q' || k == 3 {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func size(f *os.File) (int, int) {
	w, h, err := term.GetSize(int(f.Fd()))
	if err != nil || w <= 0 || h <= 0 {
		return fallbackWidth, fallbackHeight
	}
	return w, h
}
