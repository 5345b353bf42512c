package trace

import (
	"bytes"
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/conversations.jsonl from its generator")

// conversationsFile is the trace the repository ships: "kvindex demo
// --trace" replays it in README.md.
const conversationsFile = "testdata/conversations.jsonl"

// TestShippedTrace checks that the shipped trace is exactly what
// conversations generates and that it reads back; go test -update
// rewrites it.
func TestShippedTrace(t *testing.T) {
	got := conversations(defaultConversations)
	path := filepath.FromSlash(conversationsFile)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -update creates it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from its generator's output (go test -update rewrites it)", conversationsFile)
	}
	if len(want) > 1<<20 {
		t.Fatalf("%s is %d bytes: keep the shipped trace under 1 MB", conversationsFile, len(want))
	}
	rd := NewReader(bytes.NewReader(want), Options{})
	n := 0
	for {
		_, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if rd.Format() != FormatMooncake || n != countLines(want) {
		t.Fatalf("format %q, %d records of %d lines", rd.Format(), n, countLines(want))
	}
}

func countLines(b []byte) int { return bytes.Count(b, []byte("\n")) }

// conversationsConfig shapes the generated trace.
type conversationsConfig struct {
	Seed     uint64
	Sessions int     // conversations
	OneOffs  int     // single requests
	Span     float64 // seconds over which sessions start and one-offs arrive
	// System prompts: a session uses prompt i with weight SystemWeights[i]
	// (the rest: none). Their full blocks are shared by every request
	// that starts with them.
	SystemTokens  []int
	SystemWeights []float64
	TurnsMin      int // turns per session
	TurnsMax      int
	FirstMin      int // the first user message (a pasted document at the top)
	FirstMax      int
	MessageMin    int // each later message
	MessageMax    int
	OutputMin     int // the answer, which the next turn resends
	OutputMax     int
	ThinkMin      float64 // seconds between a turn and the next: ThinkMin + Exp(ThinkMean)
	ThinkMean     float64
	OneOffMin     int // a one-off request's prompt after its system prompt
	OneOffMax     int
}

// defaultConversations makes the shipped trace: 150 conversations
// starting over two minutes, 2-12 turns each, most behind one of two
// system prompts, and 200 one-off requests, half of them behind the first
// system prompt.
var defaultConversations = conversationsConfig{
	Seed: 1, Sessions: 150, OneOffs: 200, Span: 120,
	SystemTokens: []int{1600, 3300}, SystemWeights: []float64{0.7, 0.2},
	TurnsMin: 2, TurnsMax: 12,
	FirstMin: 100, FirstMax: 3000,
	MessageMin: 20, MessageMax: 400,
	OutputMin: 30, OutputMax: 500,
	ThinkMin: 2, ThinkMean: 6,
	OneOffMin: 500, OneOffMax: 6000,
}

// genRequest is one generated request, before ids are remapped.
type genRequest struct {
	at     float64 // seconds
	seq    int     // creation order: breaks ties in time
	input  int
	output int
	ids    []uint64 // provisional block ids
}

// stream is a token sequence seen in blocks of MooncakeBlockTokens: its
// full blocks keep their ids as it grows; a partial last block gets a
// fresh id in every prompt, as its content changes once the block fills.
type stream struct {
	tokens int
	full   []uint64
}

// conversations generates a Mooncake-format trace: sessions whose turns
// resend the whole context (system prompt, messages, answers) plus a new
// message, and one-off requests. Block ids are numbered by first
// appearance, as in Mooncake's traces.
func conversations(c conversationsConfig) []byte {
	rng := rand.New(rand.NewPCG(c.Seed, 0x636f6e76))
	next := uint64(0)
	fresh := func() uint64 { next++; return next }
	between := func(lo, hi int) int { return lo + rng.IntN(hi-lo+1) }
	const bt = MooncakeBlockTokens
	grow := func(s *stream, n int) {
		s.tokens += n
		for len(s.full) < s.tokens/bt {
			s.full = append(s.full, fresh())
		}
	}
	prompt := func(s *stream) []uint64 {
		ids := slices.Clone(s.full)
		if s.tokens%bt != 0 {
			ids = append(ids, fresh())
		}
		return ids
	}
	// The system prompts' full blocks, shared by whoever starts with them.
	systems := make([]stream, len(c.SystemTokens))
	for i, n := range c.SystemTokens {
		grow(&systems[i], n)
	}
	pickSystem := func() *stream {
		x := rng.Float64()
		for i, w := range c.SystemWeights {
			if x < w {
				s := stream{tokens: systems[i].tokens, full: slices.Clone(systems[i].full)}
				return &s
			}
			x -= w
		}
		return &stream{}
	}
	var reqs []genRequest
	add := func(at float64, s *stream, output int) {
		reqs = append(reqs, genRequest{at: at, seq: len(reqs), input: s.tokens, output: output, ids: prompt(s)})
	}
	for range c.Sessions {
		at := rng.Float64() * c.Span
		s := pickSystem()
		grow(s, between(c.FirstMin, c.FirstMax))
		turns := between(c.TurnsMin, c.TurnsMax)
		for turn := range turns {
			if turn > 0 {
				grow(s, between(c.MessageMin, c.MessageMax))
			}
			out := between(c.OutputMin, c.OutputMax)
			add(at, s, out)
			grow(s, out) // the answer, resent by the next turn
			at += c.ThinkMin + rng.ExpFloat64()*c.ThinkMean
		}
	}
	for range c.OneOffs {
		at := rng.Float64() * c.Span
		s := &stream{}
		if rng.IntN(2) == 0 {
			s = &stream{tokens: systems[0].tokens, full: slices.Clone(systems[0].full)}
		}
		grow(s, between(c.OneOffMin, c.OneOffMax))
		add(at, s, between(c.OutputMin, c.OutputMax))
	}
	slices.SortFunc(reqs, func(a, b genRequest) int {
		return cmp.Or(cmp.Compare(int64(a.at*1000), int64(b.at*1000)), cmp.Compare(a.seq, b.seq))
	})
	remap := map[uint64]uint64{}
	var b bytes.Buffer
	for _, r := range reqs {
		b.WriteString(fmt.Sprintf(`{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": [`, int64(r.at*1000), r.input, r.output))
		for i, id := range r.ids {
			m, ok := remap[id]
			if !ok {
				m = uint64(len(remap))
				remap[id] = m
			}
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(fmt.Sprint(m))
		}
		b.WriteString("]}\n")
	}
	return b.Bytes()
}
