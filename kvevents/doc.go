// Package kvevents takes in the KV-cache events inference engines publish
// and turns them into one ordered, gap-free stream per engine.
//
// The data path:
//
//	engine PUB --[topic, seq u64 BE, msgpack EventBatch]--> subscriber
//	  -> decode (every vLLM wire version, SGLang)     -> typed Events
//	  -> sequencer per (engine, dp rank): gap -> replay over DEALER;
//	     sequence going backwards -> Reset
//	  -> Sink.Apply(engine, seq, events)
//
// The package knows nothing about the index beyond the Sink interface.
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
// # Transport
//
// Subscriber owns the sockets (github.com/pebbe/zmq4 over libzmq). In
// connect mode it runs one SUB per engine and data-parallel rank (rank r
// publishes on port+r) and a DEALER for the engine's replay ROUTER; in
// bind mode one SUB that many engines connect to, naming each engine from
// its topic (llm-d's kv@<pod>@<model>, a template or a regexp). A pure
// state machine per (engine, rank), the sequencer, turns the 8-byte
// sequence numbers into actions: apply in order; on a gap, replay from the
// engine's buffer (both reply layouts, before and after vLLM v0.26); when
// replay cannot close the gap, mark the stream degraded and go on, keeping
// the index state; when the sequence goes backwards, report a restart
// (Sink.Reset) before the new process's events. Per-stream counters
// (StreamStats) feed the service's metrics.
package kvevents
