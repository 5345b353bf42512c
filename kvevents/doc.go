// Package kvevents turns the KV-cache event batches inference engines
// publish into one ordered, gap-free stream of typed events per engine,
// without touching any transport: the event model, its msgpack codec and
// the sequencer.
//
// The data path, with the transport in package kvevents/zmqtransport:
//
//	engine PUB --[topic, seq u64 BE, msgpack EventBatch]--> transport
//	  -> Decoder (every vLLM wire version, SGLang)    -> typed Events
//	  -> Sequencer per (engine, dp rank): gap or reconnect -> replay
//	     request, verified by the print of the last applied batch;
//	     another engine process -> Reset
//	  -> Sink.Apply(engine, seq, events)
//
// The package has no sockets, goroutines, clocks or cgo (it builds with
// CGO_ENABLED=0), and knows nothing about the index beyond the Sink
// interface. StreamStats and ListenerStats, the counter snapshots a
// transport reports, live here so that their readers (the API server's
// metrics) need no transport.
//
// # Wire decoding
//
// Decoder reads every EventBatch layout vLLM has shipped: the batch as
// [ts, events] (v0.9.0), [ts, events, dp_rank], or defensively a map;
// events as tagged arrays of any historical length (fields were only ever
// appended, so missing trailing fields take their defaults and unknown
// ones are skipped) or, from v0.24, as tagged maps whose defaulted fields
// may be absent. Block hashes may be ints of any msgpack width (negative
// ones keep their 64-bit pattern) or digests (bin or str), whose key is
// the digest's last 8 bytes (first 8 for SGLang) and which are kept in
// full. An event with an unknown tag is skipped and counted; the rest of
// its batch is kept. Everything else that is wrong (types, lengths,
// truncation, sizes beyond Limits) rejects the payload with a
// *DecodeError of class ErrMalformed or ErrTooLarge; nothing a payload
// declares is trusted beyond the bytes that remain, so allocation is
// bounded by the payload. Decode reuses the Batch it is given and does not
// allocate in steady state. AppendBatch writes the same layouts back
// byte for byte as vLLM's msgspec does (ShapeV090, ShapeArray, ShapeMap),
// for tests, the simulated engine (package enginesim) and relays.
//
// # Sequencing
//
// A Sequencer is a pure state machine per (engine, rank), in the manner of
// etcd's raft: its caller feeds it what arrived (a live batch, a replayed
// batch, the replay end marker, a connection, the time as a value) and it
// answers synchronously through a SequencerOutput: deliver this batch in
// order, reset the engine, request or cancel a replay. It remembers the
// print (BatchPrint) of the batches it delivered, so a batch that comes
// twice is recognised as a duplicate and a different batch under a known
// seq as a new engine process. On a gap, a reconnect or a resume it asks
// for a replay from the last batch it applied: the reply under that seq
// proves (or disproves) that the engine is still the same process before
// anything else is applied. When replay cannot close a gap it marks the
// stream degraded and goes on, keeping the index state; when the engine
// turns out to be a new process it reports a restart (Reset) before the
// new process's batches. Health says what each stream's state can be
// trusted for. Every deviation from "deliver in order" is also reported as
// a Note, which the transport turns into counters and logs.
package kvevents
