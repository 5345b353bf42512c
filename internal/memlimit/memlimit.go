package memlimit

import (
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

// Shares of --memory-budget; FromBudget explains them.
const (
	// NonGoReserve is the part of the process bound that is not Go's: the
	// binary's mapped pages and shared libraries (34 MiB measured at
	// rest) and the C heap (libzmq's threads and, beyond QueueShareDiv's
	// queues, malloc's arenas). The Go memory limit is the bound less it.
	NonGoReserve = 40 << 20
	// QueueShareDiv: the event queues get budget/QueueShareDiv.
	QueueShareDiv = 4
	// queueMsgBytes is what one queued batch is taken to cost (vLLM's
	// batches are 1 to 3 KiB).
	queueMsgBytes = 2 << 10
	// minRcvHWM is the shallowest SUB queue: with shallower ones
	// TestFloodRSS saw the publishers drop batches (libzmq's flow control
	// hands over too often), with this one it did not.
	minRcvHWM = 500
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
// (its sequencer, replay socket, counters and metrics series): a budget
// follows budget/EngineBytes engines at most in bind mode (MaxEngines).
const EngineBytes = 64 << 10

// MaxEngines is the most engine ranks a bind-mode listener admits under a
// memory budget (bytes): budget/EngineBytes, at least minEngines and at
// most def (the transport's default, which applies without a budget).
func MaxEngines(budget int64, def int) int {
	if budget <= 0 {
		return def
	}
	return int(min(max(budget/EngineBytes, minEngines), int64(def)))
}

// minEngines is the fewest engine ranks MaxEngines allows.
const minEngines = 16

// Limits are the process-wide bounds derived from --memory-budget.
type Limits struct {
	GoLimit int64 // for debug.SetMemoryLimit; 0: leave the runtime's
	RcvHWM  int   // zmqtransport.SubscriberConfig.RcvHWM; 0: its default
}

// FromBudget derives the process's memory bounds from --memory-budget
// (budget bytes, 0 meaning unlimited) and the number of event streams
// (connect-mode engine ranks plus, in bind mode, up to --max-engines
// peers). The budget caps the index itself (indexer.Options.MemoryBudget);
// the rest of the process is bounded around it:
//
//   - Go heap: debug.SetMemoryLimit(ProcessBound(budget) - NonGoReserve),
//     the bound less what is not Go's, so the garbage collector works
//     harder as the heap nears it instead of letting it grow to twice the
//     live heap (GOGC). A GOMEMLIMIT set by the user wins. The limit is
//     soft: live data above it is kept.
//   - ZMQ receive queues, which libzmq allocates outside the Go heap: each
//     SUB socket queues up to RcvHWM messages per peer. The queues get a
//     share of budget/QueueShareDiv at queueMsgBytes per batch, spread over
//     the streams; RcvHWM stays within [minRcvHWM, MaxRcvHWM]. A shallow
//     queue loses nothing: the engine's PUB socket holds the backlog
//     (zmqtransport.DefaultPubHWM).
//   - fixed: the binary, the runtime, libzmq's threads and malloc's arenas
//     (zmqtransport caps and trims them): FixedOverhead whatever the
//     budget; README.md ("Memory") has the figures TestFloodRSS measured.
//
// Without a budget nothing changes: no Go limit, the default queues.
func FromBudget(budget int64, streams int) Limits {
	if budget <= 0 {
		return Limits{}
	}
	hwm := budget / QueueShareDiv / int64(max(streams, 1)) / queueMsgBytes
	return Limits{
		GoLimit: goLimit(ProcessBound(budget)),
		RcvHWM:  int(min(max(hwm, minRcvHWM), MaxRcvHWM)),
	}
}

// goLimit is the Go memory limit within a process bound: the bound less
// NonGoReserve, none (math.MaxInt64) for a bound that saturated.
func goLimit(bound int64) int64 {
	if bound == math.MaxInt64 {
		return bound
	}
	return max(bound-NonGoReserve, 0)
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
