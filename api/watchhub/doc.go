// Package watchhub is the ingest side of the Watch RPC: the hub that sits
// between the event subscriber and the index, applies every batch to the
// index and fans it out to the Watch streams.
//
// In the data path it is the subscriber's kvevents.Sink:
//
//	subscriber (zmqtransport, natstransport) -> Hub.Apply -> index (indexer)
//	                                            Hub -> fan-out -> Watcher -> Watch stream (api/server)
//
// A batch reaches the index first and the watchers after, so that a
// client that sees an event over Watch finds it in the index's answers.
// Ingest never waits for a watcher: Apply queues one compact copy of the
// batch, and a goroutine of the hub builds the messages and offers them to
// each watcher's bounded queue. A watcher that falls behind is ended with
// a BehindError rather than sent a stream with holes (Hub's doc says how).
//
// The hub is not part of the query server: the wiring (cmd/kvindex)
// builds it, hands it to the subscriber as its sink and to the server
// (server.Config.Hub), which serves Watch from it and exports its
// counters as metrics. Its bounds are Limits; the server's Limits embed
// them, so that one value configures kvindex serve.
package watchhub
