package tokenizer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvindex/kvindex/tokenizer/chattemplate"
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

// conversation is a ~16k-token chat (prose, code and CJK from the golden
// corpus's long text, in user and assistant turns of ~500 tokens) and the
// text its turns are cut from.
func conversation(b *testing.B) ([]Message, string) {
	text, _ := longPrompt(b)
	var msgs []Message
	var cur strings.Builder
	for i, para := range strings.Split(text+"\n\n"+text, "\n\n") {
		cur.WriteString(para)
		cur.WriteString("\n\n")
		if cur.Len() >= 2000 || i == 0 {
			role := "user"
			if len(msgs)%2 == 1 {
				role = "assistant"
			}
			msgs = append(msgs, Message{Role: role, Content: strings.TrimSpace(cur.String())})
			cur.Reset()
		}
	}
	if len(msgs)%2 == 1 {
		msgs = msgs[:len(msgs)-1] // end on an assistant turn
	}
	return msgs, text
}

// nextTurn is the i'th distinct next turn after msgs: an assistant reply
// and a user message of ~150 tokens each.
func nextTurn(msgs []Message, text string, i int) []Message {
	at := (i * 997) % (len(text) - 1300)
	for !utf8.RuneStart(text[at]) {
		at++
	}
	part := func(n int) string {
		end := at + n
		for !utf8.RuneStart(text[end]) {
			end++
		}
		s := text[at:end]
		at = end
		return s
	}
	next := append(slices.Clip(msgs), Message{Role: "assistant", Content: fmt.Sprintf("Reply %d. %s", i, part(600))})
	return append(next, Message{Role: "user", Content: fmt.Sprintf("Question %d. %s", i, part(600))})
}

// BenchmarkChatTurn tokenizes the next turn of a ~16k-token conversation
// with the Qwen2.5 chat template, each iteration a different turn adding
// ~300 tokens: whole (no cache) and incremental (segment cache warm with
// the conversation so far), and, on the same input, the parts that stay
// proportional to the whole conversation: render (the template), split
// (the added-token scan), normalize (NFC check of the text between added
// tokens) and hash (the cache keys of the segments).
func BenchmarkChatTurn(b *testing.B) {
	tok, _ := qwen(b)
	tmpl, err := chattemplate.Load("chattemplate/testdata/templates/qwen2.5.json", nil)
	if err != nil {
		b.Fatal(err)
	}
	msgs, text := conversation(b)
	whole := &ChatLocal{Local: tok, Template: tmpl}
	ctx := context.Background()
	// warm returns a ChatLocal whose cache holds the conversation so far,
	// a new one per run so that no run finds the turns of an earlier one.
	warm := func(b *testing.B) (*ChatLocal, []uint64) {
		c := &ChatLocal{Local: tok.WithSegmentCache(256 << 20), Template: tmpl}
		ids, err := c.Tokenize(ctx, "", Input{Messages: msgs})
		if err != nil {
			b.Fatal(err)
		}
		return c, ids
	}
	incr, prev := warm(b)
	first, err := whole.Tokenize(ctx, "", Input{Messages: nextTurn(msgs, text, 0)})
	if err != nil {
		b.Fatal(err)
	}
	if got, _ := incr.Tokenize(ctx, "", Input{Messages: nextTurn(msgs, text, 0)}); !slices.Equal(got, first) {
		b.Fatal("incremental ids differ from whole")
	}
	report := func(b *testing.B) {
		b.ReportMetric(float64(len(first)), "tokens/op")
		b.ReportMetric(float64(len(first)-len(prev)), "new-tokens/op")
		b.ReportMetric(float64(len(first))*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
	}
	for _, name := range []string{"whole", "incremental"} {
		b.Run(name, func(b *testing.B) {
			c := whole
			if name == "incremental" {
				c, _ = warm(b)
			}
			b.ReportAllocs()
			buf := make([]uint64, 0, 2*len(first))
			i := 1
			for b.Loop() {
				if buf, err = c.AppendTokenize(ctx, buf[:0], "", Input{Messages: nextTurn(msgs, text, i)}); err != nil {
					b.Fatal(err)
				}
				i++
			}
			report(b)
		})
	}
	in := Input{Messages: nextTurn(msgs, text, 1)}
	b.Run("render", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := whole.Render(in); err != nil {
				b.Fatal(err)
			}
		}
	})
	rendered, _, _ := whole.Render(in)
	spans := tok.raw.split(nil, rendered)
	b.Run("split", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			spans = tok.raw.split(spans[:0], rendered)
		}
	})
	b.Run("normalize", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for _, sp := range spans {
				if sp.tok < 0 {
					tok.normalize(rendered[sp.start:sp.end])
				}
			}
		}
	})
	b.Run("hash", func(b *testing.B) {
		for b.Loop() {
			for _, sp := range spans {
				if sp.tok < 0 {
					incr.segs.key(rendered[sp.start:sp.end])
				}
			}
		}
	})
}

