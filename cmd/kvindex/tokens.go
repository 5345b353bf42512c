package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
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
		ids, err := parseTokenList(f.list, "--tokens")
		if err != nil {
			return nil, usageError{msg: err.Error()} // a bad flag value, unlike a bad file
		}
		return ids, nil
	case f.file != "":
		return readTokensFile(f.file, stdin)
	}
	return nil, usagef("no tokens: give --tokens 1,2,3 or --tokens-file FILE")
}

func readTokensFile(path string, stdin io.Reader) ([]uint64, error) {
	data, err := readInput("--tokens-file", path, stdin, maxTokensFile)
	if err != nil {
		return nil, err
	}
	name := inputName(path)
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, fmt.Errorf("--tokens-file %s is empty", name)
	}
	if data[0] == '[' {
		return parseTokenJSON(data, name)
	}
	return parseTokenList(string(data), "--tokens-file "+name)
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
