package demo

import (
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kvindex/kvindex/picker"
)

// RouterDoc describes one router for people. The table of them is the one
// source of every router description: "kvindex demo --help" lists the
// summaries, and the HTML report and README.md's demo section show
// summary and explanation (a test keeps README.md in step).
type RouterDoc struct {
	Name string
	// Summary says what the router does, as a phrase that follows its
	// name: "round-robin cycles over the pods".
	Summary string
	// Explanation says, in whole sentences, why it lands where it does.
	Explanation string
	// Gateways says, in whole sentences, what changes when several
	// gateway replicas each route a share of the traffic (the gateways
	// scenario); empty for rows that scenario does not run.
	Gateways string
}

// routerDocs lists the standard routers in report order, then the
// scenarios' extra rows (hot-prefix, sessions). Defaults are quoted from Defaults().
var routerDocs = []RouterDoc{
	{
		Name:    RouterRoundRobin,
		Summary: "cycles over the pods, blind to caches",
		Explanation: "It ignores where a conversation's context is cached, so each turn lands on a pod that has long since evicted the previous one. " +
			"It keeps little beyond the shared system prompt, and every miss re-prefills the whole conversation, which its queues and latency show.",
		Gateways: "Each replica cycles on its own counter: together they still spread requests evenly and blindly, so it lands where one gateway does.",
	},
	{
		Name:    RouterLeastLoaded,
		Summary: "picks the pod with the fewest queued and in-service requests (the lowest index on ties), blind to caches",
		Explanation: "A conversation's next turn often arrives just as its own pod goes idle, so it lands back on its context by accident. " +
			"Everything else it places blindly, so each pod caches whatever mix arrives and evicts contexts before they are reused: even back home, about half the prompt is gone.",
		Gateways: "It keeps no state, and here every replica sees every pod's true queue (as if each read the engines' own queue metrics), " +
			"so three replicas decide exactly as one does. Replicas that counted only their own in-flight requests would each see a third of the load.",
	},
	{
		Name: RouterConsistentHash,
		Summary: fmt.Sprintf("hashes the prompt's first --hash-prefix tokens (by default the shared prefix plus 256: a conversation's start) "+
			"onto a ring of %d virtual nodes per pod; no load term", Defaults().VNodes),
		Explanation: "It pins each conversation, and the sub-agents that fork it, to one pod, so every turn goes back to its context. " +
			"But placement ignores load and capacity: pods that draw several busy conversations cannot hold all their contexts, evict them in turn and build long queues, " +
			"and a pod joining moves conversations away from their caches.",
		Gateways: "It keeps no state: every replica builds the same ring and sends a prompt start to the same pod, so three replicas decide exactly as one does, " +
			"good and bad alike.",
	},
	{
		Name: RouterApproximate,
		Summary: "guesses each pod's cache from its own routing history, as the Gateway API Inference Extension's prefix-cache scorer does " +
			"(per pod an LRU of the block hashes it routed there, sized to the engine's capacity, recorded in prompt order), " +
			"and scores pods as precise does",
		Explanation: "Knowing the engines' true capacity, it guesses well enough to land near precise in a steady fleet. " +
			"Its guesses still drift (it ages a prompt's head first where engines evict a finished request's tail first, and it never learns that an engine restarted), " +
			"so it sometimes moves a conversation away from a cache that was still there.",
		Gateways: "Each replica guesses from the third of the requests it routed itself. " +
			"A conversation's next turn usually reaches a replica that last saw it turns ago, and that replica's guess points to the pod it sent it to then: " +
			"turns bounce between the pods the three replicas remember, each pod re-prefills what the others added since, " +
			"and the stale copies overflow a fleet that holds only 1.5 copies of the working set. " +
			"Evictions caused by the other replicas' traffic are invisible to each guess, which makes the guesses worse still.",
	},
	{
		Name: RouterPrecise,
		Summary: fmt.Sprintf("asks kvindex: LongestPrefix over the index the engines' real KV events fill (engine ZMQ PUB -> subscriber -> delay line -> index), "+
			"and lets the gateway picker's scorer (package picker, default configuration) choose the pod with the highest "+
			"prefix-weight x matched fraction + load-weight x (1 - depth) (%v and %v by default), "+
			"where depth counts the pod's queued and in-service requests, plus the picker's session affinity (a conversation is a session), "+
			"hot-prefix guard and speculative entries (a pick's blocks count as held by its pod for %v, until the events arrive); "+
			"exact ties go to the pod that a seeded hash of the request ranks first", DefaultWeights.Prefix, DefaultWeights.Load, picker.DefaultConfig().SpeculativeTTL),
		Explanation: fmt.Sprintf("Conversations stay where their context is and new ones go to short queues. "+
			"Its view lags the engines by --delay-ms (%s by default), which the speculative entries cover: see oracle.",
			msText(float64(Defaults().Delay)/float64(time.Millisecond))),
		Gateways: "Every replica asks the same kvindex, which the engines' events fill whichever replica routed the request, " +
			"so a turn goes where the previous one was cached and precise lands where one gateway does. " +
			"Only the picker's session memory and speculative entries are per replica; the events reach the shared index long before a conversation's next turn.",
	},
	{
		Name:    RouterOracle,
		Summary: "is the precise policy fed the engines' true cache state at decision time, with no delay",
		Explanation: "It is a reference, not a ceiling. How close precise comes measures how faithfully kvindex mirrors the engines: " +
			"the picker's speculative entries bridge precise's short lag, so in these runs the two make the same decisions. " +
			"But the policy is greedy, not optimal: a view that differs in a few decisions changes the loads and caches every later decision sees, " +
			"which moves the result by up to about a point either way.",
		Gateways: "The engines' true state is the same for every replica, so it lands where precise does; " +
			"the replicas' separate session memories and speculative entries move it by about a point either way.",
	},
	{
		Name:    PreciseNoLoad,
		Summary: "is precise with load weight 0 and the picker's other scorers (the hot-prefix guard among them) off, run in the hot-prefix scenario: it follows the cache alone",
		Explanation: "Every request for the hot prompt goes to the pod that cached it first, and every new conversation follows the shared system prompt to whichever pod cached that first. " +
			"One or two pods do all the work while the others idle, queues explode, and the pod holding every conversation cannot keep their contexts: " +
			"the load term and the hot-prefix guard are what spread a hot prefix over the fleet.",
	},
	{
		Name: RouterSessionAffinity,
		Summary: fmt.Sprintf("pins each session (a conversation; a sub-agent is a session of its own) to the pod its session id hashes to "+
			"on a ring of %d virtual nodes per pod, as a gateway's ring-hash load balancing keyed on a session header does "+
			"(Envoy's ring_hash, Istio's consistentHash httpHeaderName, NGINX's hash ... consistent); "+
			"the first placement is the hash too, with no load term, run in the sessions scenario", Defaults().VNodes),
		Explanation: "Every turn goes back to its conversation's pod: sticky routing's best case. " +
			"But a sub-agent is a new session, hashed away from its parent: it re-prefills the whole forked context on another pod and keeps a second copy there, " +
			"where consistent-hash sends it with its parent (the same prompt start) to share one copy. " +
			"In a fleet that holds only 1.5 copies of the working set those copies cost evictions, and like consistent-hash it places sessions blind to load and capacity: " +
			"a pod that draws more busy sessions than it can hold evicts their contexts in turn and queues. " +
			"It usually lands a little below consistent-hash, with less imbalance (forks do not pile onto their parent's pod), and far below precise, " +
			"whose session term is one small weight beside the cached prefix and the load.",
	},
}