// BenchmarkGrowingPrompt tokenizes a ~16k-token completion prompt grown by
// a different ~300-token suffix each iteration: whole (no cache) and
// incremental (cache warm with the prompt), the latter for several chunk
// sizes (chunkMinBytes is the one used).
func BenchmarkGrowingPrompt(b *testing.B) {
	tok, _ := qwen(b)
	text, _ := longPrompt(b)
	base := text + "\n" + text
	suffix := func(i int) string {
		at := (i * 997) % (len(text) - 1300)
		for !utf8.RuneStart(text[at]) {
			at++
		}
		end := at + 1200
		for !utf8.RuneStart(text[end]) {
			end++
		}
		return fmt.Sprintf("\nAppended %d. %s", i, text[at:end])
	}
	want := tok.Encode(base+suffix(0), true)
	nBase := len(tok.Encode(base, true))
	run := func(b *testing.B, l *Local) {
		if got := l.Encode(base+suffix(0), true); !slices.Equal(got, want) {
			b.Fatal("ids differ from whole")
		}
		ctx := context.Background()
		buf := make([]uint64, 0, 2*len(want))
		b.ReportAllocs()
		i := 1
		for b.Loop() {
			var err error
			if buf, err = l.AppendTokenize(ctx, buf[:0], "", Input{Prompt: base + suffix(i)}); err != nil {
				b.Fatal(err)
			}
			i++
		}
		b.ReportMetric(float64(len(want)), "tokens/op")
		b.ReportMetric(float64(len(want)-nBase), "new-tokens/op")
		b.ReportMetric(float64(len(want))*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
	}
	b.Run("whole", func(b *testing.B) { run(b, tok) })
	for _, chunk := range []int{256, chunkMinBytes, 4096} {
		name := "incremental"
		if chunk != chunkMinBytes {
			name = fmt.Sprintf("incremental/chunk=%d", chunk)
		}
		b.Run(name, func(b *testing.B) {
			l := tok.WithSegmentCache(256 << 20)
			l.segs.minChunk = chunk
			l.Encode(base, true)
			run(b, l)
		})
	}
}

// BenchmarkSegmentHit compares encoding a segment with a cache hit for it,
// from the "\n" between two chat messages up.
func BenchmarkSegmentHit(b *testing.B) {
	tok, _ := qwen(b)
	text, _ := longPrompt(b)
	for _, n := range []int{1, 5, 16, 64, 256, 1024} {
		seg := strings.ToValidUTF8(text[1000:1000+n], "")
		switch n {
		case 1:
			seg = "\n" // between <|im_end|> and <|im_start|>
		case 5:
			seg = "user\n"
		}
		c := tok.WithSegmentCache(1 << 20)
		s := &encodeScratch{}
		buf := make([]uint64, 0, 1024)
		b.Run(fmt.Sprintf("bytes=%d/encode", n), func(b *testing.B) {
			for b.Loop() {
				buf = tok.preTokenize(buf[:0], seg, s)
			}
		})
		b.Run(fmt.Sprintf("bytes=%d/hit", n), func(b *testing.B) {
			buf = c.cachedSegment(buf[:0], seg, s)
			for b.Loop() {
				buf = c.cachedSegment(buf[:0], seg, s)
			}
		})
	}
}

// BenchmarkPreTokenizeScanner cuts the ~8k-token prompt into pieces with
// Qwen2's pattern, by the scanner and by regexp2 (pre-tokenizing alone,
// no BPE).
func BenchmarkPreTokenizeScanner(b *testing.B) {
	text, _ := longPrompt(b)
	runes := []rune(text)
	re, err := compileHFRegex(qwen2Pattern)
	if err != nil {
		b.Fatal(err)
	}
	var counts [2]int
	b.Run("scanner", func(b *testing.B) {
		b.SetBytes(int64(len(text)))
		b.ReportAllocs()
		for b.Loop() {
			n := 0
			for i := 0; i < len(runes); n++ {
				i = scanQwen2.next(runes, i)
			}
			counts[0] = n
		}
		b.ReportMetric(float64(counts[0]), "pieces/op")
	})
	b.Run("regexp2", func(b *testing.B) {
		b.SetBytes(int64(len(text)))
		b.ReportAllocs()
		for b.Loop() {
			n := 0
			m, err := re.FindRunesMatch(runes)
			for ; m != nil && err == nil; m, err = re.FindNextMatch(m) {
				n++
			}
			if err != nil {
				b.Fatal(err)
			}
			counts[1] = n
		}
		b.ReportMetric(float64(counts[1]), "pieces/op")
	})
	if counts[0] != counts[1] && counts[0] > 0 && counts[1] > 0 { // both run
		b.Fatalf("scanner %d pieces, regexp2 %d", counts[0], counts[1])
	}
}
