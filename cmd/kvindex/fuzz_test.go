package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzServeConfig feeds arbitrary --config files to serve's settings: the
// YAML reading and every flag value's parsing and checks behind it. A file
// is taken or refused with one line naming what is wrong, never a panic.
//
//	go test -run '^$' -fuzz '^FuzzServeConfig$' -fuzztime 60s ./cmd/kvindex
func FuzzServeConfig(f *testing.F) {
	for _, s := range []string{
		"grpc-addr: \":6000\"\nhttp-addr: \":6001\"\nmodel: qwen\nengine:\n  - a=tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5567\n  - b=tcp://10.0.0.6:5557,ranks=2\n" +
			"hash-algo: sha256_cbor\nhash-seed: \"42\"\nblock-size: 32\nmemory-budget: 1.5GiB\nready-grace: 5s\npprof: true\nlog-format: json\n",
		"listen: tcp://*:5557\nlisten-ranks: 2\nreplay-template: tcp://{pod}:5567\ntopic-pattern: kv@{pod}@{model}\nmax-engines: 8\n",
		"listen: 'tcp://*:5557'\ntopic-pattern: '(?P<pod>[^.]+)\\.(?P<model>.+)'\nmax-query-tokens: 100\n",
		"model: m\nengine: [a=tcp://h:5557, b=tcp://h:5558]\n",
		"model: [a, b]\n", "model: {a: b}\n", "model: a\nmodel: b\n", "- a\n", "help: true\n",
		"engine: [\n", "block-size: sixteen\n", "memory-budget: lots\n", "~\n", "", "&a x: *a\n",
	} {
		f.Add([]byte(s))
	}
	path := filepath.Join(f.TempDir(), "kvindex.yaml")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		_, _, err := parseServe(t, "--config", path)
		if err != nil && (err.Error() == "" || strings.Contains(err.Error(), "\n")) {
			t.Fatalf("error %q: want one line", err)
		}
	})
}