// RouterDocs returns the description of every router: the standard ones
// in report order, then the scenarios' extra rows.
func RouterDocs() []RouterDoc { return slices.Clone(routerDocs) }

// routerDoc returns the named router's description, or nil.
func routerDoc(name string) *RouterDoc {
	for i := range routerDocs {
		if routerDocs[i].Name == name {
			return &routerDocs[i]
		}
	}
	return nil
}

// Why explains where the named router lands and why ("" for an unknown
// name).
func Why(name string) string {
	if d := routerDoc(name); d != nil {
		return d.Explanation
	}
	return ""
}

// RoutersHelp lists the routers and their summaries for a terminal, as
// "kvindex demo --help" shows them.
func RoutersHelp() string {
	const indent = "  "
	nameWidth := 0
	for _, d := range routerDocs {
		nameWidth = max(nameWidth, len(d.Name))
	}
	hang := strings.Repeat(" ", len(indent)+nameWidth+2)
	var b strings.Builder
	for _, d := range routerDocs {
		first := fmt.Sprintf("%s%-*s  ", indent, nameWidth, d.Name)
		b.WriteString(wrap(d.Summary, 80, first, hang))
	}
	return b.String()
}

// Help is the long help of "kvindex demo": the routers (RoutersHelp),
// the workload, the capacity (with Defaults' factor) and the time model,
// and what it prints.
func Help() string {
	return fmt.Sprintf(`kvindex demo replays one generated agent workload against six routers, each
with its own fresh fleet of simulated vLLM engines, and reports for each the
number that tells the truth: the fleet-wide cached-prefix fraction (of the
prompt tokens every request carried, how many its engine served from cache
after routing), the prefill work left, and the time to first token it buys.
No GPU and no external server is needed; the same --seed gives the same
numbers.

Routers:
%s
Workload (agents): --sessions conversations are active at once. Each shares a
2,048-token system prompt and tool schema, then carries 10-15k tokens of its
own history, growing per turn by the previous answer (50-250 tokens) and the
next message (50-350 tokens). Activity is Zipf-skewed (a few hot
conversations, a long tail). After --turns turns a conversation ends and a new
one takes its place; 30%% of new ones are sub-agents forked from an active
conversation (its whole context plus their own instructions). Arrivals are
Poisson at --load times the rate the fleet could serve if every request hit
the cache on all but its new tokens; a conversation has at most one request in
flight. Token ids come from PRNG streams seeded by --seed, in a 151k
vocabulary; every router replays exactly the same requests.
Scenarios: agents; churn (the same, plus one engine restarting with an empty
cache at 40%% of the run and a new engine joining at 60%%); hot-prefix (70%% of
the requests are one 8,192-token prompt with a short unique suffix, the rest
agent turns; it also runs precise with load weight 0, reported as the extra
row "precise(load=0)"); gateways (agents routed by 3 gateway replicas, request
i to replica i mod 3: each keeps its own router state, so approximate guesses
from a third of the traffic, while all see the pods' load and precise's
replicas share one kvindex); sessions (agents, plus the extra row
"session-affinity" after consistent-hash).

Capacity is realistic: a 32B model on one 80 GB GPU holds ~40k tokens of KV
cache. By default the fleet holds --capacity-factor (%v) copies of the active
working set (shared prefix + every active conversation), so a conversation
duplicated on every pod does not fit. The arithmetic is printed first.

Time model (simulated): an engine is a single server taking one request at a
time from a FIFO queue (real engines batch; the model keeps what routing
changes: work saved by cache hits, work piled on one engine). Service time =
--overhead-ms + --prefill-us per uncached prompt token + --decode-ms per
output token; TTFT = queueing + overhead + prefill. The engine's cache changes
at admission (the prompt) and at completion (prompt + answer, which the next
turn resends).

Traces: --trace FILE replays a request trace instead (JSONL, one request a
line): Mooncake's format (timestamp in ms, input_length, output_length,
hash_ids of --trace-block-token blocks) or kvindex's (the same, or the prompt
as token_ids, or as text through --tokenizer, plus an optional session_id);
the format is detected and printed. Each block id stands for its own tokens,
drawn from a stream seeded by the id alone, so equal ids share tokens and
engine blocks. Timestamps (times --time-scale) drive the arrivals, a
session's next request waits for the previous answer, and output lengths
drive decode time; --trace-requests and --trace-window take a prefix. The
engines hold --capacity blocks, by default one GPU's worth. Every run also
reports the ceiling: the cached fraction of one unlimited cache (the prompt
tokens, in full blocks, whose whole prefix an earlier request sent), and
each router's share of it ("of ceiling"). A bad line is refused with its
number.

The precise router takes the real event path. A batch published at simulated
time t becomes visible to it at t + --delay-ms: a delay line between the
subscriber and the index holds what arrives, and before each decision the run
waits (real time) until the subscriber has delivered every batch due, so
wall-clock ZMQ latency is absorbed and results depend only on the flags.

--json prints {"scenario","pods","routers":[{"name","fleet_cached_fraction",
"prefill_tokens","ttft_p50_ms","ttft_p90_ms","imbalance","engine_hit_rate"}],
...}: the six standard routers in the order above; a scenario's extra row goes
to "extra_routers". A trace adds "trace" (its format, requests, load and
"ceiling_cached_fraction") and each router's "of_ceiling". --out DIR writes demo.svg (charts) and demo.html (a
self-contained report). A progress bar goes to stderr when it is a terminal
(not with --json).`, RoutersHelp(), Defaults().CapacityFactor)
}

