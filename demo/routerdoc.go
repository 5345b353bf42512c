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
}

// routerDocs lists the standard routers in report order, then the
// hot-prefix scenario's extra row. Defaults are quoted from Defaults().
var routerDocs = []RouterDoc{
	{
		Name:    RouterRoundRobin,
		Summary: "cycles over the pods, blind to caches",
		Explanation: "It ignores where a conversation's context is cached, so each turn lands on a pod that has long since evicted the previous one. " +
			"It keeps little beyond the shared system prompt, and every miss re-prefills the whole conversation, which its queues and latency show.",
	},
	{
		Name:    RouterLeastLoaded,
		Summary: "picks the pod with the fewest queued and in-service requests (the lowest index on ties), blind to caches",
		Explanation: "A conversation's next turn often arrives just as its own pod goes idle, so it lands back on its context by accident. " +
			"Everything else it places blindly, so each pod caches whatever mix arrives and evicts contexts before they are reused: even back home, about half the prompt is gone.",
	},
	{
		Name: RouterConsistentHash,
		Summary: fmt.Sprintf("hashes the prompt's first --hash-prefix tokens (by default the shared prefix plus 256: a conversation's start) "+
			"onto a ring of %d virtual nodes per pod; no load term", Defaults().VNodes),
		Explanation: "It pins each conversation, and the sub-agents that fork it, to one pod, so every turn goes back to its context. " +
			"But placement ignores load and capacity: pods that draw several busy conversations cannot hold all their contexts, evict them in turn and build long queues, " +
			"and a pod joining moves conversations away from their caches.",
	},
	{
		Name: RouterApproximate,
		Summary: "guesses each pod's cache from its own routing history, as the Gateway API Inference Extension's prefix-cache scorer does " +
			"(per pod an LRU of the block hashes it routed there, sized to the engine's capacity, recorded in prompt order), " +
			"and scores pods as precise does",
		Explanation: "Knowing the engines' true capacity, it guesses well enough to land near precise in a steady fleet. " +
			"Its guesses still drift (it ages a prompt's head first where engines evict a finished request's tail first, and it never learns that an engine restarted), " +
			"so it sometimes moves a conversation away from a cache that was still there.",
	},
	{
		Name: RouterPrecise,
		Summary: fmt.Sprintf("asks kvindex: LongestPrefix over the index the engines' real KV events fill (engine ZMQ PUB -> subscriber -> delay line -> index), "+
			"and lets the gateway picker's scorer (package picker, default configuration) choose the pod with the highest "+
			"prefix-weight x matched fraction + load-weight x (1 - depth) (%v and %v by default), "+
			"where depth counts the pod's queued and in-service requests, plus the picker's session affinity (a conversation is a session), "+
			"hot-prefix guard and speculative entries (a pick's blocks count as held by its pod for %v, until the events arrive); "+
			"ties are broken at random, seeded", DefaultWeights.Prefix, DefaultWeights.Load, picker.DefaultConfig().SpeculativeTTL),
		Explanation: fmt.Sprintf("Conversations stay where their context is and new ones go to short queues. "+
			"Its view lags the engines by --delay-ms (%s by default), which the speculative entries cover: see oracle.",
			msText(float64(Defaults().Delay)/float64(time.Millisecond))),
	},
	{
		Name:    RouterOracle,
		Summary: "is the precise policy fed the engines' true cache state at decision time, with no delay",
		Explanation: "It is a reference, not a ceiling. How close precise comes measures how faithfully kvindex mirrors the engines: " +
			"the picker's speculative entries bridge precise's short lag, so in these runs the two make the same decisions. " +
			"But the policy is greedy, not optimal: a view that differs in a few decisions also reshuffles every later random tie-break, " +
			"which moves the result by up to about a point either way.",
	},
	{
		Name:    PreciseNoLoad,
		Summary: "is precise with load weight 0 and the picker's other scorers (the hot-prefix guard among them) off, run in the hot-prefix scenario: it follows the cache alone",
		Explanation: "Every request for the hot prompt goes to the pod that cached it first, and every new conversation follows the shared system prompt to whichever pod cached that first. " +
			"Two pods do all the work while the others idle, queues explode, and the pod holding every conversation cannot keep their contexts: " +
			"the load term and the hot-prefix guard are what spread a hot prefix over the fleet.",
	},
}

// RouterDocs returns the description of every router: the standard ones
// in report order, then the hot-prefix scenario's extra row.
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

// RoutersMarkdown lists the routers as a Markdown bullet list, each with
// its summary and explanation, wrapped at 100 columns like README.md.
func RoutersMarkdown() string {
	var b strings.Builder
	for _, d := range routerDocs {
		b.WriteString(wrap("**"+d.Name+"** "+d.text(), 100, "- ", "  "))
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
