// Package statefile keeps kvindex's state across restarts: one file in a
// state directory holding each engine stream's position (its last applied
// sequence and that batch's print, kvevents.Position) and the index
// snapshot they describe, so that a restarted kvindex starts from what it
// knew and asks each engine to confirm it (kvevents.HealthRestored).
//
// A file is written whole or not at all: into a temporary file in the same
// directory, fsynced, renamed over the previous one, and the directory
// fsynced, so a crash at any point leaves either the old or the new state.
// Every part is checksummed (the header by its own XXH3-64, the index
// snapshot by its framed checksums), so a torn or corrupted file is
// refused, never half restored.
//
// Encode and ReadHeader are the format's one writer and reader; the file
// writer and the NATS object store of internal/snapstore both use them.
// A header says which JetStream stream and sequence the index was fed
// through, when it was fed from one.
//
// The package does no scheduling: serve decides when to write (a
// Subscriber Checkpoint parks ingest while the snapshot is taken) and what
// to do with what it reads.
package statefile