// RoutersMarkdown lists the routers as a Markdown bullet list, each with
// its summary and explanation, wrapped at 100 columns like README.md.
func RoutersMarkdown() string {
	var b strings.Builder
	for _, d := range routerDocs {
		b.WriteString(wrap("**"+d.Name+"** "+d.text(), 100, "- ", "  "))
	}
	return b.String()
}

// GatewaysMarkdown lists, as a Markdown bullet list wrapped at 100
// columns like README.md, what changes for each router when several
// gateway replicas share the traffic.
func GatewaysMarkdown() string {
	var b strings.Builder
	for _, d := range routerDocs {
		if d.Gateways != "" {
			b.WriteString(wrap("**"+d.Name+"**: "+d.Gateways, 100, "- ", "  "))
		}
	}
	return b.String()
}

// text is the summary and explanation as they follow the router's name
// in README.md and the HTML report.
func (d *RouterDoc) text() string { return d.Summary + ". " + d.Explanation }

// wrap breaks text into lines of at most width columns (a longer word
// gets a line of its own), the first prefixed by first and the others by
// rest, each ending in a newline.
func wrap(text string, width int, first, rest string) string {
	var b strings.Builder
	line, empty := first, true
	for _, word := range strings.Fields(text) {
		if !empty && utf8.RuneCountInString(line)+1+utf8.RuneCountInString(word) > width {
			b.WriteString(line + "\n")
			line, empty = rest, true
		}
		if !empty {
			line += " "
		}
		line += word
		empty = false
	}
	b.WriteString(line + "\n")
	return b.String()
}
