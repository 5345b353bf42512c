//go:build race

package indexer

// raceEnabled shortens the heaviest tests under the race detector, which
// slows them tenfold; the concurrent tests keep their full shape.
const raceEnabled = true
