package zmqtransport

import (
	"errors"
	"sync"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// ioLoop is one goroutine waiting in zmq_poll on the sockets it owns. ZMQ
// sockets are not thread-safe, so every socket is created, used and closed
// on its loop's goroutine; other goroutines hand work to a loop with post
// or call, which wake it through an inproc PAIR socket.
type ioLoop struct {
	s        *Subscriber
	name     string
	poller   *zmq.Poller
	handlers map[*zmq.Socket]func()
	ctl      *zmq.Socket          // read end of the wake-up pipe; loop-owned
	timed    map[*stream]struct{} // streams with a deadline: a replay, a reconnect backoff
	members  map[closer]struct{}  // what to close at shutdown
	exit     bool
	done     chan struct{}

	mu      sync.Mutex // guards wake, queue, stopped
	wake    *zmq.Socket
	queue   []func()
	stopped bool
}

func newIOLoop(s *Subscriber, name string) (*ioLoop, error) {
	addr := s.inprocName("ctl")
	ctl, err := s.zctx.NewSocket(zmq.PAIR)
	if err != nil {
		return nil, err
	}
	wake, err := s.zctx.NewSocket(zmq.PAIR)
	if err != nil {
		ctl.Close()
		return nil, err
	}
	if err := errors.Join(ctl.SetLinger(0), wake.SetLinger(0), ctl.Bind(addr), wake.Connect(addr)); err != nil {
		ctl.Close()
		wake.Close()
		return nil, err
	}
	l := &ioLoop{
		s:        s,
		name:     name,
		poller:   zmq.NewPoller(),
		handlers: map[*zmq.Socket]func(){},
		ctl:      ctl,
		wake:     wake,
		timed:    map[*stream]struct{}{},
		members:  map[closer]struct{}{},
		done:     make(chan struct{}),
	}
	l.add(ctl, l.runQueue)
	// The go statement orders the socket setup above before the loop's
	// use of ctl, the memory barrier libzmq asks for when a socket
	// changes threads.
	go l.run()
	return l, nil
}

// closer is something living on a loop: a stream or a listener.
type closer interface{ close() }

// add registers a socket and the handler to run when it is readable.
// Loop goroutine only (or before the loop starts).
func (l *ioLoop) add(sock *zmq.Socket, h func()) {
	l.poller.Add(sock, zmq.POLLIN)
	l.handlers[sock] = h
}

// remove unregisters a socket; the caller closes it. Loop goroutine only.
func (l *ioLoop) remove(sock *zmq.Socket) {
	if sock == nil {
		return
	}
	if _, ok := l.handlers[sock]; ok {
		_ = l.poller.RemoveBySocket(sock)
		delete(l.handlers, sock)
	}
}

// post queues fn to run on the loop goroutine; false if the loop stopped.
func (l *ioLoop) post(fn func()) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return false
	}
	l.queue = append(l.queue, fn)
	if len(l.queue) == 1 {
		// A full pipe (EAGAIN) means a wake-up is already pending.
		_, _ = l.wake.SendBytes([]byte{1}, zmq.DONTWAIT)
	}
	return true
}

// errLoopStopped is returned by call on a stopped loop.
var errLoopStopped = errors.New("zmqtransport: subscriber closed")

// call runs fn on the loop goroutine and waits for its result.
func (l *ioLoop) call(fn func() error) error {
	res := make(chan error, 1)
	if !l.post(func() { res <- fn() }) {
		return errLoopStopped
	}
	select {
	case err := <-res:
		return err
	case <-l.done:
		// The loop exited before running fn (it cannot exit while fn
		// runs, so a result may still have been sent).
		select {
		case err := <-res:
			return err
		default:
			return errLoopStopped
		}
	}
}

// stop makes the loop close its sockets and exit, and waits for it.
func (l *ioLoop) stop() {
	l.post(func() { l.exit = true })
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
	<-l.done
	l.mu.Lock()
	l.wake.Close()
	l.mu.Unlock()
}

// runQueue drains the wake-up pipe and runs the queued work.
func (l *ioLoop) runQueue() {
	for {
		if _, err := l.ctl.RecvBytes(zmq.DONTWAIT); err != nil {
			break
		}
	}
	l.mu.Lock()
	q := l.queue
	l.queue = nil
	l.mu.Unlock()
	for i, fn := range q {
		fn()
		q[i] = nil
	}
}

func (l *ioLoop) run() {
	defer close(l.done)
	for !l.exit {
		polled, err := l.poller.Poll(l.timeout())
		if err != nil {
			if zmq.AsErrno(err) == zmq.Errno(syscall.EINTR) {
				continue
			}
			// Only a programming error (a closed socket left in the
			// poller) or a terminated context gets here.
			l.s.log.Error("zmqtransport: poll failed; loop stops", "loop", l.name, "err", err)
			break
		}
		for _, p := range polled {
			if h, ok := l.handlers[p.Socket]; ok {
				h()
			}
		}
		if len(l.timed) > 0 {
			now := l.s.mono()
			for st := range l.timed {
				st.tick(now)
			}
		}
	}
	l.shutdown()
}

// timeout is how long Poll may wait: until the earliest deadline.
func (l *ioLoop) timeout() time.Duration {
	if len(l.timed) == 0 {
		return -1
	}
	first := int64(-1)
	for st := range l.timed {
		if d, ok := st.deadline(); ok && (first < 0 || d < first) {
			first = d
		}
	}
	if first < 0 {
		return -1
	}
	wait := time.Duration(first - l.s.mono())
	// Poll works in milliseconds; a shorter wait would spin.
	return max(wait, time.Millisecond)
}

// shutdown closes every socket the loop owns, in the loop goroutine.
func (l *ioLoop) shutdown() {
	l.mu.Lock()
	l.stopped = true
	// Work queued after the exit request is abandoned; its callers are
	// released by l.done.
	l.queue = nil
	l.mu.Unlock()
	for m := range l.members {
		m.close()
	}
	clear(l.members)
	l.ctl.Close()
}
