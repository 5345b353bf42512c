package memlimit

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime/debug"

	"github.com/kvindex/kvindex/internal/bytesize"
)

// The process bound beyond the budget; ProcessBound adds them up.
const (
	// FixedOverhead is the part of kvindex's resident memory that the
	// budget does not cover: the binary's mapped pages and shared
	// libraries (NonGoReserve), and the Go runtime, the servers' buffers,
	// decoders and queries at work, whatever the budget (the Go memory
	// limit's share beyond the budget, FromBudget). Measured: 43 MiB at
	// rest, of which 34 MiB file-backed pages; up to 59 MiB at work under
	// the fault suite's 1 and 2 MiB budgets before the Go limit was kept
	// within the bound, about 54 MiB since.
	FixedOverhead = 64 << 20
	// slackDiv: what grows with the index beyond its count gets
	// budget/slackDiv.
	slackDiv = 10
)

// ProcessBound is the most resident memory a kvindex with memory budget
// budget (bytes) may use: budget + budget/10 + FixedOverhead, saturating
// at math.MaxInt64. A budget of 0 (or less) is no budget, and its bound 0
// means none.
func ProcessBound(budget int64) int64 {
	if budget <= 0 {
		return 0
	}
	slack := budget / slackDiv
	if slack > math.MaxInt64-FixedOverhead-budget {
		return math.MaxInt64
	}
	return budget + slack + FixedOverhead
}

// Shares of --memory-budget; Split and FromBudget explain them.
const (
	// NonGoReserve is the part of the process bound that is not Go's: the
	// binary's mapped pages and shared libraries (34 MiB measured at
	// rest) and libzmq's threads and malloc's arenas; the event queues,
	// also outside the Go heap, have their own share of the budget
	// (Shares.Queues). The Go memory limit is the bound less both.
	NonGoReserve = 40 << 20
	// QueueShareDiv: the event queues get at most budget/QueueShareDiv.
	QueueShareDiv = 4
	// EngineShareDiv: the engines' state gets budget/EngineShareDiv in
	// bind mode, where it decides MaxEngines.
	EngineShareDiv = 8
	// minIndexDiv: the index keeps at least budget/minIndexDiv; the
	// streams' floors (EngineBytes and a minRcvHWM queue each) must fit
	// in the rest (Split).
	minIndexDiv = 2
	// queueMsgBytes is what one queued batch is taken to cost (vLLM's
	// batches are 1 to 3 KiB; TestFloodRSS's peak grows by about that
	// per batch of queue depth).
	queueMsgBytes = 2 << 10
	// minRcvHWM is the shallowest SUB queue, taken when the queue share
	// cannot hold more. Shallow queues lose batches under a flood, which
	// replay then fetches (an engine without replay degrades): TestFloodRSS
	// saw four publishers lose nothing at 500 batches and about a quarter
	// of their batches at 128 (libzmq's flow control hands over too
	// often), so a budget of 16 MiB or more gives four streams 500. Memory
	// stays within the budget either way.
	minRcvHWM = 16
	// MaxRcvHWM is the deepest SUB queue, in messages, and the one
	// zmqtransport uses without a budget (zmqtransport.DefaultRcvHWM). The
	// engine side already queues up to 100,000 messages per subscriber
	// (vLLM's PUB high-water mark, zmqtransport.DefaultPubHWM) while
	// kvindex falls behind, so a deep queue here only holds the same
	// backlog a second time, in kvindex's memory, outside the Go heap:
	// TestFloodRSS measures the process's peak against this setting
	// (figures in README.md).
	MaxRcvHWM = 1000
)

// EngineBytes is what one engine rank is taken to cost beyond its entries
// and its event queue (its sequencer, replay socket, counters and metrics
// series; the fault suite's 1,000-engine churn measured about 75 KiB an
// engine, queues included).
const EngineBytes = 64 << 10

// MaxEngines is the most engine ranks a bind-mode listener admits under a
// memory budget (bytes): as many as the engines' share holds
// (budget/EngineShareDiv/EngineBytes, one per 512 KiB of budget), at least
// one and at most def (the transport's default, which applies without a
// budget).
func MaxEngines(budget int64, def int) int {
	if budget <= 0 {
		return def
	}
	return int(min(max(budget/EngineShareDiv/EngineBytes, 1), int64(def)))
}

