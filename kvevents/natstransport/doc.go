// Package natstransport carries engines' KV-cache event batches through a
// NATS JetStream stream, so that any number of index replicas, started at
// any time, rebuild the same index: a relay beside the engines publishes,
// every replica consumes. It needs no cgo and no ZMQ.
//
// The data path:
//
//	engine PUB -> zmqtransport.Subscriber (order, gaps, replay, restarts)
//	  -> Relay (a kvevents.PayloadSink): bounded queue, one publisher
//	     goroutine, each record acknowledged by JetStream before the next
//	  -> stream KVEVENTS, subject kvevents.<model>.<pod>.<rank>
//	     (tokens escaped by EscapeToken), payload unchanged, headers:
//	     Nats-Msg-Id (MsgID: model, pod, rank, seq, print), Kvindex-Kind
//	     (batch | reset | hole), seq, print, the relay's health, pod IP
//	  -> Consumer per replica: an ordered consumer on kvevents.<model>.>
//	     from StartSeq -> continuity per engine rank -> Decoder
//	     -> kvevents.Sink (the index)
//
// Relays also send heartbeats on core NATS (kvindex.relay.<model>.<id>,
// not stored) listing their streams, so a consumer reports a rank
// disconnected when its relay goes silent.
//
// # Exactly once, in order
//
// The relay has one publish in flight and waits for its ack, so a record
// retried after a lost ack can never land behind its successor; the retry
// of a record that was in fact stored is dropped by JetStream, which
// remembers Nats-Msg-Id for the stream's Duplicates window. A batch's id
// depends only on the batch (not on the relay), so a restarted relay
// replaying an engine's buffer stores nothing twice either. The ordered
// consumer recreates itself after a reconnect or a server restart from
// the last stream sequence it delivered; the consumer drops anything at or
// before AppliedSeq besides.
//
// # Holes, resets and health
//
// While NATS is away the relay buffers up to RelayConfig.MaxBuffer bytes;
// beyond that it drops batches and remembers, per rank, the range it
// dropped, which it publishes as a hole record before the rank's next
// batch (or as soon as its queue drains). A consumer applies each rank's
// batches in sequence: the next seq is applied; a seq already applied
// with the print it remembers is a duplicate and dropped; a seq going back
// to another batch, or a reset record, is an engine restart (Sink.Reset,
// then the batch); a forward gap or a hole record degrades the rank, and
// AllBlocksCleared makes it healthy again. The health a consumer reports
// is the worse of its own verdict and the relay's, which rides in each
// record's headers.
//
// # Snapshots
//
// Checkpoint parks ingest and hands over AppliedSeq and every rank's
// position; a replica restored from that snapshot starts a Consumer at
// AppliedSeq+1 with those positions as Resume, and goes on as if it had
// never stopped.
package natstransport
