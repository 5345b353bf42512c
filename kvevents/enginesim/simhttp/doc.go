// Package simhttp serves a simulated vLLM engine (enginesim) over the HTTP
// API a vLLM server has, so that a gateway, a picker or curl can send it
// inference requests and read its load, and kvindex can follow the KV
// events those requests cause. kvindex sim runs one Server per simulated
// engine (--http-port).
//
// Endpoints, each a small subset of vLLM's:
//
//   - POST /v1/completions: prompt as a string or as one array of token
//     ids.
//   - POST /v1/chat/completions: messages, rendered as ChatML (see below).
//   - POST /tokenize: vLLM's request and response, both forms, so that
//     kvindex serve --tokenize-url can point at the engine.
//   - GET /metrics: vllm:num_requests_running, vllm:num_requests_waiting,
//     vllm:kv_cache_usage_perc, vllm:prefix_cache_queries and
//     vllm:prefix_cache_hits (counters, in tokens; exposed with the
//     _total suffix, as vLLM's prometheus_client does), labelled
//     model_name and engine (the data-parallel rank) as vLLM labels them,
//     and http_requests_total by handler, method and status class.
//   - GET /health, GET /v1/models.
//
// A request is processed by the simulated engine exactly as the workload
// of kvindex sim is (enginesim.Engine.Process): the cache changes and the
// KV events are published the same way. Its usage reports the prompt's
// tokens, the tokens served from the cache (prompt_tokens_details.
// cached_tokens: the blocks hit times the block size, what the engine's
// cache held for the request) and a few fake completion tokens.
//
// # Load
//
// Each data-parallel rank runs at most Config.MaxRunning requests at once
// (vLLM's --max-num-seqs); further requests wait, first come first served,
// and are counted by vllm:num_requests_waiting. A running request takes
// its prefill time, Config.PrefillPerToken per uncached prompt token, then
// answers; decoding takes no time. Its blocks are stored (and their
// events published) when it starts running, as vLLM's scheduler caches
// full blocks when it schedules them. vllm:kv_cache_usage_perc is the
// share of the rank's blocks that the running requests hold (each its
// prompt's blocks, shared ones counted per request), as vLLM counts blocks
// referenced by running requests and not those merely cached. A request
// for an engine of several ranks goes to the rank vLLM's data-parallel
// balancer would pick (fewest waiting x 4 + running, lowest rank first)
// or to the rank its X-data-parallel-rank header names.
//
// # Simplifications
//
// Chat messages are rendered as ChatML, what Qwen2.5's template writes for
// plain messages when the first is a system message:
// "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per message, then
// "<|im_start|>assistant\n" unless add_generation_prompt is false; text
// content parts are joined by newlines. Tools, chat_template,
// continue_final_message, non-text content parts, n > 1 and batched
// prompts are refused with 400; other fields of a message (tool_calls,
// name) and sampling parameters are ignored. Without a tokenizer the
// engine takes token-id prompts only. The completion is min(max_tokens,
// 16) words of fixed text, counted as one token each; with stream true it
// comes as vLLM's server-sent events (the text in one chunk, the usage in
// a last chunk when stream_options.include_usage is set, then [DONE]).
package simhttp
