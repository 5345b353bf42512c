package zmqtransport

import (
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvindex/kvindex/kvevents"
)

// cpuTime returns the process's user plus system CPU time.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// countSink counts batches, signals progress every progressEvery batches
// (for the publisher's flow control) and closes done when the expected
// number arrived.
type countSink struct {
	n, events atomic.Int64
	want      int64
	progress  chan struct{}
	done      chan struct{}
}

const progressEvery = 1024

func (c *countSink) Apply(_ kvevents.EngineID, _ uint64, events []kvevents.Event) {
	c.events.Add(int64(len(events)))
	n := c.n.Add(1)
	if n%progressEvery == 0 {
		select {
		case c.progress <- struct{}{}:
		default:
		}
	}
	if n == c.want {
		close(c.done)
	}
}

func (c *countSink) Reset(kvevents.EngineID, kvevents.ResetReason) {}

// benchPayload is a realistic batch: 8 BlockStored events of one 16-token
// block each, in the current vLLM layout.
func benchPayload(b *testing.B) []byte {
	var batch kvevents.Batch
	batch.TS, batch.HasDPRank = 1750000000.5, true
	for i := range 8 {
		toks := make([]uint64, 16)
		for j := range toks {
			toks[j] = uint64(1000*i + j + 1)
		}
		batch.Events = append(batch.Events, kvevents.Event{
			Kind: kvevents.BlockStored, Hashes: []uint64{0x9e3779b97f4a7c15 * uint64(i+1)}, HasParent: i > 0,
			Parent: 0x9e3779b97f4a7c15 * uint64(i), TokenIDs: toks, BlockSize: 16, Medium: kvevents.MediumGPU,
		})
	}
	p, err := kvevents.AppendBatch(nil, &batch, kvevents.EncodeOptions{Shape: kvevents.ShapeMap})
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// BenchmarkReceive measures the subscriber end to end on one stream: a
// publisher in the same process sends b.N batches over tcp loopback; the
// subscriber receives, sequences and decodes them and calls a counting
// Sink. The publisher stays at most a window ahead of the Sink, so no
// batch is dropped at a high-water mark.
func BenchmarkReceive(b *testing.B) {
	payload := benchPayload(b)
	zctx, err := zmq.NewContext()
	if err != nil {
		b.Fatal(err)
	}
	defer zctx.Term()
	pub, err := zctx.NewSocket(zmq.XPUB)
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	if err := pub.SetLinger(0); err != nil {
		b.Fatal(err)
	}
	if err := pub.SetSndhwm(0); err != nil {
		b.Fatal(err)
	}
	if err := pub.Bind("tcp://127.0.0.1:*"); err != nil {
		b.Fatal(err)
	}
	ep, err := pub.GetLastEndpoint()
	if err != nil {
		b.Fatal(err)
	}

	sink := &countSink{want: int64(b.N), progress: make(chan struct{}, 1), done: make(chan struct{})}
	s, err := NewSubscriber(SubscriberConfig{Engines: []EngineConfig{{Name: "bench", Endpoint: ep}}}, sink, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Start(); err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	// The subscription reaching the XPUB means no batch is lost to the
	// slow-joiner window.
	if err := pub.SetRcvtimeo(waitTimeout); err != nil {
		b.Fatal(err)
	}
	if msg, err := pub.RecvBytes(0); err != nil || len(msg) == 0 || msg[0] != 1 {
		b.Fatalf("no subscription: %v", err)
	}

	const window = 10_000
	var seq [8]byte
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), cpuTime(b)
	for i := range b.N {
		for int64(i)-sink.n.Load() >= window {
			<-sink.progress
		}
		seq = [8]byte(seqBytes(uint64(i)))
		if _, err := pub.SendBytes(nil, zmq.SNDMORE); err != nil {
			b.Fatal(err)
		}
		if _, err := pub.SendBytes(seq[:], zmq.SNDMORE); err != nil {
			b.Fatal(err)
		}
		if _, err := pub.SendBytes(payload, 0); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-sink.done:
	case <-time.After(waitTimeout):
		b.Fatalf("%d of %d batches arrived; stats %+v", sink.n.Load(), b.N, s.Streams())
	}
	elapsed, cpu := time.Since(start), cpuTime(b)-cpu0
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "batches/s")
	// CPU time per batch of the whole process (publisher included): on a
	// shared machine a steadier figure than the rate.
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/batch")
	b.ReportMetric(float64(sink.events.Load())/elapsed.Seconds(), "events/s")
	if st := s.Streams()[0]; st.Gaps != 0 || st.DecodeErrors != 0 || st.Batches != uint64(b.N) {
		b.Fatalf("stats %+v", st)
	}
}

// BenchmarkReceiveTransport is BenchmarkReceive without the subscriber:
// the same publisher and a bare SUB socket read with the receiver, no
// sequencing, decoding or Sink. It is the floor libzmq and the machine
// set; the difference to BenchmarkReceive is the subscriber's own cost.
func BenchmarkReceiveTransport(b *testing.B) {
	payload := benchPayload(b)
	pubCtx, err := zmq.NewContext()
	if err != nil {
		b.Fatal(err)
	}
	defer pubCtx.Term()
	subCtx, err := zmq.NewContext()
	if err != nil {
		b.Fatal(err)
	}
	defer subCtx.Term()
	pub, _ := pubCtx.NewSocket(zmq.XPUB)
	defer pub.Close()
	sub, _ := subCtx.NewSocket(zmq.SUB)
	defer sub.Close()
	for _, err := range []error{
		pub.SetLinger(0), pub.SetSndhwm(0), pub.Bind("tcp://127.0.0.1:*"), pub.SetRcvtimeo(waitTimeout),
		sub.SetLinger(0), sub.SetRcvhwm(DefaultRcvHWM), sub.SetSubscribe(""),
	} {
		if err != nil {
			b.Fatal(err)
		}
	}
	ep, _ := pub.GetLastEndpoint()
	if err := sub.Connect(ep); err != nil {
		b.Fatal(err)
	}
	if msg, err := pub.RecvBytes(0); err != nil || len(msg) == 0 || msg[0] != 1 {
		b.Fatalf("no subscription: %v", err)
	}
	var got atomic.Int64
	progress, done := make(chan struct{}, 1), make(chan error, 1)
	go func() {
		r := newReceiver()
		defer r.free()
		poller := zmq.NewPoller()
		poller.Add(sub, zmq.POLLIN)
		for n := int64(0); n < int64(b.N); {
			if _, _, err := r.recv(sub); err != nil {
				if !isEAGAIN(err) {
					done <- err
					return
				}
				if _, err := poller.Poll(waitTimeout); err != nil {
					done <- err
					return
				}
				continue
			}
			n = got.Add(1)
			if n%progressEvery == 0 {
				select {
				case progress <- struct{}{}:
				default:
				}
			}
		}
		done <- nil
	}()
	const window = 10_000
	var seq [8]byte
	b.SetBytes(int64(len(payload)))
	b.ResetTimer()
	start, cpu0 := time.Now(), cpuTime(b)
	for i := range b.N {
		for int64(i)-got.Load() >= window {
			<-progress
		}
		seq = [8]byte(seqBytes(uint64(i)))
		pub.SendBytes(nil, zmq.SNDMORE)
		pub.SendBytes(seq[:], zmq.SNDMORE)
		pub.SendBytes(payload, 0)
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	elapsed, cpu := time.Since(start), cpuTime(b)-cpu0
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "batches/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/batch")
}
