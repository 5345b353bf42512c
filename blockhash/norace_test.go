//go:build !race

package blockhash_test

const raceEnabled = false
