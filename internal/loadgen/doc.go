// Package loadgen drives a live fleet of OpenAI-compatible engines (vLLM,
// or kvindex sim --http-port) with a trace or a generated agent workload,
// and measures what routing buys from the engines' own answers: "kvindex
// loadgen" without its command line.
//
// # Input
//
// A trace (package trace's Mooncake or kvindex JSONL) is read as the demo
// replays it (internal/demo's LoadTrace): a session's requests are one
// conversation, block ids become the same token ids as in the demo, and
// text prompts stay text. Without a trace, the input is the demo's agent
// workload (internal/demo's Plan) sized for a simulated engine's default
// cache: conversations sharing a 1k-token system prompt, each starting
// from a context of its own and resending it, grown, every turn, at
// Poisson arrivals. Token ids go as /v1/completions prompts; text as
// completions prompts or one chat user message.
//
// # Sending
//
// A request goes out at its planned arrival (a trace's timestamps times
// the time scale) but never before the answer to its conversation's
// previous turn, with at most Options.Concurrency in flight. A route
// sends it to the endpoints in turn (round-robin, the cache-blind
// baseline), to the endpoint a kvindex picker's POST /v1/pick chooses for
// the same body, or to a gateway that routes by itself. Every request
// streams, asking for usage in the last chunk.
//
// Every run puts a marker of its own before every prompt (one block of
// random token ids, or a bracketed word before text), so that a run finds
// nothing another run left in the engines' caches: each route of a
// comparison starts cold, as the ceiling does. The marker's tokens are
// left out of the counts of token prompts.
//
// # Measures
//
// TTFT is the time to the first streamed chunk. The fleet's cached
// fraction is the sum of the engines' usage.prompt_tokens_details.
// cached_tokens over the sum of their prompt_tokens: what the engines
// really served from cache, not what a router believed. The ceiling
// beside it is the demo's: the share of the prompt tokens, in full blocks
// of vLLM's default 16 tokens, whose whole prefix an earlier request sent
// (internal/demo's Ceiling), which no router can beat on any fleet.
package loadgen
