// Package service assembles kvindex's long-running modes from validated
// options, so that they can be embedded, tested in-process and run by
// the kvindex command, which only turns flags into Options and prints:
//
//   - Serve (New, Run): the index service. Its events come from engines
//     over ZMQ (connect or bind mode, engines listed or discovered on
//     Kubernetes) or from a NATS JetStream stream (a replica); it
//     answers over gRPC and HTTP, optionally serves the endpoint picker
//     in-process, keeps its state in a directory or in JetStream.
//   - Relay (NewRelay): follows engines over ZMQ and publishes their
//     batches to JetStream for replicas.
//   - Picker (NewPicker): the endpoint picker for gateways, asking a
//     remote kvindex.
//
// Every mode is an internal/lifecycle.Group of parts: started in order,
// stopped in reverse order, every goroutine waited for. Settings that
// cannot work are reported as *configerr.Error naming the Options field;
// the command renders the field as its flag.
package service
