package main

import (
	"encoding/json"
	"maps"
	"net"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/testutil"
)

// query and lookup send the same prompt: with --lora-name or
// --cache-salt, query matches what lookup shows the engines hold (the
// prompt hashed with those extras), with --pod or without.
func TestCLIQueryExtrasMatchLookup(t *testing.T) {
	t.Parallel() // its own service and engines on free ports
	x := startE2E(t, []string{"pod-a", "pod-b", "pod-c"})
	prompt := testutil.Seq(70000, 4*e2eBlockSize)
	stores := []struct {
		pod string
		x   *blockhash.Extras
	}{
		{"pod-a", &blockhash.Extras{LoRAName: "sql-lora"}},
		{"pod-b", nil},
		{"pod-c", &blockhash.Extras{CacheSalt: "tenant-a"}},
	}
	for _, s := range stores {
		before := x.pod(s.pod, 0).GetBlocks()
		if _, err := x.engines[s.pod].Process(prompt, s.x); err != nil {
			t.Fatal(err)
		}
		x.await(s.pod+"'s blocks", func() bool { return x.pod(s.pod, 0).GetBlocks() >= before+4 })
	}

	tests := []struct {
		name  string
		flags []string
		want  map[string]uint32 // pods matching > 0 blocks
	}{
		{"base model", nil, map[string]uint32{"pod-b": 4}},
		{"lora", []string{"--lora-name", "sql-lora"}, map[string]uint32{"pod-a": 4}},
		{"lora, candidate pods", []string{"--lora-name", "sql-lora", "--pod", "pod-a", "--pod", "pod-b"}, map[string]uint32{"pod-a": 4}},
		{"cache salt", []string{"--cache-salt", "tenant-a"}, map[string]uint32{"pod-c": 4}},
		{"other lora", []string{"--lora-name", "other"}, map[string]uint32{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--server", x.svc.GRPCAddr(), "--tokens", idsArg(prompt), "--json"}, tc.flags...)
			out, errOut, code := runCLI(t, append([]string{"query"}, args...)...)
			var q client.LongestPrefixJSON
			if err := json.Unmarshal([]byte(out), &q); code != 0 || err != nil {
				t.Fatalf("query: exit %d %s %v", code, errOut, err)
			}
			matched := map[string]uint32{}
			for _, p := range q.Pods {
				if p.MatchedBlocks > 0 {
					matched[p.Pod] = p.MatchedBlocks
				}
			}
			out, errOut, code = runCLI(t, append([]string{"lookup"}, args...)...)
			var l client.LookupJSON
			if err := json.Unmarshal([]byte(out), &l); code != 0 || err != nil {
				t.Fatalf("lookup: exit %d %s %v", code, errOut, err)
			}
			held := map[string]uint32{} // leading blocks held, per pod
			for _, b := range l.Blocks {
				for _, h := range b.Holders {
					if held[h.Pod] == b.Index {
						held[h.Pod]++
					}
				}
			}
			if !maps.Equal(matched, tc.want) || !maps.Equal(held, tc.want) {
				t.Errorf("query matched %v, lookup shows %v; want both %v", matched, held, tc.want)
			}
		})
	}
}

// When only the engine's /tokenize is down, the CLI says that kvindex
// could not tokenize the prompt, naming the URL, rather than that kvindex
// cannot be reached.
func TestCLITokenizerDown(t *testing.T) {
	t.Parallel() // its own service and engines on free ports
	// A port nothing listens on; the service's own listeners, bound
	// after it is freed, may get it: then try another.
	var x *e2e
	var down string
	for x == nil || down == x.svc.GRPCAddr() || down == x.svc.HTTPAddr() {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		down = lis.Addr().String()
		lis.Close()
		x = startE2E(t, []string{"pod-a"}, "--tokenize-url", "http://"+down)
	}
	want := "kvindex: kvindex at " + x.svc.GRPCAddr() + " could not tokenize the prompt: the engine's /tokenize at http://" + down +
		" is unreachable: dial tcp " + down + ": connect: connection refused\n"
	for _, cmd := range []string{"query", "lookup"} {
		_, errOut, code := runCLI(t, cmd, "--server", x.svc.GRPCAddr(), "--prompt", "hello")
		if code != 1 || errOut != want {
			t.Errorf("%s: exit %d %q, want exit 1 %q", cmd, code, errOut, want)
		}
	}
	// Token ids need no tokenizer.
	if _, errOut, code := runCLI(t, "query", "--server", x.svc.GRPCAddr(), "--tokens", "1,2,3"); code != 0 || strings.Contains(errOut, "tokenize") {
		t.Errorf("tokens: exit %d %q", code, errOut)
	}
}
