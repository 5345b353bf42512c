// Package snapstore keeps kvindex's index snapshots in NATS JetStream, so
// that a fresh replica starts from a recent snapshot and replays only the
// event stream's tail, instead of the whole stream.
//
// A snapshot is a state file (internal/statefile: a checksummed header
// naming the stream and the stream sequence of the last message applied,
// then the index snapshot) stored as one object in an Object Store bucket.
// A KV bucket holds, per model, the pointer to the newest snapshot; it
// only ever moves forward (a revision-checked update, and only to a later
// stream sequence), so a slow writer can never replace a newer snapshot
// with an older one. The newest Keep snapshots are kept: when the newest
// is missing or its header is refused, a reader falls back to the one
// before it.
//
// One replica writes at a time: the holder of a lease, a KV key in a
// bucket whose TTL is the lease's, so a lease its holder stopped renewing
// (a crash, a partition) expires by itself and another replica takes
// over. Only server 2.9 features are used (bucket TTL, no per-key TTL).
//
// Snapshotter is the loop serve runs: it keeps trying to hold the lease
// and, while it does, writes a snapshot every interval through a callback
// that parks ingest. The snapshot streams into the object store as it is
// encoded; with a spool directory it is written to a local file while
// ingest is parked and uploaded after, which shortens the pause to a local
// write.
package snapstore
