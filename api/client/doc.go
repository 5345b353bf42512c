// Package client is the Go client of a kvindex server's gRPC API.
//
// Dial connects and checks that the server answers; the Client's typed
// helpers (LongestPrefixTokens, LongestPrefixText, Lookup, ListPods,
// PodScores, Watch, ...) cover the common calls, and Client.Index and
// Client.Indexer are the generated clients (api/kvindexv1,
// api/indexerv1). The package also holds the JSON forms of the answers
// (LongestPrefixJSON, LookupJSON, PodsJSON), which the server's HTTP API
// and the CLI's --json output share, the text views the CLI prints
// beside them (FormatTiers, PodsJSON.CachedFractionLines, EventLine), and
// the readers of what people type or keep in files: an address
// (ParseTarget), token ids (ParseTokenIDs, ParseTokenList) and a chat
// request (ParseChatPrompt).
//
// A router that only asks kvindex questions imports this package and
// nothing of the server: it depends on the generated code, gRPC and
// protobuf (and the google.rpc error details) only (no index, tokenizer, event decoding, Prometheus or
// libzmq), and builds with CGO_ENABLED=0. TestDependencies keeps it so.
//
// Requests of token ids are encoded by hand and LongestPrefix answers
// decoded by hand (codec.go), into buffers from a pool shared with the
// server's codec (api/internal/wire): protobuf-go's generic paths for
// packed varints and maps were the largest costs outside the index in the
// server's BenchmarkLongestPrefixGRPC.
package client
