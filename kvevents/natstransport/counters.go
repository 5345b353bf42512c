package natstransport

import (
	"cmp"
	"sync/atomic"

	"github.com/kvindex/kvindex/kvevents"
)

// logEvery reports whether the n-th occurrence of a repetitive problem
// should be logged: the first few, then one in every thousand.
func logEvery(n uint64) bool {
	const first, every = 10, 1000
	return n <= first || n%every == 0
}

// compareEngineIDs orders engines by pod, rank, then model.
func compareEngineIDs(a, b kvevents.EngineID) int {
	return cmp.Or(cmp.Compare(a.Pod, b.Pod), cmp.Compare(a.DPRank, b.DPRank), cmp.Compare(a.Model, b.Model))
}

// span is the number of sequence numbers in [from, to]: a hole's size,
// saturating rather than wrapping (a publisher sets both freely).
func span(from, to uint64) uint64 {
	if to < from {
		return 0
	}
	if to-from == ^uint64(0) {
		return to - from
	}
	return to - from + 1
}

// addSaturating adds n to c, stopping at the largest uint64 instead of
// wrapping around to small numbers.
func addSaturating(c *atomic.Uint64, n uint64) {
	for {
		old := c.Load()
		sum := old + n
		if sum < old {
			sum = ^uint64(0)
		}
		if sum == old || c.CompareAndSwap(old, sum) {
			return
		}
	}
}
