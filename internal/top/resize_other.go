//go:build !unix

package top

import "os"

// resized never delivers where there is no SIGWINCH: the next frame is
// laid out for the new size.
func resized() (c <-chan os.Signal, stop func()) { return nil, func() {} }
