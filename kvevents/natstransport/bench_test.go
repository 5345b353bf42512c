package natstransport_test

import (
	"context"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/natstransport"
)

// timedSink applies to an index and records, per batch, how long after
// its ApplyPayload at the relay it was applied.
type timedSink struct {
	ix      *indexer.Index
	pos     map[kvevents.EngineID][]int // engine -> seq -> index into sent
	sent    []atomic.Int64              // ApplyPayload time, unix nanos
	lat     []int64                     // apply latency per batch (consumer goroutine only)
	applied atomic.Int64
}

func (s *timedSink) Apply(id kvevents.EngineID, seq uint64, events []kvevents.Event) {
	s.ix.Apply(id, seq, events)
	if i := s.pos[id][seq]; i >= 0 {
		s.lat[i] = time.Now().UnixNano() - s.sent[i].Load()
	}
	s.applied.Add(1)
}

func (s *timedSink) Reset(id kvevents.EngineID, r kvevents.ResetReason) { s.ix.Reset(id, r) }

// BenchmarkRelayToReplica: simulated engines' batches through a Relay, an
// embedded JetStream (file storage) and a Consumer into an index. One
// operation is one batch. "max" feeds as fast as the relay takes them
// (throughput; the latency is then mostly queueing), "paced" at 1000
// batches/s (the staleness NATS adds at a moderate load).
func BenchmarkRelayToReplica(b *testing.B) {
	for _, bc := range []struct {
		name string
		rate int // batches/s, 0: unpaced
	}{{"max", 0}, {"paced-1k", 1000}} {
		b.Run(bc.name, func(b *testing.B) { benchRelay(b, bc.rate) })
	}
}

func benchRelay(b *testing.B, rate int) {
	ns := startNATS(b)
	_, js := connect(b, ns.url())
	ensureStream(b, js)
	_, rjs := connect(b, ns.url())
	f := newFleet(b, 8, 1)
	for len(f.batches) < b.N {
		f.run(b, b.N-len(f.batches))
	}
	bs := f.batches[:b.N]
	sink := &timedSink{ix: newIndex(b), pos: map[kvevents.EngineID][]int{}, sent: make([]atomic.Int64, len(bs)), lat: make([]int64, len(bs))}
	var events int
	var dec kvevents.Decoder
	var batch kvevents.Batch
	for i, x := range bs {
		p := sink.pos[x.engine]
		for uint64(len(p)) <= x.seq {
			p = append(p, -1)
		}
		p[x.seq] = i
		sink.pos[x.engine] = p
		if err := dec.Decode(x.payload, &batch); err != nil {
			b.Fatal(err)
		}
		events += len(batch.Events)
	}
	relay := startRelay(b, rjs, natstransport.RelayConfig{MaxBuffer: 1 << 30})
	c, err := natstransport.NewConsumer(js, natstransport.ConsumerConfig{Model: testModel}, sink, quiet())
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer c.Close()

	b.ResetTimer()
	start := time.Now()
	var tick *time.Ticker
	if rate > 0 {
		tick = time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
	}
	for i, x := range bs {
		if tick != nil {
			<-tick.C
		}
		sink.sent[i].Store(time.Now().UnixNano())
		relay.ApplyPayload(x.engine, x.seq, x.payload, nil)
	}
	testutil.Await(b, awaitBound, "all batches applied", func() bool { return sink.applied.Load() == int64(len(bs)) })
	elapsed := time.Since(start)
	b.StopTimer()

	if st := relay.Stats(); st.DroppedBatches != 0 {
		b.Fatalf("relay dropped batches: %+v", st)
	}
	lat := slices.Clone(sink.lat)
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))]) / 1e6 }
	b.ReportMetric(float64(len(bs))/elapsed.Seconds(), "batches/s")
	b.ReportMetric(float64(events)/elapsed.Seconds(), "events/s")
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
}

// BenchmarkConsumerCatchUp: how fast one replica's Consumer applies what
// the stream holds, into an index: a replica's catch-up after a snapshot,
// and the fleet-wide batch rate one replica can follow (every replica
// reads every relay's records). The stream (file storage) is filled once
// with the batches of 64 simulated engines, as relays publish them; one
// operation is a fresh Consumer from StartSeq 0 until CaughtUp. MB/s
// counts the stored messages (payload, subject and headers); cpu-us/batch
// is the whole process's CPU time, the server's share included, which
// varies less than the rates with what else runs on shared cores.
func BenchmarkConsumerCatchUp(b *testing.B) {
	const engines, batches = 64, 40_000
	ns := startNATS(b)
	_, js := connect(b, ns.url())
	s := ensureStream(b, js)
	f := newFleet(b, engines, 1)
	for len(f.batches) < batches {
		f.run(b, batches-len(f.batches))
	}
	bs := f.batches[:batches]
	events := fillStream(b, js, bs)
	info, err := s.Info(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	if info.State.Msgs != uint64(len(bs)) {
		b.Fatalf("stream holds %d messages, want %d", info.State.Msgs, len(bs))
	}

	var elapsed, cpu time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		ix := newIndex(b)
		c, err := natstransport.NewConsumer(js, natstransport.ConsumerConfig{Model: testModel, RelayTimeout: time.Hour}, ix, quiet())
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start, cpu0 := time.Now(), cpuTime(b)
		if err := c.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		awaitChan(b, "caught up", c.CaughtUp())
		elapsed, cpu = elapsed+time.Since(start), cpu+cpuTime(b)-cpu0
		b.StopTimer()
		if err := c.Close(); err != nil {
			b.Fatal(err)
		}
		if got := c.AppliedSeq(); got != info.State.LastSeq {
			b.Fatalf("caught up at %d, stream ends at %d", got, info.State.LastSeq)
		}
		var applied uint64
		for _, st := range c.Streams() {
			applied += st.Batches
		}
		if applied != uint64(len(bs)) {
			b.Fatalf("applied %d batches, want %d", applied, len(bs))
		}
		b.StartTimer()
	}
	sec := elapsed.Seconds() / float64(b.N)
	b.ReportMetric(float64(len(bs))/sec, "batches/s")
	b.ReportMetric(float64(events)/sec, "events/s")
	b.ReportMetric(float64(info.State.Bytes)/1e6/sec, "MB/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N*len(bs)), "cpu-us/batch")
}

// cpuTime returns the process's user plus system CPU time.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// fillStream stores bs as a relay would (same subjects, headers and
// message ids), with many publishes in flight rather than the relay's
// one, so the fill is quick; it returns the number of events in bs.
func fillStream(b *testing.B, js jetstream.JetStream, bs []batch) (events int) {
	b.Helper()
	var dec kvevents.Decoder
	var eb kvevents.Batch
	for _, x := range bs {
		if err := dec.Decode(x.payload, &eb); err != nil {
			b.Fatal(err)
		}
		events += len(eb.Events)
		print := kvevents.BatchPrint(x.payload)
		rec := natstransport.Record{Kind: natstransport.KindBatch, Seq: x.seq, Print: print, Health: kvevents.HealthOK, Relay: "bench"}
		msg := &nats.Msg{Subject: natstransport.BatchSubject(x.engine), Header: rec.Header(), Data: x.payload}
		msg.Header.Set(jetstream.MsgIDHeader, natstransport.MsgID(x.engine, x.seq, print))
		// Stall rather than fail while the server is behind (the default
		// waits 200 ms, short on two busy cores).
		if _, err := js.PublishMsgAsync(msg, jetstream.WithStallWait(time.Minute)); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("timed out filling the stream")
	}
	return events
}
