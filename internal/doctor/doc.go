// Package doctor diagnoses a running kvindex from what its API reports:
// engines it cannot vouch for, and why, each with its fix.
//
// Its main finding is a hash mismatch: an engine whose reported block
// hashes kvindex cannot recompute runs another hashing configuration than
// kvindex's --hash-algo, --hash-seed and --block-size. Search takes the
// engine's recent BlockStored events (kept by the server, HashSamples) and
// tries the configurations the engine could run (every algorithm of
// package blockhash, the likely seeds, the usual block sizes, with and
// without the extra keys the events carry) until one reproduces every
// sampled block. When none does but the blocks chained from a reported
// parent digest do, the engine draws its NONE_HASH at random
// (PYTHONHASHSEED unset on a vLLM that does so), which nobody can mirror.
//
// Search is pure (events in, diagnosis out); Build turns the server's
// answers into a Report, which prints as text or JSON. The kvindex doctor
// command is its front end.
package doctor
