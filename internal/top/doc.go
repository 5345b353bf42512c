// Package top is kvindex top: a live view of a running kvindex that
// refreshes in place, for an operator at a plain terminal (an SSH session
// will do).
//
// It is built in three layers so that each can be tested alone:
//
//   - a Sample is what one poll read: the ListPods answer and the
//     Prometheus pages of serve and of the pickers (Poller);
//   - a Model is what a frame shows, computed from the current Sample and
//     the one before it (Build): rates need two scrapes, so the first
//     frame shows "-" for them;
//   - a frame is lines of text, a pure function of a Model and the
//     terminal's size (Render).
//
// Run drives them: it redraws a frame every interval until q or Ctrl-C,
// or prints one frame when stdout is not a terminal or with Once.
package top
