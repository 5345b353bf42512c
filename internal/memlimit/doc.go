// Package memlimit is kvindex's process memory model: what --memory-budget
// bounds, and how the parts of the process outside the index are sized
// from it.
//
// The budget caps the index (indexer.Options.MemoryBudget), which evicts
// its least-recently-stored entries to stay within it. The process around
// the index is bounded too: its peak resident memory stays within
// ProcessBound(budget),
//
//	budget + budget/10 + FixedOverhead
//
// which internal/faultlab's flood scenario checks against the measured
// peak, and README.md ("Reliability") states. The shares:
//
//   - budget: the index, by its own count of its bytes.
//   - budget/10: room for what grows with the index without being in
//     that count: the garbage and fragmentation of the heap that holds it,
//     and the event queues, which are sized from the budget.
//   - FixedOverhead: what is there whatever the budget: the binary's
//     mapped pages, the Go runtime, libzmq's threads and the servers at
//     rest.
//
// To keep the process within the bound, FromBudget derives the limits the
// process sets for its parts: the Go memory limit and the depth of the ZMQ
// receive queues, which libzmq allocates outside the Go heap. These are
// ceilings for each part alone, not shares that add up to the bound: the
// bound is the promise, checked by measuring.
//
// A budget of 0 is no budget: the index grows without bound, FromBudget
// changes nothing (the runtime's memory limit, zmqtransport's queues) and
// ProcessBound is 0, meaning no bound.
package memlimit
