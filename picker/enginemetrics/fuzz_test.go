package enginemetrics_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/picker/enginemetrics"
)

// FuzzParse feeds Parse arbitrary pages, seeded with the testdata ones:
// it must never panic, and a page it accepts must read as counts an
// engine can have.
func FuzzParse(f *testing.F) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil {
		f.Fatal(err)
	}
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	f.Fuzz(func(t *testing.T, page string) {
		rd, err := enginemetrics.Parse(strings.NewReader(page))
		if err != nil {
			return
		}
		if rd.Waiting < 0 || rd.Running < 0 || !(rd.KVUsage >= 0 && rd.KVUsage <= 1) {
			t.Fatalf("Parse accepted %+v", rd)
		}
		for m, c := range rd.Prefix {
			if !(c.Queries >= 0) || !(c.Hits >= 0) {
				t.Fatalf("Parse accepted model %q counters %+v", m, c)
			}
		}
	})
}

func BenchmarkParse(b *testing.B) {
	page, err := os.ReadFile("testdata/vllm-0.11-dp2.txt")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := enginemetrics.Parse(strings.NewReader(string(page))); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzParseUsage feeds ParseUsage arbitrary bodies: it must never panic.
func FuzzParseUsage(f *testing.F) {
	f.Add([]byte(`{"model":"m","usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":4}}}`))
	f.Add([]byte("data: {\"usage\":{\"input_tokens\":1,\"input_tokens_details\":{\"cached_tokens\":1}}}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("event: x\ndata: {\"response\":{\"usage\":null}}\n\n"))
	f.Fuzz(func(t *testing.T, body []byte) {
		enginemetrics.ParseUsage(body) //nolint:errcheck // only panics matter
	})
}
