// Package gateway is kvindex's endpoint picker for gateways: it reads an
// inference request as the gateway sees it, asks kvindex which pods hold
// its prompt, scores the candidate pods with package picker, and tells
// the gateway where to send the request. It serves two fronts on one
// Service:
//
//   - an Envoy ext_proc server speaking the Gateway API Inference
//     Extension's Endpoint Picker Protocol (ExtProc), which Envoy Gateway,
//     Envoy AI Gateway, kgateway, Istio and NGINX Gateway Fabric call;
//   - POST /v1/pick over HTTP (Handler), for gateways without ext_proc.
//
// The index is asked in the same process (Local, kvindex serve --picker)
// or over gRPC (Remote, kvindex picker --index), within a hard deadline
// (IndexBudget: Config.IndexTimeout, growing with the prompt by
// Config.IndexTimeoutPer1K): past it, or when the index fails, the request is
// routed by load and session alone, so that a slow or dead index costs
// the gateway at most the deadline. Such a fallback is never silent: its
// reason (picker.Fallback) is in the decision, the x-kvindex-fallback
// header, the PickNamespace metadata, the fallback counter's label and a
// rate-limited WARN. A model the index does not know is answered 404 on
// /v1/pick, and over ext_proc as Config.UnknownModel says.
//
// A remote index need not be up when the picker starts: Warm connects in
// the background, with backoff, and while the index is unreachable the
// picker routes without asking it and reports not ready (IndexReady, and
// the gRPC health service's "readiness").
//
// Each decision carries the index_seq of the index answer it scored
// (picker.Decision.IndexSeq; 0 after a fallback): in /v1/pick's JSON, and
// over ext_proc as the dynamic metadata PickNamespace / IndexSeqKey, so
// that the decisions of several picker replicas can be matched to the
// index state they saw. The request body's hash breaks exact ties
// (Request.BodyHash), the same way on every replica.
//
// # Requests
//
// The body is an OpenAI /v1/completions, /v1/chat/completions or
// Responses API request (ParseRequest). Token ids the caller sent are
// hashed into the index's block keys by the picker itself, when it has
// learnt the index's hashing (GetHashConfig, at each warm-up of a remote
// index, checked by digest; a chain memo hashes only a conversation's new
// blocks), and sent as ids otherwise; text and chat messages go to
// kvindex, which tokenizes them (the engine's /tokenize or a local
// tokenizer), unless the picker has a tokenizer of its own
// (Config.Tokenizer): what it tokenizes then goes the ids' way, checked
// at start against an engine's /tokenize (CheckTokenizer). Headers: x-session-id
// names the conversation (else the Responses API's previous_response_id
// does); x-request-priority: background marks a turn nobody waits on.
//
// # Load
//
// Each endpoint counts the requests the picker sent it and has not seen
// end: an ext_proc request ends with its stream (or its response body's
// end), a /v1/pick decision, whose caller never reports back, after
// Config.PickHold. Engine metrics (vLLM's /metrics) come from an optional
// MetricsSource; the package does not scrape.
package gateway
