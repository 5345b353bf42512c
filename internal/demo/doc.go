// Package demo shows, without a GPU fleet, what precise prefix-aware
// routing buys: it replays one generated agent workload against six
// routers, each driving its own fresh fleet of simulated vLLM engines
// (kvevents/enginesim), and scores them by the fleet-wide cached-prefix
// fraction (of the prompt tokens every request carried, how many its engine
// served from cache after routing) and by the time to first token that
// buys. It backs the "kvindex demo" command.
//
// # Simulation
//
// A discrete-event simulation in simulated time: a heap of arrivals,
// completions and fleet changes, ties resolved in insertion order. Each
// engine is a single server with a FIFO queue, serving one request at a
// time. Real engines batch; the single server keeps the two effects
// routing changes, work saved by cache hits and work piled on one engine,
// while staying exact and cheap. A request's service time is
//
//	Overhead + PrefillPerToken x (prompt tokens not cached) + DecodePerToken x (output tokens)
//
// (defaults 10 ms, 100 µs: ~10k tokens/s, a 32B model on one H100, and
// 2 ms amortized over a batch), and its time to first token is its
// queueing time plus the first two terms. The engine's cache changes at
// admission, Process(prompt), whose hit is the request's cached prefix,
// and at completion, Process(prompt + answer), so the answer, which the
// next turn resends, is cached too.
//
// # Workload
//
// Agents (the default scenario): Sessions conversations are active at any
// time. Each starts with a 2,048-token system prompt and tool schema,
// identical for all, then 10-15k tokens of its own history; each turn
// resends the context plus the previous answer (50-250 tokens) and the
// next user or tool message (50-350 tokens). Activity is Zipf-skewed over
// the active slots (weight 1/(i+1)). After Turns turns a conversation
// ends and a new one takes its slot; 30% of new ones are sub-agents that
// fork an active conversation: its whole context plus their own instructions.
// Arrivals are Poisson; a conversation has at most one request in flight
// (the plan redraws a busy one; the run holds a turn back until the
// previous answer is in). Token ids come from seeded PCG streams in a
// 151k vocabulary, one stream per conversation, so every router replays
// exactly the same requests. The arrival rate is Load times what the fleet
// could serve if every request hit the cache on all but its new tokens.
//
// Churn: the same, plus one engine restarting with an empty cache at 40%
// of the run (enginesim Restart: its sequence starts over, which the
// subscriber reports as a reset when the new process first publishes) and
// a new engine joining at 60% (every router learns of it; the hash ring
// remaps its share of keys).
//
// Hot-prefix: 70% of the requests are one 8,192-token prompt (a long
// document) plus a short unique suffix, answered in 100-350 tokens so
// that they cost about what a conversation turn does; the rest are agent
// turns. It also runs precise with load weight 0, reported as the extra
// row "precise(load=0)": following the cache alone sends the whole hot
// prompt to one pod.
//
// Gateways: the agent workload routed by GatewayReplicas (3) gateway
// replicas; request i goes to replica i mod 3. Each replica keeps its own
// router state: round-robin's counter, the picker's session memory and
// speculative entries, and approximate's guess of
// the caches, learnt from its third of the traffic. They share the pods'
// load (every decision sees each pod's true depth, as if each replica read
// the engines' queue metrics) and, for precise, one kvindex: so only the
// view of the caches differs.
//
// Sessions: the agent workload plus the extra row "session-affinity",
// listed after consistent-hash: every request of a conversation (its
// session; a fork is a session of its own) goes to the pod its id hashes
// to on a ring, as gateways' ring-hash balancing on a session header does.
//
// # Traces
//
// Config.Trace replaces the generated workload with a trace (package
// trace: Mooncake's JSONL or kvindex's). Each block id stands for
// TraceBlock tokens drawn from a PCG stream seeded by the id alone, so
// equal ids are equal tokens and equal engine block hashes, and a prompt is
// its blocks' tokens cut at its length; the tokens are made when an engine
// needs them, as a whole trace's would not fit in memory, and each block's
// engine keys are hashed once (keyMemo). Timestamps times TimeScale are the
// arrivals, a session's requests are a conversation's turns (the next waits
// for the previous answer), output lengths set the decode time. Each
// engine holds Capacity blocks, by default one GPU's worth (tokensPerGPU).
// The run also replays the trace through one cache that never evicts: its
// cached fraction is the ceiling (TraceInfo.Ceiling), and every router's
// result is also given as a share of it. Every router runs, with
// precise(load=0) and, if the trace has sessions, session-affinity as
// extra rows.
//
// # Capacity
//
// A KV cache holds far fewer tokens than people expect: a 32B model in
// bf16 on one 80 GB GPU keeps about 40k tokens (2,500 blocks of 16). By
// default each engine gets CapacityFactor (1.5) times the working set
// (shared prefix plus every active conversation's mean context) divided
// by the number of pods, so the fleet holds one and a half copies of what
// is active: a conversation duplicated on every pod does not fit. Run
// prints the arithmetic first.
//
// # Routers
//
// RouterDocs describes each router, what it does and why it lands where it
// does; "kvindex demo --help", the HTML report and README.md all show that
// text. approximate, precise and oracle are one policy, the gateway
// picker's scorer (package picker, its default configuration with the
// demo's --prefix-weight and --load-weight), and differ only in where the
// matched blocks come from: the router's own history, kvindex's index, or
// the engines' true state. A pod's depth (queued plus in-service requests)
// is the in-flight count the picker tracks, a conversation is its session,
// every request is interactive, and the simulated engines publish no load
// metrics. The oracle is a reference, not a ceiling: the policy is greedy,
// so a view that differs can land on either side of it.
//
// # Settings
//
// Config holds what a person chooses (each field is a flag of "kvindex
// demo"): Defaults gives the defaults, RegisterFlags the flags and their
// help, Validate the limits, from one table. Options adds what only a
// program sets.
//
// # The precise router's event path
//
// precise takes the real path: enginesim PUB socket (ZMQ, msgpack) ->
// zmqtransport.Subscriber (sequencing, replay) -> a delay line ->
// indexer.Index -> LongestPrefix. A batch published at simulated time t
// becomes visible to the router at t + Delay (default 20 ms): the delay
// line holds what the subscriber delivers and, before a decision at
// simulated time T, waits in real time (bounded by Timeout, with an error
// naming the engine and the missing batches) until every batch published
// at or before T - Delay has arrived, then releases exactly those into the
// index. Wall-clock ZMQ latency is absorbed by the waiting, so results
// depend only on the options: the same seed gives the same report.
//
// # Scores
//
// Per router: fleet cached fraction (cached prompt tokens over prompt
// tokens), prefill tokens computed, TTFT p50 and p90 (simulated ms,
// nearest rank), imbalance (the most requests any engine served over the
// mean) and engine hit rate (each engine's cached over prompt tokens,
// averaged over the engines that served requests). WriteTable, WriteJSON,
// WriteSVG and WriteHTML render a Report.
package demo
