// Package simzmq puts a simulated vLLM engine (package kvevents/enginesim)
// on real ZMQ sockets: its KV events go out through a
// zmqtransport.Publisher byte for byte as vLLM sends them, live on the PUB
// socket and from the engine's replay buffer on the replay socket.
//
// It is the one place where the simulator and the ZMQ transport meet, so
// that the transport builds without the simulator and the simulator's
// core without libzmq.
package simzmq
