package main

import (
	"bytes"
	"fmt"
	"io"
	"os"

	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/api/client"
)

// maxTokensFile bounds a --tokens-file: 64 MiB holds millions of ids,
// far beyond any model's context.
const maxTokensFile = 64 << 20

// tokenFlags are the shared token-id inputs of hash, query and lookup.
type tokenFlags struct {
	list string
	file string
}

func (f *tokenFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.list, "tokens", "", "token ids, comma-separated (e.g. 1,2,3)")
	fs.StringVar(&f.file, "tokens-file", "", "file holding token ids: a JSON array, or ids separated by commas or whitespace; - reads stdin")
}

func (f *tokenFlags) set() bool { return f.list != "" || f.file != "" }

// load returns the token ids given by --tokens or --tokens-file; stdin is
// what --tokens-file - reads.
func (f *tokenFlags) load(stdin io.Reader) ([]uint64, error) {
	switch {
	case f.list != "" && f.file != "":
		return nil, usagef("--tokens and --tokens-file are mutually exclusive")
	case f.list != "":
		ids, err := client.ParseTokenList(f.list)
		if err != nil {
			return nil, usagef("--tokens: %v", err) // a bad flag value, unlike a bad file
		}
		return ids, nil
	case f.file != "":
		return readTokensFile(f.file, stdin)
	}
	return nil, usagef("no tokens: give --tokens 1,2,3 or --tokens-file FILE")
}

// readTokensFile reads --tokens-file (client.ParseTokenIDs).
func readTokensFile(path string, stdin io.Reader) ([]uint64, error) {
	data, err := readInput("--tokens-file", path, stdin, maxTokensFile)
	if err != nil {
		return nil, err
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("--tokens-file %s is empty", inputName(path))
	}
	ids, err := client.ParseTokenIDs(data)
	if err != nil {
		return nil, fmt.Errorf("--tokens-file %s: %w", inputName(path), err)
	}
	return ids, nil
}

// readInput reads the file a --*-file flag names, or stdin when it is
// "-", refusing more than limit bytes.
func readInput(flag, path string, stdin io.Reader, limit int64) ([]byte, error) {
	if path == "-" {
		data, err := io.ReadAll(io.LimitReader(stdin, limit+1))
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", flag, inputName(path), err)
		}
		if int64(len(data)) > limit {
			return nil, fmt.Errorf("%s %s: more than the %d-byte limit", flag, inputName(path), limit)
		}
		return data, nil
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	if st.Size() > limit {
		return nil, fmt.Errorf("%s %s: %d bytes exceeds the %d-byte limit", flag, path, st.Size(), limit)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return data, nil
}

// inputName names an input file in messages; "-" is stdin.
func inputName(path string) string {
	if path == "-" {
		return "- (stdin)"
	}
	return path
}
