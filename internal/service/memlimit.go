package service

import (
	"log/slog"
	"math"
	"os"
	"runtime/debug"

	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// Shares of --memory-budget; memoryLimits explains them.
const (
	// GoOverhead is the Go heap kvindex needs beyond the index: decoders,
	// queries, gRPC and HTTP buffers, Watch queues, the runtime.
	GoOverhead = 64 << 20
	// QueueShareDiv: the event queues get budget/QueueShareDiv.
	QueueShareDiv = 4
	// queueMsgBytes is what one queued batch is taken to cost (vLLM's
	// batches are 1 to 3 KiB).
	queueMsgBytes = 2 << 10
	// minRcvHWM is the shallowest SUB queue: with shallower ones
	// TestFloodRSS saw the publishers drop batches (libzmq's flow control
	// hands over too often), with this one it did not.
	minRcvHWM = 500
)

// memLimits are the process-wide bounds derived from --memory-budget.
type memLimits struct {
	goLimit int64 // for debug.SetMemoryLimit; 0: leave the runtime's
	rcvHWM  int   // SubscriberConfig.RcvHWM; 0: its default
}

// memoryLimits derives the process's memory bounds from --memory-budget
// (budget bytes, 0 meaning unlimited) and the number of event streams
// (connect-mode engine ranks plus, in bind mode, up to --max-engines
// peers). The budget caps the index itself (indexer.Options.MemoryBudget);
// the rest of the process is bounded around it:
//
//   - Go heap: debug.SetMemoryLimit(budget + GoOverhead), so the garbage
//     collector works harder as the heap nears the budget instead of
//     letting it grow to twice the live heap (GOGC). A GOMEMLIMIT set by
//     the user wins. The limit is soft: live data above it is kept.
//   - ZMQ receive queues, which libzmq allocates outside the Go heap: each
//     SUB socket queues up to RcvHWM messages per peer. The queues get a
//     share of budget/QueueShareDiv at queueMsgBytes per batch, spread over
//     the streams; RcvHWM stays within [minRcvHWM,
//     zmqtransport.DefaultRcvHWM]. A shallow queue loses nothing: the
//     engine's PUB socket holds the backlog (zmqtransport.DefaultPubHWM).
//   - fixed: the binary, the runtime, libzmq's threads and malloc's arenas
//     (zmqtransport caps and trims them): a few tens of MiB whatever the
//     budget; README.md ("Memory") has the figures TestFloodRSS measured.
//
// Without a budget nothing changes: no Go limit, the default queues.
func memoryLimits(budget int64, streams int) memLimits {
	if budget <= 0 {
		return memLimits{}
	}
	hwm := budget / QueueShareDiv / int64(max(streams, 1)) / queueMsgBytes
	return memLimits{
		goLimit: min(budget, math.MaxInt64-GoOverhead) + GoOverhead,
		rcvHWM:  int(min(max(hwm, minRcvHWM), zmqtransport.DefaultRcvHWM)),
	}
}

// apply sets the Go memory limit, unless the user set GOMEMLIMIT.
func (m memLimits) apply(log *slog.Logger) {
	if m.goLimit == 0 {
		return
	}
	if v, ok := os.LookupEnv("GOMEMLIMIT"); ok {
		log.Info("GOMEMLIMIT set; --memory-budget does not change the Go memory limit", "gomemlimit", v)
		return
	}
	debug.SetMemoryLimit(m.goLimit)
	log.Info("memory limits from --memory-budget", "go_memory_limit", FormatSize(m.goLimit), "zmq_rcvhwm", m.rcvHWM)
}
