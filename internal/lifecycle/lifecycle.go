// Package lifecycle is how every long-running kvindex mode (serve, relay,
// picker, sim) starts and stops its parts: one Group that starts them in
// order, stops them in reverse order, waits for every goroutine it
// started, and reports the first error.
//
// A part is what its three optional functions make it: Start brings it up
// and returns once it is (a socket bound, a connection made), Run is its
// work in a goroutine of the group's, and Stop ends it. A part that fails
// to start stops the parts started before it; a Run that fails stops the
// whole group. Stopping a part is: Stop (servers finish their requests,
// a snapshot is written), then the cancellation of Run's context, then
// the wait for Run to return, before the part before it is stopped. So a
// part outlives every part started after it, and no goroutine of the
// group outlives Wait.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// DefaultStopTimeout bounds how long the parts' Stop functions may take,
// all together, when Group.StopTimeout is zero.
const DefaultStopTimeout = 10 * time.Second

// Part is one piece of a running service. Every function is optional.
type Part struct {
	// Name says what the part is in logs and errors.
	Name string
	// Start brings the part up; it returns once the part is up. ctx is the
	// group's: it ends when the group is asked to stop.
	Start func(ctx context.Context) error
	// Run is the part's work, in its own goroutine from the moment the
	// part has started. Its context ends when the part is stopped. A Run
	// that returns an error stops the group; one that returns nil simply
	// ends (its part is still stopped in turn).
	Run func(ctx context.Context) error
	// Stop ends the part, within ctx (the group's StopTimeout, shared by
	// every part's Stop). It is called only for a part whose Start
	// succeeded.
	Stop func(ctx context.Context) error
}

// Group starts parts in order and stops them in reverse order. The zero
// Group is ready to use; a Group runs once.
type Group struct {
	// StopTimeout bounds the stops, all together; 0: DefaultStopTimeout.
	StopTimeout time.Duration
	// Logger, if set, hears of the errors beyond the first.
	Logger *slog.Logger

	parts   []Part
	started []*running
	failed  chan error // the first Run failure
	done    chan struct{}
	ctx     context.Context
	err     error
	once    sync.Once
}

// running is a started part.
type running struct {
	Part
	cancel context.CancelFunc
	ended  chan struct{} // closed when Run has returned (or at once without one)
}

// Add appends a part; parts start in the order they are added.
func (g *Group) Add(p Part) { g.parts = append(g.parts, p) }

// Go adds a part that is only work: run, until its context ends.
func (g *Group) Go(name string, run func(ctx context.Context) error) {
	g.Add(Part{Name: name, Run: run})
}

// Start starts every part in order. If one fails, the parts already
// started are stopped in reverse order and its error is returned. Once
// Start has succeeded, the group runs until ctx ends or a part's Run
// fails; Wait then stops it.
func (g *Group) Start(ctx context.Context) error {
	if g.done != nil {
		return errors.New("lifecycle: group started twice")
	}
	g.done = make(chan struct{})
	g.failed = make(chan error, 1)
	g.ctx = ctx
	for _, p := range g.parts {
		if p.Start != nil {
			if err := p.Start(ctx); err != nil {
				g.stop(err)
				return err
			}
		}
		g.launch(p)
	}
	go func() {
		var cause error
		select {
		case <-ctx.Done():
		case cause = <-g.failed:
		}
		g.stop(cause)
	}()
	return nil
}

// launch runs a started part's Run in its own goroutine.
func (g *Group) launch(p Part) {
	rctx, cancel := context.WithCancel(context.WithoutCancel(g.ctx))
	r := &running{Part: p, cancel: cancel, ended: make(chan struct{})}
	g.started = append(g.started, r)
	if p.Run == nil {
		close(r.ended)
		return
	}
	go func() {
		defer close(r.ended)
		if err := p.Run(rctx); err != nil && rctx.Err() == nil {
			select {
			case g.failed <- fmt.Errorf("%s: %w", p.Name, err):
			default: // another part failed first
			}
		}
	}()
}

// stop stops the started parts in reverse order and records the first
// error: cause (what stopped the group), else the first Stop's.
func (g *Group) stop(cause error) {
	g.once.Do(func() {
		timeout := g.StopTimeout
		if timeout <= 0 {
			timeout = DefaultStopTimeout
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		first := cause
		for i := len(g.started) - 1; i >= 0; i-- {
			r := g.started[i]
			var err error
			if r.Stop != nil {
				err = r.Stop(ctx)
			}
			r.cancel()
			<-r.ended
			switch {
			case err == nil:
			case first == nil:
				first = fmt.Errorf("stopping %s: %w", r.Name, err)
			case g.Logger != nil:
				g.Logger.Warn("stopping a part failed", "part", r.Name, "err", err)
			}
		}
		// A Run that failed while the group stopped is not the cause.
		select {
		case err := <-g.failed:
			if first == nil {
				first = err
			} else if g.Logger != nil {
				g.Logger.Warn("a part failed while stopping", "err", err)
			}
		default:
		}
		g.err = first
		close(g.done)
	})
}

// Wait blocks until the group has stopped (its context ended or a part's
// Run failed, then every part stopped and every Run returned) and returns
// the first error.
func (g *Group) Wait() error {
	if g.done == nil {
		return errors.New("lifecycle: Wait before Start")
	}
	<-g.done
	return g.err
}

// Done is closed once the group has stopped; nil before Start.
func (g *Group) Done() <-chan struct{} { return g.done }

// Run starts the group and waits for it to stop: until ctx ends or a
// part fails.
func (g *Group) Run(ctx context.Context) error {
	if err := g.Start(ctx); err != nil {
		return err
	}
	return g.Wait()
}
