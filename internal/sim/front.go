package sim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/internal/lifecycle"
	"github.com/kvindex/kvindex/kvevents/enginesim/simhttp"
)

// httpFront serves one engine's ranks over vLLM's HTTP API. The sim runs
// the HTTP server itself, rather than simhttp.Server.Start, so that its
// lifecycle waits for the server's goroutine and its handlers.
type httpFront struct {
	s    *Sim
	i    int // the engine
	srv  *http.Server
	l    net.Listener
	stop context.CancelFunc // ends the requests in flight
}

// front is the part that serves engine i's HTTP front.
func (s *Sim) front(i int) lifecycle.Part {
	f := &httpFront{s: s, i: i}
	return lifecycle.Part{Name: s.plan.pods[i] + " HTTP", Start: f.start, Run: f.run, Stop: f.shutdown}
}

func (f *httpFront) start(context.Context) error {
	p, o := f.s.plan, &f.s.plan.opts
	pod := p.pods[f.i]
	ranks := f.s.engines[f.i*o.Ranks : (f.i+1)*o.Ranks]
	cfg := simhttp.Config{
		Model: o.Model, MaxRunning: o.MaxRunning, PrefillPerToken: o.PrefillPerToken,
		Observe: func(q simhttp.Request) {
			ev := HTTPRequest{Time: time.Now(), Pod: pod, Request: q}
			if q.Rank >= 0 {
				ev.Engine = ranks[q.Rank]
			}
			f.s.observe(ev)
		},
	}
	if f.s.tok != nil { // a nil *Local in the interface would not be nil
		cfg.Tokenizer = f.s.tok
	}
	for _, e := range ranks {
		cfg.Ranks = append(cfg.Ranks, e.Engine.Engine)
	}
	h, err := simhttp.New(cfg)
	if err != nil {
		return fmt.Errorf("%s: HTTP: %w", pod, err)
	}
	if f.l, err = net.Listen("tcp", p.https[f.i]); err != nil {
		return configerr.Failed(fieldHTTPPort, "%s: HTTP: %w (another program holds the port? choose another %v)", pod, err, fieldHTTPPort)
	}
	requests, stop := context.WithCancel(context.Background())
	f.stop = stop
	// The timeouts are simhttp.Server.Start's: slow or idle clients
	// cannot hold connections forever, a large prompt still has time.
	f.srv = &http.Server{
		Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, IdleTimeout: 2 * time.Minute,
		BaseContext: func(net.Listener) context.Context { return requests },
	}
	f.s.fronts = append(f.s.fronts, Front{Pod: pod, Addr: f.l.Addr().String()})
	return nil
}

func (f *httpFront) run(context.Context) error {
	if err := f.srv.Serve(f.l); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// shutdown ends the requests in flight (the queued ones give up, the
// running ones skip the rest of their prefill) and waits for their
// handlers to return.
func (f *httpFront) shutdown(ctx context.Context) error {
	f.stop()
	if err := f.srv.Shutdown(ctx); err != nil {
		f.srv.Close()
		return err
	}
	return nil
}
