// Package indexerv1 is the generated Go code (messages and gRPC stubs) of
// llm-d's indexer API, proto/indexer/v1/indexer.proto, which kvindex serves
// so that an llm-d scorer can use it unchanged; `make proto` regenerates it.
package indexerv1
