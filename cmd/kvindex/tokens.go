package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
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
	fs.StringVar(&f.file, "tokens-file", "", "file holding token ids: a JSON array, or ids separated by commas or whitespace")
}

func (f *tokenFlags) set() bool { return f.list != "" || f.file != "" }

// load returns the token ids given by --tokens or --tokens-file.
func (f *tokenFlags) load() ([]uint64, error) {
	switch {
	case f.list != "" && f.file != "":
		return nil, usagef("--tokens and --tokens-file are mutually exclusive")
	case f.list != "":
		ids, err := parseTokenList(f.list, "--tokens")
		if err != nil {
			return nil, usageError{msg: err.Error()} // a bad flag value, unlike a bad file
		}
		return ids, nil
	case f.file != "":
		return readTokensFile(f.file)
	}
	return nil, usagef("no tokens: give --tokens 1,2,3 or --tokens-file FILE")
}

func readTokensFile(path string) ([]uint64, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("--tokens-file: %w", err)
	}
	if st.Size() > maxTokensFile {
		return nil, fmt.Errorf("--tokens-file %s: %d bytes exceeds the %d-byte limit", path, st.Size(), maxTokensFile)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--tokens-file: %w", err)
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, fmt.Errorf("--tokens-file %s is empty", path)
	}
	if data[0] == '[' {
		return parseTokenJSON(data, path)
	}
	return parseTokenList(string(data), "--tokens-file "+path)
}

// parseTokenJSON accepts a JSON array of non-negative integers; json.Number
// keeps ids above 2^53 exact.
func parseTokenJSON(data []byte, path string) ([]uint64, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var raw []any
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("--tokens-file %s: not a JSON array of integers: %v", path, err)
	}
	if len(raw) == 0 {
		return nil, fmt.Errorf("--tokens-file %s: empty token array", path)
	}
	out := make([]uint64, len(raw))
	for i, v := range raw {
		n, ok := v.(json.Number)
		if !ok {
			return nil, fmt.Errorf("--tokens-file %s: element %d is %v, not an integer", path, i, v)
		}
		t, err := parseToken(n.String())
		if err != nil {
			return nil, fmt.Errorf("--tokens-file %s: element %d: %v", path, i, err)
		}
		out[i] = t
	}
	return out, nil
}

func parseTokenList(s, what string) ([]uint64, error) {
	fields := strings.FieldsFunc(s, func(r rune) bool {
		return r == ',' || r == ' ' || r == '\t' || r == '\n' || r == '\r'
	})
	if len(fields) == 0 {
		return nil, fmt.Errorf("%s: no token ids", what)
	}
	out := make([]uint64, len(fields))
	for i, f := range fields {
		t, err := parseToken(f)
		if err != nil {
			return nil, fmt.Errorf("%s: token %d: %v", what, i, err)
		}
		out[i] = t
	}
	return out, nil
}

func parseToken(s string) (uint64, error) {
	if strings.HasPrefix(s, "-") {
		return 0, fmt.Errorf("%q is negative; token ids are non-negative integers", s)
	}
	t, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a non-negative integer", s)
	}
	return t, nil
}
