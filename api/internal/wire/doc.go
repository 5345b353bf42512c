// Package wire holds what the kvindex gRPC client and server share below
// their APIs: the non-zeroing buffer pool, the pooled protobuf codec each
// side's own codec falls back to, the field numbers of the messages
// encoded and decoded by hand with a table per codec of the fields it
// knows (Codecs, checked against the generated descriptors), and the
// transport window sizes.
//
// Each hand-written encoder or decoder lives with the side that runs it:
// the client encodes token-id requests and decodes LongestPrefix answers
// (api/client), the server decodes requests and encodes answers
// (api/server). What both need to agree on is here, once.
package wire
