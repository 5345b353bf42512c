package faultlab

import (
	"cmp"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

const (
	model     = "faultlab/model"
	blockSize = 16
)

var hasher = blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: blockSize})

// faultPub sits between an engine and its PUB socket and damages the live
// stream as a faulty network path would: it drops, duplicates or swaps
// adjacent batches at seeded random rates, and loses every batch while the
// socket is closed (an engine process kvindex cannot hear yet). The replay
// socket is served from the engine's buffer and is never damaged.
type faultPub struct {
	mu                  sync.Mutex
	pub                 *zmqtransport.Publisher // nil while closed
	rng                 *rand.Rand
	drop, dup, swap     float64
	held                *heldBatch
	dropped, duplicated int
	swapped, lost       int
}

type heldBatch struct {
	seq     uint64
	payload []byte
}

// Publish implements enginesim.Publisher. The engine calls it with its
// lock held, in sequence order.
func (f *faultPub) Publish(seq uint64, payload []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pub == nil {
		f.lost++
		return nil
	}
	if h := f.held; h != nil {
		f.held = nil
		if err := f.pub.Publish(seq, payload); err != nil {
			return err
		}
		return f.pub.Publish(h.seq, h.payload)
	}
	r := f.rng.Float64()
	switch {
	case r < f.drop:
		f.dropped++
		return nil
	case r < f.drop+f.dup:
		f.duplicated++
		if err := f.pub.Publish(seq, payload); err != nil {
			return err
		}
	case r < f.drop+f.dup+f.swap:
		f.swapped++
		f.held = &heldBatch{seq, payload}
		return nil
	}
	return f.pub.Publish(seq, payload)
}

// setFaults sets the rates of the live-path faults.
func (f *faultPub) setFaults(drop, dup, swap float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drop, f.dup, f.swap = drop, dup, swap
}

// endFaults stops injecting and sends a batch still held for a swap.
func (f *faultPub) endFaults() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drop, f.dup, f.swap = 0, 0, 0
	if h := f.held; h != nil && f.pub != nil {
		f.held = nil
		return f.pub.Publish(h.seq, h.payload)
	}
	return nil
}

// engine is one simulated engine (one process, data-parallel rank 0)
// publishing through a faultPub.
type engine struct {
	*enginesim.Engine
	name string
	fp   *faultPub
	pcfg zmqtransport.PublisherConfig // with the bound endpoints once open
}

type engineOpts struct {
	replay      bool
	capacity    int    // blocks (default 160: the check prompts do not all fit)
	bufferSteps int    // replay buffer (default enginesim's)
	connectTo   string // bind mode: kvindex's --listen endpoint
	// hasher, if set, is the engine's own (another seed: a
	// misconfigured engine, whose hashes kvindex cannot verify).
	hasher *blockhash.Hasher
	// firstSeq is the sequence number of the engine's first batch
	// (enginesim.Config.FirstSeq; vLLM's is 0).
	firstSeq uint64
}

// newEngine starts an engine whose faults are drawn from a RNG seeded by
// seed.
func newEngine(t *testing.T, name string, seed uint64, o engineOpts) *engine {
	t.Helper()
	e := &engine{name: name, fp: &faultPub{rng: rand.New(rand.NewPCG(seed, 0x5eed))}}
	e.pcfg = zmqtransport.PublisherConfig{Endpoint: "tcp://127.0.0.1:*"}
	if o.connectTo != "" {
		e.pcfg.Endpoint, e.pcfg.Connect = o.connectTo, true
		e.pcfg.Topic = "kv@" + name + "@" + model
	}
	if o.replay {
		e.pcfg.ReplayEndpoint = "tcp://127.0.0.1:*"
	}
	steps := o.bufferSteps
	if steps == 0 {
		steps = enginesim.DefaultBufferSteps
	}
	e.pcfg.ReplayHWM = steps + 16
	var err error
	e.Engine, err = enginesim.New(enginesim.Config{
		Pod: name, Model: model, Hasher: cmp.Or(o.hasher, hasher), CapacityBlocks: cmp.Or(o.capacity, 160),
		BufferSteps: o.bufferSteps, Publisher: e.fp, FirstSeq: o.firstSeq,
	})
	if err != nil {
		t.Fatal(err)
	}
	e.open(t)
	t.Cleanup(e.close)
	return e
}

// open binds (or connects) the engine's sockets: the first time on free
// ports, later on the same ones, as a restarted engine process does.
func (e *engine) open(t *testing.T) {
	t.Helper()
	pub, err := zmqtransport.NewPublisher(e.pcfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.ServeReplay(e.Engine); err != nil {
		pub.Close()
		t.Fatal(err)
	}
	if !e.pcfg.Connect {
		e.pcfg.Endpoint = pub.Endpoint()
	}
	if e.pcfg.ReplayEndpoint != "" {
		e.pcfg.ReplayEndpoint = pub.ReplayEndpoint()
	}
	e.fp.mu.Lock()
	e.fp.pub = pub
	e.fp.mu.Unlock()
}

// close closes the engine's sockets (the process is gone or restarting).
func (e *engine) close() {
	e.fp.mu.Lock()
	pub := e.fp.pub
	e.fp.pub, e.fp.held = nil, nil
	e.fp.mu.Unlock()
	if pub != nil {
		pub.Close()
	}
}

// engineFlag is the serve --engine value that connects to e.
func (e *engine) engineFlag() string {
	s := e.name + "=" + e.pcfg.Endpoint
	if e.pcfg.ReplayEndpoint != "" {
		s += ",replay=" + e.pcfg.ReplayEndpoint
	}
	return s
}
