//go:build race

package tokenizer

// raceEnabled lets the slowest tests skip under the race detector.
const raceEnabled = true
