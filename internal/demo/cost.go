package demo

import "time"

// CostModel turns tokens into simulated time. An engine is modelled as a
// single server: one request at a time, whose service time is
//
//	Overhead + PrefillPerToken*(prompt tokens not served from cache) + DecodePerToken*(output tokens)
//
// and whose time to first token is its queueing time plus the first two
// terms. Real engines batch many requests; the single-server model keeps
// the two effects routing changes (work avoided by cache hits, work piled
// on one engine) while staying exact and cheap to simulate.
type CostModel struct {
	// PrefillPerToken is the prefill cost of one uncached prompt token.
	// 100µs is ~10k tokens/s: a 32B model on one H100.
	PrefillPerToken time.Duration
	// DecodePerToken is the decode cost of one output token, amortized
	// over the batch the engine would run it in.
	DecodePerToken time.Duration
	// Overhead is the fixed cost of a request (scheduling, sampling setup).
	Overhead time.Duration
}

// DefaultCost returns the default time model.
func DefaultCost() CostModel {
	return CostModel{
		PrefillPerToken: 100 * time.Microsecond,
		DecodePerToken:  2 * time.Millisecond,
		Overhead:        10 * time.Millisecond,
	}
}

// Prefill returns the time to first token of a request admitted now.
func (c CostModel) Prefill(uncached int) time.Duration {
	return c.Overhead + time.Duration(uncached)*c.PrefillPerToken
}

// Service returns the time an engine is busy with a request.
func (c CostModel) Service(uncached, output int) time.Duration {
	return c.Prefill(uncached) + time.Duration(output)*c.DecodePerToken
}