// Shares is how Split partitions a memory budget: Index + Queues +
// Engines is at most the budget.
type Shares struct {
	// Index is the index's own structures, by its count of its bytes
	// (indexer.Options.MemoryBudget).
	Index int64
	// Queues is the ZMQ receive queues of every stream together: RcvHWM
	// batches of queueMsgBytes each, in libzmq's malloc'd memory.
	Queues int64
	RcvHWM int // zmqtransport.SubscriberConfig.RcvHWM
	// Engines is the engines' state beyond their entries: EngineBytes a
	// stream.
	Engines int64
	// Tokens is the tokenizers' caches together (TokenCacheBytes), when
	// the process has any.
	Tokens int64
}

// TokenShareDiv: the tokenizers' caches (the engine /tokenize backend's
// answers, the local tokenizer's segments) get budget/TokenShareDiv
// together, at most DefaultTokenCacheBytes.
const TokenShareDiv = 16

// DefaultTokenCacheBytes bounds the tokenizers' caches together without
// a budget: the ids of about a thousand 16k-token conversations.
const DefaultTokenCacheBytes = 64 << 20

// TokenCacheBytes is what the tokenizers' caches of a process with memory
// budget budget (0 or less: none) may hold together.
func TokenCacheBytes(budget int64) int64 {
	if budget <= 0 {
		return DefaultTokenCacheBytes
	}
	return min(budget/TokenShareDiv, DefaultTokenCacheBytes)
}

// Split partitions a memory budget (bytes; 0 or less: none, and the zero
// Shares, which change nothing) among the parts of the process that grow
// with it, for a number of event streams (connect-mode engine ranks plus,
// in bind mode, up to MaxEngines peers):
//
//   - Engines: EngineBytes per stream;
//   - Queues: each stream's SUB queue holds RcvHWM batches at
//     queueMsgBytes each, libzmq's memory outside the Go heap. RcvHWM is
//     budget/QueueShareDiv spread over the streams, within [minRcvHWM,
//     MaxRcvHWM], and shallower when the index would keep less than
//     budget/minIndexDiv; a shallow queue trades replays for memory
//     (minRcvHWM). In bind mode libzmq keeps one queue per connection,
//     not per stream, so the share holds only because the listener
//     admits at most MaxEngines connections at the handshake
//     (zmqtransport's connection cap, under static engine allow rules);
//     beyond the share are the connections of the addresses exact rules
//     tie to pods (two per pod and listen port), as those engines'
//     state is, and, with discovery's rules, which are not checked at
//     the handshake, every connection beyond MaxEngines;
//   - Tokens: with tokenCaches, the tokenizers' caches
//     (TokenCacheBytes), less what the queues' floors need of it;
//   - Index: the rest, at least budget/minIndexDiv.
//
// So the index evicts to stay within its share, and the budget covers the
// engines' state and their queues too. An error says that the streams'
// floors (EngineBytes and minRcvHWM batches each) pass what the index
// leaves them: the budget is too small for that many streams, and the
// error names the budget that would do (the Shares are then the floors,
// and the index keeps its minimum).
func Split(budget int64, streams int, tokenCaches bool) (Shares, error) {
	if budget <= 0 {
		return Shares{}, nil
	}
	n := int64(max(streams, 1))
	hwm := min(max(budget/QueueShareDiv/n/queueMsgBytes, minRcvHWM), MaxRcvHWM)
	// What the queues may take beside the engines and the index's least,
	// less the tokenizers' caches, which yield to the queues' floors.
	room := budget - budget/minIndexDiv - n*EngineBytes
	var tokens int64
	if tokenCaches {
		tokens = min(TokenCacheBytes(budget), max(room-n*minRcvHWM*queueMsgBytes, 0))
		room -= tokens
	}
	hwm = min(hwm, room/n/queueMsgBytes)
	if hwm < minRcvHWM {
		per := int64(EngineBytes + minRcvHWM*queueMsgBytes)
		s := Shares{Index: budget / minIndexDiv, Queues: n * minRcvHWM * queueMsgBytes, RcvHWM: minRcvHWM, Engines: n * EngineBytes, Tokens: tokens}
		return s, fmt.Errorf("a memory budget of %s holds the state and event queues of at most %d engine ranks (%s each, beside an index of half the budget); %d need %s or more",
			bytesize.Format(budget), (budget-budget/minIndexDiv)/per, bytesize.Format(per), n, bytesize.Format(n*per*minIndexDiv))
	}
	s := Shares{Queues: n * hwm * queueMsgBytes, RcvHWM: int(hwm), Engines: n * EngineBytes, Tokens: tokens}
	s.Index = budget - s.Queues - s.Engines - s.Tokens
	return s, nil
}

