package demo

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
)

// IsTerminal reports whether w is a character device (a terminal), where
// a ProgressBar may redraw its line.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// ProgressBar draws a run's progress, "[=====>    ] 45% simulating
// routers", on one terminal line: Update is Options.Progress.
type ProgressBar struct {
	w    io.Writer
	on   bool
	mu   sync.Mutex
	last int // last percentage drawn
}

// NewProgressBar returns a bar drawn on w; off (on false), it draws
// nothing.
func NewProgressBar(w io.Writer, on bool) *ProgressBar { return &ProgressBar{w: w, on: on, last: -1} }

// Update draws done of total, if the percentage changed.
func (p *ProgressBar) Update(done, total int) {
	if !p.on || total <= 0 {
		return
	}
	pc := done * 100 / total
	p.mu.Lock()
	defer p.mu.Unlock()
	if pc == p.last {
		return
	}
	p.last = pc
	const width = 40
	fill := pc * width / 100
	bar := strings.Repeat("=", fill)
	if fill < width {
		bar += ">" + strings.Repeat(" ", width-fill-1)
	}
	fmt.Fprintf(p.w, "\r[%s] %3d%% simulating routers", bar, pc)
}

// Finish clears the bar's line.
func (p *ProgressBar) Finish() {
	if !p.on || p.last < 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprint(p.w, "\r"+strings.Repeat(" ", 70)+"\r")
}
