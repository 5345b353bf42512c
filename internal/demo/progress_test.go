package demo

import (
	"bytes"
	"strings"
	"testing"
)

// The bar redraws its line only when the percentage changes, clears it at
// the end, and draws nothing when off.
func TestProgressBar(t *testing.T) {
	var b bytes.Buffer
	p := NewProgressBar(&b, true)
	p.Update(1, 4)
	p.Update(1, 4)
	p.Update(4, 4)
	p.Finish()
	out := b.String()
	if strings.Count(out, "%") != 2 || !strings.Contains(out, ">") || !strings.Contains(out, " 25% simulating routers") ||
		!strings.Contains(out, "[========================================] 100%") || !strings.HasSuffix(out, "\r"+strings.Repeat(" ", 70)+"\r") {
		t.Errorf("drew %q", out)
	}
	b.Reset()
	off := NewProgressBar(&b, false)
	off.Update(1, 2)
	off.Finish()
	if b.Len() != 0 || IsTerminal(&b) {
		t.Errorf("off: drew %q; a buffer taken for a terminal: %v", b.String(), IsTerminal(&b))
	}
}
