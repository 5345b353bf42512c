// Package picker turns kvindex's answer ("which pod holds how much of this
// prompt") into a routing decision: which pod a request goes to, trading
// the cached prefix against load, session stickiness, a hot prefix's
// spread and turn priority. The gateway sidecar (Envoy ext_proc, HTTP
// /v1/pick) calls it, and "kvindex demo"'s precise, oracle and approximate
// routers are this scorer fed three different prefix views, so the demo
// measures what ships.
//
// The package is pure: no sockets, no goroutines, no clock. The caller
// gathers the inputs (the index's matched blocks per pod, the in-flight
// requests it tracks, the engines' scraped metrics) and passes the time
// in:
//
//	s, err := picker.New(picker.DefaultConfig())
//	...
//	d, err := s.Pick(time.Now(), &picker.Request{Keys: keys, Session: id}, candidates)
//	// d.Endpoint is where the request goes; d.Scores explains why.
//
// # Scoring
//
// Each eligible candidate (all of them, or those in the request's subset
// hint) gets one term per scorer, and the highest weighted sum wins
// (Config.Weights; each term is documented on Score):
//
//   - prefix: the matched fraction of the prompt, each block weighted by
//     its tier (GPU, CPU, disk) and the engine's health (only "ok" is
//     exact; the others are discounted, see HealthWeights);
//   - load: 1 minus the requests ahead over LoadScale, the requests ahead
//     taken from the picker's in-flight count and the engine's
//     vllm:num_requests_waiting and vllm:kv_cache_usage_perc while they
//     are fresh;
//   - session: the session's last pod, while it is not overloaded;
//   - hot: when every pod holding the prompt's prefix is saturated, the
//     pods that are not (see Hot prefix below);
//   - priority: background turns prefer pods with no interactive turn in
//     flight, by at most Priority/Prefix of the prompt.
//
// Exact ties go to the tied pod that a hash of Config.Seed, the request
// (Keys, Tokens, Session, Model, TieBreak) and the pod's name ranks first:
// different requests spread over the tied pods, and the same seed and
// inputs give the same pick whatever the scorer picked before and whatever
// the candidates' order.
//
// # Several pickers
//
// Replicas of the picker in front of replicas of the index (high
// availability) agree on a request when their inputs agree: the same
// Config (Seed included), the same index answer, which kvindex stamps
// with the index sequence it reflects (index_seq, carried on to
// Decision.IndexSeq, so that two decisions can be checked to come from
// the same index state), and the same load signals and state. What each
// replica keeps to itself can still part them: its in-flight counts (the
// engines' scraped waiting counts are shared), its sessions' last pods
// and its speculative entries. The last two matter for a conversation's
// next turn only until the engine's events reach the index, which then
// holds the turn's blocks for every replica; a gateway that sends each
// session to one picker replica (hashing x-session-id) keeps them too.
//
// # Hot prefix
//
// A pod holds the request's prefix when its prefix score reaches
// HotHolder. When every holder's requests ahead have reached
// HotSaturation and some candidate is below it, the candidates below it
// score 1 on the hot term, whose default weight beats any prefix
// advantage: the request spills to a cooler pod, which caches the prefix
// and becomes a holder itself, so the number of holders grows with the
// prefix's demand instead of its traffic queueing behind one pod. The load
// term alone trades prefix against queue linearly, so a long hot prefix
// with a prefix weight far above the load weight, or a load signal that
// undercounts (several picker replicas each seeing their own in-flight
// requests), keeps a saturated holder winning; the guard caps how far that
// goes. It does nothing while any holder has room, or when every pod is
// saturated.
//
// # State
//
// A Scorer remembers each session's last pod (a bounded LRU) and, for
// SpeculativeTTL after each pick, the prompt's blocks as held by the
// chosen pod: the engine's own events reach the index only after it has
// stored them, and back-to-back turns would otherwise scatter before they
// do. Both are bounded (Config.Sessions, Config.SpeculativeBlocks).
package picker
