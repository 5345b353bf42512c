// Package testutil holds what the tests of several packages need alike:
// [Await] polls a condition until a deadline, [SyncBuffer] is a log
// destination safe for concurrent writers, [FreePorts] and [FreeAddr]
// find free loopback ports, [Seq] makes a run of consecutive token ids
// or keys (sizes are read by internal/bytesize, as kvindex reads them),
// [GetJSON] reads a JSON answer, and [TCPProxy] stands between a client
// and a server to cut or stall their connections. It imports the
// standard library only (no cgo), so that any package's tests, internal
// or external, may import it. Only tests import this package;
// internal/testutil/zmqtest holds the ZMQ ones.
package testutil
