package tokenizer

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// longPrompt returns the ~8k-token text of the golden corpus and its ids.
func longPrompt(b *testing.B) (string, []uint64) {
	g := readGolden(b, "testdata/golden.json")
	ids := g.Variants[0].IDs
	return g.Texts[len(ids)-1], ids[len(ids)-1]
}

// BenchmarkLocalTokenize encodes an ~8k-token prompt (prose, code, some
// CJK) with the Qwen2.5 tokenizer.
func BenchmarkLocalTokenize(b *testing.B) {
	tok, _ := qwen(b)
	text, want := longPrompt(b)
	ctx := context.Background()
	in := Input{Prompt: text}
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		ids, err := tok.Tokenize(ctx, "", in)
		if err != nil {
			b.Fatal(err)
		}
		n += len(ids)
	}
	if got := tok.Encode(text, false); len(got) != len(want) {
		b.Fatalf("got %d ids, want %d", len(got), len(want))
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "tokens/s")
	b.ReportMetric(float64(len(want)), "tokens/op")
}

// BenchmarkLoad parses and builds the Qwen2.5 tokenizer from its
// decompressed tokenizer.json (7 MB, 151k tokens and merges).
func BenchmarkLoad(b *testing.B) {
	_, data := qwen(b)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Load(bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/load")
}

// BenchmarkLoadFileGzip is LoadFile on the committed .json.gz.
func BenchmarkLoadFileGzip(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := LoadFile(qwenPath); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/load")
}

// BenchmarkHTTPCached is the HTTP backend's cache-hit path for an ~8k-token
// prompt: hashing the prompt, the LRU lookup and copying the ids out, into
// a new slice (Tokenize) or a reused one (AppendTokenize).
func BenchmarkHTTPCached(b *testing.B) {
	text, want := longPrompt(b)
	srv := cannedEngine(b, want)
	h, err := NewHTTP(HTTPConfig{BaseURL: srv.URL})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	in := Input{Prompt: text}
	if _, err := h.Tokenize(ctx, "m", in); err != nil {
		b.Fatal(err)
	}
	b.Run("Tokenize", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := h.Tokenize(ctx, "m", in); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("AppendTokenize", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]uint64, 0, 16<<10)
		for b.Loop() {
			var err error
			if buf, err = h.AppendTokenize(ctx, buf[:0], "m", in); err != nil {
				b.Fatal(err)
			}
		}
	})
	if s := h.Stats(); s.Requests != 1 {
		b.Fatalf("%d engine requests, want 1", s.Requests)
	}
}

// BenchmarkHTTPMiss is a full round trip to an engine over loopback for an
// ~8k-token prompt (request encoding, HTTP, decoding 8k ids), cache off;
// the engine answers with canned ids so only the client side is measured.
func BenchmarkHTTPMiss(b *testing.B) {
	text, want := longPrompt(b)
	srv := cannedEngine(b, want)
	h, err := NewHTTP(HTTPConfig{BaseURL: srv.URL, CacheEntries: -1})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	in := Input{Prompt: text}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := h.Tokenize(ctx, "m", in); err != nil {
			b.Fatal(err)
		}
	}
}

// cannedEngine answers every /tokenize with ids.
func cannedEngine(b *testing.B, ids []uint64) *httptest.Server {
	body, _ := json.Marshal(map[string]any{"count": len(ids), "max_model_len": 32768, "tokens": ids})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	}))
	b.Cleanup(srv.Close)
	return srv
}

// BenchmarkLocalHostile encodes 1 MB texts that form a single huge piece
// (one whitespace run, one letter run), the worst case for a BPE merge
// loop: it must stay O(n log n), not O(n²).
func BenchmarkLocalHostile(b *testing.B) {
	tok, _ := qwen(b)
	for _, tc := range []struct{ name, unit string }{{"spaces", " "}, {"letters", "a"}, {"cjk", "中"}} {
		text := strings.Repeat(tc.unit, (1<<20)/len(tc.unit))
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			n := 0
			for b.Loop() {
				n += len(tok.Encode(text, false))
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}
