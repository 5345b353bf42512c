// Package kvindexv1 is the generated Go code (messages and gRPC stubs) of
// kvindex's own API, proto/kvindex/v1/kvindex.proto; `make proto`
// regenerates it. Callers usually go through package api/client.
package kvindexv1