// BodyShareDiv: the request bodies a process buffers at once get
// budget/BodyShareDiv (BodyBytes), a share that fits in the bound's slack
// beyond the budget (budget/10) with room for the rest that grows there.
const BodyShareDiv = 16

// BodyBytes is the most request-body bytes a process with memory budget
// budget may buffer at once, across requests, when one body may be up to
// largest bytes: budget/BodyShareDiv, but at least largest (one body of
// the largest size is always admitted) and at most def, the bound without
// a budget (which applies when budget is 0 or less).
func BodyBytes(budget, largest, def int64) int64 {
	if budget <= 0 {
		return def
	}
	return min(max(budget/BodyShareDiv, largest), def)
}

// Limits are the process-wide bounds derived from --memory-budget.
type Limits struct {
	GoLimit int64 // for debug.SetMemoryLimit; 0: leave the runtime's
	RcvHWM  int   // zmqtransport.SubscriberConfig.RcvHWM; 0: its default
}

// FromBudget derives the process's memory bounds from --memory-budget
// (budget bytes, 0 meaning unlimited) and the number of event streams, as
// Split does. Split's shares partition the budget; the rest of the
// process is bounded around it:
//
//   - Go heap: debug.SetMemoryLimit(ProcessBound(budget) - NonGoReserve -
//     Shares.Queues), the bound less what is not Go's, so the garbage
//     collector works harder as the heap nears it instead of letting it
//     grow to twice the live heap (GOGC). A GOMEMLIMIT set by the user
//     wins. The limit is soft: live data above it is kept.
//   - ZMQ receive queues: RcvHWM (Split). A shallow queue loses nothing
//     but replays: the engine's PUB socket holds the backlog
//     (zmqtransport.DefaultPubHWM) up to its own high-water mark.
//   - fixed: the binary, the runtime, libzmq's threads and malloc's arenas
//     (zmqtransport caps and trims them): FixedOverhead whatever the
//     budget; README.md ("Memory") has the figures TestFloodRSS measured.
//
// Without a budget nothing changes: no Go limit, the default queues.
func FromBudget(budget int64, streams int) Limits {
	if budget <= 0 {
		return Limits{}
	}
	s, _ := Split(budget, streams, false) // the queues do not depend on the tokenizers
	return Limits{
		GoLimit: goLimit(ProcessBound(budget), s.Queues),
		RcvHWM:  s.RcvHWM,
	}
}

// goLimit is the Go memory limit within a process bound: the bound less
// NonGoReserve and the queues, none (math.MaxInt64) for a bound that
// saturated.
func goLimit(bound, queues int64) int64 {
	if bound == math.MaxInt64 {
		return bound
	}
	return max(bound-NonGoReserve-queues, 0)
}

// Apply sets the Go memory limit, unless the user set GOMEMLIMIT.
func (m Limits) Apply(log *slog.Logger) {
	if m.GoLimit == 0 {
		return
	}
	if v, ok := os.LookupEnv("GOMEMLIMIT"); ok {
		log.Info("GOMEMLIMIT set; --memory-budget does not change the Go memory limit", "gomemlimit", v)
		return
	}
	debug.SetMemoryLimit(m.GoLimit)
	log.Info("memory limits from --memory-budget", "go_memory_limit", bytesize.Format(m.GoLimit), "zmq_rcvhwm", m.RcvHWM)
}
