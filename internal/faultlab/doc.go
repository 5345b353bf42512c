// Package faultlab is kvindex's fault-injection suite. It has no library
// code: its tests run the kvindex binary as a subprocess (so that it can be
// killed with SIGKILL and its peak memory read from /proc), feed it from
// simulated engines over real ZMQ sockets, inject one fault at a time and
// check, at quiescent points, the promise every answer carries:
//
//	no answer is wrong for an engine reported ok.
//
// The engines' true caches are known (enginesim's Lookup), so each answer
// is compared with the truth: per prompt and engine, the prefix depth
// kvindex reports against the depth the engine holds. A wrong answer for
// an engine flagged as anything but ok (degraded, disconnected, restored,
// unconfirmed) is allowed and counted; a wrong answer for an ok engine
// fails the scenario.
//
// Faults on the live path are injected between each engine and its PUB
// socket (faultPub: drop, duplicate, swap adjacent batches, lose every
// batch while kvindex cannot hear the engine), which is what kvindex
// would see behind a faulty proxy; replay requests go straight to the
// engine's replay buffer. The scenarios are: random batch loss with and
// without a replay endpoint, duplicated and reordered delivery, slow and
// fast engine restarts, kvindex killed with SIGKILL and restarted (with
// and without --state-dir), 1,000 engines joining and leaving in bind
// mode, a flood under --memory-budget, watchers and HTTP clients that
// never read or send slowly, and floods of huge or endless request bodies
// and of trickling connections against serve's HTTP API and kvindex
// picker (its HTTP and ext_proc fronts), where legitimate queries and
// picks must keep answering within the process bound; and forgeries:
// sources speaking for engines their allow rules do not give them in bind
// mode, and, in NATS mode (nats-server, a relay and two replicas), records
// and snapshots written without the shared key.
//
// The suite runs in go test (and so in make test). make faults runs it
// with -faults.table, which prints one table: per fault, the answers
// checked, how many were wrong for an ok engine (must be 0), how many
// were wrong for a flagged one, the time from the fault's end until every
// engine was ok with every answer right, and the peak RSS against the
// memory budget.
package faultlab
