// Package zmqtransport carries KV-event batches over ZMQ the way vLLM's
// ZmqEventPublisher does: Subscriber receives them from engines, Publisher
// sends them.
//
// It is the only package of the module that uses libzmq (through
// github.com/pebbe/zmq4, with cgo); decoding, sequencing and the event
// model are package kvevents', which stays cgo-free.
//
// # The wire
//
// Live batches are 3-frame messages [topic, seq u64 big-endian, msgpack
// EventBatch] on a PUB socket, seq counting from 0 per engine process. A
// replay ROUTER answers a request [b"", start_seq] from a DEALER with
// every buffered batch from start_seq on, then an end marker (seq -1,
// empty payload), as [b"", seq, payload] (vLLM before v0.26, SGLang) or
// [b"", topic, seq, payload] (vLLM v0.26 on); the subscriber reads both.
//
// # Connect and bind modes
//
// In connect mode (SubscriberConfig.Engines, AddEngine) each engine binds
// its PUB socket and the subscriber connects one SUB per engine and
// data-parallel rank. Rank r publishes on the configured port + r and
// replays on the replay port + r (inproc endpoints get "_dp<r>"; ipc ones
// carry rank 0 only), so the two bases must be at least the rank count
// apart (CheckLayout); a batch's own dp_rank, when present, overrides the
// port's rank. In bind mode (SubscriberConfig.Listen) the subscriber binds
// one SUB that every engine connects to (llm-d's deployment), on one port
// per rank (ListenRanks: rank r connects to the port + r), and names each
// engine from its topic (TopicPattern: llm-d's kv@<pod>@<model>, a
// {pod}/{model} template or a regexp) and dp_rank; replay endpoints then
// come from ReplayTemplate, whose {addr} is the address the engine's
// events come from. CheckConnectEndpoint, CheckBindEndpoint and
// CheckReplayTemplate say which endpoints are accepted.
//
// # Engine identity in bind mode
//
// A topic is whatever a peer writes. EngineAllow rules (POD=CIDR) bind
// pods to source addresses: connections from addresses no rule names are
// refused at the ZMQ handshake by a ZAP handler, and each message's source
// address (its Peer-Address) must be allowed for the pod its topic names
// before it reaches a stream; replays then dial {addr} only (listen_auth.go
// says why it is built this way). Rules that follow discovered engines
// (EngineAllowDynamic, SetEngineAllow) are checked per message only:
// libzmq never retries a peer refused at the handshake.
//
// Streams discovered from topics are bounded (slots.go): each must deliver
// a batch its Sink accepts (kvevents.VerdictSink) within seconds of its
// first message or is dropped; MaxEngines caps the engines admitted by a
// glob rule, never those an exact rule or their own address names; at the
// cap a newcomer takes the slot of the glob-admitted engine silent
// longest. Under static rules MaxEngines also caps, at the handshake, the
// connections from addresses no exact rule ties to a pod, each of which
// has its own receive queue in libzmq (listen_conns.go).
//
// # Reconnecting
//
// libzmq reconnects a SUB socket by itself, backing off from ReconnectIvl
// to ReconnectIvlMax while TCP connects fail. A peer that accepts TCP but
// closes before the ZMQ handshake (no ZMQ publisher there) would be
// retried every ReconnectIvl, since each accepted connection restarts
// libzmq's backoff; the subscriber closes the socket instead and reopens
// it after a backoff of its own, and a connection counts as connected
// only once its handshake succeeded.
//
// # Streams and loops
//
// Each (engine, rank) stream runs a kvevents.Sequencer, which it feeds the
// live batches, replay replies, connection events and the time, and which
// answers by having the stream apply a batch to the Sink, reset the
// engine, or send or abandon a replay request. Every payload is decoded
// before the sequencer sees it, once on the happy path: an undecodable
// live batch is dropped as if never received (the next one shows the
// gap), an undecodable reply counts as missing. A connection is reported
// before any of its batches: the stream reads its monitor before its SUB
// socket (connect mode), the listener its monitor before its messages and
// tells connections apart by the fd each message came on (ZMQ_SRCFD) and
// the fd each accept reported, so a stream with history verifies its
// engine before the first batch of a new connection. Its counters
// (kvevents.StreamStats, kvevents.ListenerStats) are atomics the service's
// metrics read without locks. Streams are served by a few I/O loops, each
// a goroutine that owns its sockets and waits in zmq_poll; a stream lives
// on one loop, so its Sink calls are serial.
//
// # Receive fast path
//
// Receiving through pebbe/zmq4 costs several cgo calls and an allocation
// per frame; the receiver reads a whole message in one cgo call into a
// reused buffer instead. It needs libzmq's socket handle, which pebbe
// (v1.4.0) keeps unexported as the first field of its Socket: the handle is
// read through unsafe and checked once against the socket type pebbe
// reports, and if another pebbe version lays the struct out differently,
// every receive falls back to pebbe's own API rather than crashing. A
// pebbe upgrade must keep TestReceiver passing (it fails when the fast
// path is not taken).
//
// # Publishing
//
// Publisher is the engine side: a PUB socket and an optional replay ROUTER
// answering from a ReplaySource. Package kvevents/enginesim/simzmq wires a
// simulated engine (package kvevents/enginesim) to its own Publisher, so
// tests, benchmarks and the demo drive real sockets byte for byte as vLLM
// would.
package zmqtransport
