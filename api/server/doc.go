// Package server answers queries on the kvindex index over gRPC and
// HTTP/JSON.
//
// The server answers three questions from the fleet-wide index:
// LongestPrefix (how many leading blocks of a prompt each pod holds),
// Lookup (the holders of every block) and ListPods (which engines kvindex
// follows, and how healthy their event streams are), and it streams the
// events it applies (Watch). The same answers are served over HTTP/JSON on
// a separate port, next to /metrics, /healthz and /readyz. It also speaks
// llm-d's indexer.v1.IndexerService/GetPodScores, so an llm-d scorer can
// point at kvindex unchanged; GetPodScores resolves its prompt and asks
// the index through the same path as LongestPrefix, and only shapes the
// answer differently.
//
// A prompt arrives in one of four forms: token ids (exact, preferred),
// text or chat messages (tokenized through the configured tokenizer
// backends, the engine's /tokenize or a local tokenizer.json; a chat
// prompt's tools, template arguments and whole messages travel with it to
// the engine unchanged, since its template renders them), or precomputed
// block hashes (no hashing at all). Every client mistake maps
// to a gRPC status code (InvalidArgument, FailedPrecondition, ...) or an
// HTTP 4xx with a JSON {"error": ...} body, never to Unknown or 500.
//
// An answer is for a router, which must see every pod it may send the
// request to: LongestPrefix and GetPodScores list every engine in the
// query's scope, matched or not, including engines kvindex follows that
// have sent no event yet and candidate pods it does not know
// (completeScope); a model kvindex does not know is NotFound, naming the
// ones it knows (checkModel), so that zeros always mean "not cached" and
// never "wrong model name".
//
// The package does not own ingest: the wiring (cmd/kvindex) hands it the
// index, the watch hub placed between the event subscriber and the index
// (package watchhub, so that Watch sees every applied event), and a
// StreamSource reporting the subscriber's per-stream counters. It knows the subscriber only through
// those small interfaces (streams.go), never its transport.
//
// With Config.Security set, every endpoint but health and reflection
// needs a scope: the gRPC interceptors and HTTP guards (auth.go) read
// what a caller presents and ask package security, which holds the TLS
// certificate files, the auth file and the decision, whether it may.
//
// The Go client is package client (api/client). The server imports from
// it only the JSON forms of the answers and the token-source names, which
// live there so that a program printing answers needs no server.
//
// The LongestPrefix path is the hot one; a query carries 16,384 token
// ids for a 1,024-block prompt. The server's gRPC codec (codec.go) decodes
// them into pooled buffers, queries, results and responses are pooled
// (pool.go), buffers come from a pool that does not zero them
// (wire.BufferPool, shared with the client), and the LongestPrefix
// response is encoded by hand (encode.go; the client encodes the token-id
// request and decodes the response by hand), because protobuf-go's
// generic paths for packed varints and maps were the largest costs
// outside the index in BenchmarkLongestPrefixGRPC. The hand-written codecs
// are held to protobuf-go's output by tests, and the decoders and the
// request encoder by fuzz tests; wire.Codecs declares the fields each of
// them knows, and a test fails when the .proto gains one they do not.
package server
