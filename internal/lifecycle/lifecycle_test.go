package lifecycle_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/lifecycle"
)

// journal records what the parts did, in order.
type journal struct {
	mu  sync.Mutex
	log []string
}

func (j *journal) add(s string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.log = append(j.log, s)
}

func (j *journal) get() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.log)
}

// part is a part that journals its start, its work's end and its stop;
// its Run waits for its context, then journals.
func part(j *journal, name string, startErr error) lifecycle.Part {
	return lifecycle.Part{
		Name: name,
		Start: func(context.Context) error {
			j.add("start " + name)
			return startErr
		},
		Run: func(ctx context.Context) error {
			<-ctx.Done()
			j.add("ran " + name)
			return nil
		},
		Stop: func(context.Context) error {
			j.add("stop " + name)
			return nil
		},
	}
}

func TestStartsInOrderStopsInReverse(t *testing.T) {
	var j journal
	var g lifecycle.Group
	for _, n := range []string{"a", "b", "c"} {
		g.Add(part(&j, n, nil))
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := j.get(); !slices.Equal(got, []string{"start a", "start b", "start c"}) {
		t.Fatalf("after Start: %v", got)
	}
	cancel()
	if err := g.Wait(); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	// Each part is stopped, then its work ends, before the part before it.
	want := []string{"start a", "start b", "start c", "stop c", "ran c", "stop b", "ran b", "stop a", "ran a"}
	if got := j.get(); !slices.Equal(got, want) {
		t.Fatalf("journal %v, want %v", got, want)
	}
}

func TestStartFailureStopsTheStarted(t *testing.T) {
	var j journal
	var g lifecycle.Group
	boom := errors.New("port taken")
	g.Add(part(&j, "a", nil))
	g.Add(part(&j, "b", boom))
	g.Add(part(&j, "c", nil))
	if err := g.Start(context.Background()); !errors.Is(err, boom) {
		t.Fatalf("Start: %v, want %v", err, boom)
	}
	// b never started: it is not stopped; c was never tried.
	want := []string{"start a", "start b", "stop a", "ran a"}
	if got := j.get(); !slices.Equal(got, want) {
		t.Fatalf("journal %v, want %v", got, want)
	}
	if err := g.Wait(); !errors.Is(err, boom) {
		t.Errorf("Wait after a failed Start: %v", err)
	}
}

func TestRunFailureStopsTheGroup(t *testing.T) {
	var j journal
	var g lifecycle.Group
	boom := errors.New("listener closed")
	g.Add(part(&j, "a", nil))
	g.Go("server", func(context.Context) error { return boom })
	g.Add(part(&j, "c", nil))
	if err := g.Start(context.Background()); err != nil { // never cancelled
		t.Fatal(err)
	}
	err := g.Wait()
	if !errors.Is(err, boom) || !strings.HasPrefix(err.Error(), "server: ") {
		t.Fatalf("Wait: %v, want the server's error", err)
	}
	want := []string{"start a", "start c", "stop c", "ran c", "stop a", "ran a"}
	if got := j.get(); !slices.Equal(got, want) {
		t.Fatalf("journal %v, want %v", got, want)
	}
}

// The first error wins: a Stop's error is reported when nothing failed
// before, and the stops go on past it.
func TestFirstStopError(t *testing.T) {
	var j journal
	var g lifecycle.Group
	first, second := errors.New("first"), errors.New("second")
	g.Add(lifecycle.Part{Name: "a", Stop: func(context.Context) error { j.add("stop a"); return second }})
	g.Add(lifecycle.Part{Name: "b", Stop: func(context.Context) error { j.add("stop b"); return first }})
	ctx, cancel := context.WithCancel(context.Background())
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	err := g.Wait()
	if !errors.Is(err, first) || errors.Is(err, second) || err.Error() != "stopping b: first" {
		t.Fatalf("Wait: %v", err)
	}
	if got := j.get(); !slices.Equal(got, []string{"stop b", "stop a"}) {
		t.Fatalf("journal %v", got)
	}
}

// Stops share one deadline: a part that honours it cannot hold the group
// past it, and the parts after it are still stopped.
func TestStopTimeoutShared(t *testing.T) {
	var j journal
	g := lifecycle.Group{StopTimeout: 50 * time.Millisecond}
	g.Add(lifecycle.Part{Name: "a", Stop: func(ctx context.Context) error {
		j.add("stop a")
		return ctx.Err()
	}})
	g.Add(lifecycle.Part{Name: "slow", Stop: func(ctx context.Context) error {
		<-ctx.Done() // a server whose clients never finish
		j.add("stop slow")
		return nil
	}})
	ctx, cancel := context.WithCancel(context.Background())
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	err := g.Wait()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait: %v, want the deadline the slow part used up", err)
	}
	if got := j.get(); !slices.Equal(got, []string{"stop slow", "stop a"}) {
		t.Fatalf("journal %v", got)
	}
}

func TestMisuse(t *testing.T) {
	var g lifecycle.Group
	if err := g.Wait(); err == nil {
		t.Error("Wait before Start succeeded")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.Start(ctx); err == nil {
		t.Error("a second Start succeeded")
	}
	cancel()
	if err := g.Wait(); err != nil {
		t.Error(err)
	}
	select {
	case <-g.Done():
	default:
		t.Error("Done not closed after Wait")
	}
}
