// Package memlimit is kvindex's process memory model: what --memory-budget
// bounds, and how the parts of the process outside the index are sized
// from it.
//
// The budget covers what grows with the index and with the engines
// followed, split by Split so that the shares add up to at most the
// budget: the index (indexer.Options.MemoryBudget), which evicts entries
// to stay within its share; the engines' event queues (libzmq's, outside
// the Go heap), through their depth; and the engines' state beside their
// entries (sequencers, sockets, counters, metrics series), through the
// number of engines bind mode admits (MaxEngines). The process around
// them is bounded too: its peak resident memory stays within
// ProcessBound(budget),
//
//	budget + budget/10 + FixedOverhead
//
// which internal/faultlab's flood scenario checks against the measured
// peak, and README.md ("Reliability") states. Beyond the budget:
//
//   - budget/10: room for what grows with the index without being in
//     its count: the garbage and fragmentation of the heap that holds it.
//   - FixedOverhead: what is there whatever the budget: the binary's
//     mapped pages, the Go runtime, libzmq's threads and the servers at
//     rest.
//
// To keep the process within the bound, FromBudget derives the limits the
// process sets for its parts: the Go memory limit (the bound less what is
// not Go's) and the depth of the ZMQ receive queues (their share).
//
// A budget of 0 is no budget: the index grows without bound, Split and
// FromBudget change nothing (the runtime's memory limit, zmqtransport's
// queues) and ProcessBound is 0, meaning no bound.
package memlimit
