// Package goldenfile checks that a golden test file names, in its top-level
// "generator" field, a generator that exists in this repository.
//
// Golden files hold values computed by an outside reference (vLLM's
// hashing, msgspec's encoding, Hugging Face's tokenizers). A test can only
// be trusted as long as those values can be recomputed, so every such file
// records the repository path of the script that writes it, and each
// package's tests call [Generator] on their golden files.
package goldenfile
