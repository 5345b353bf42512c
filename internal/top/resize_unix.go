//go:build unix

package top

import (
	"os"
	"os/signal"
	"syscall"
)

// resized delivers a value each time the terminal changes size, so that
// the frame is laid out again at once rather than at the next poll; stop
// ends the delivery.
func resized() (c <-chan os.Signal, stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGWINCH)
	return ch, func() { signal.Stop(ch) }
}
