// Package sim runs simulated vLLM engines on real ZMQ sockets and feeds
// them an agent workload, for a kvindex to follow: it is "kvindex sim"
// without its command line.
//
// Each engine rank is a kvevents/enginesim engine publishing through
// kvevents/enginesim/simzmq, so its KV events are byte for byte what vLLM
// sends, live and on replay. The ranks bind their sockets on 127.0.0.1
// (connect mode: kvindex connects to them) or connect to a listening
// kvindex from a loopback host of their own, named by it as llm-d names
// engines by pod IP (bind mode). Each engine can also serve vLLM's HTTP
// API (kvevents/enginesim/simhttp), whose requests go through the same
// caches.
//
// The workload is the demo's (internal/demo's Generator): conversations
// sharing a system prompt, each resending its growing context every turn,
// drawn from the seed alone, so the same seed sends the same requests. A
// conversation stays on the engine rank it started on. Prompts go out as
// token ids, or, with a tokenizer, as single lines of text rendered from
// those ids and tokenized, so that a kvindex using the same tokenizer
// finds them by their text.
//
// NewPlan checks the Options and lays out the engines' endpoints without
// starting anything; its Follow says how a kvindex serve follows them. New
// also loads the tokenizer; Run starts the engines, the HTTP fronts and
// the workload as one lifecycle.Group, reports what happens through
// Options.Observe, and stops them all, in reverse, when its context ends.
//
// Errors in the Options are *configerr.Error values naming the Options
// field at fault; the command renders them as its flags.
package sim
