//go:build race

package blockhash_test

// raceEnabled: under the race detector sync.Pool drops pooled buffers at
// random, so allocation counts say nothing; those tests run without it
// (make test runs this package a second time without -race).
const raceEnabled = true
