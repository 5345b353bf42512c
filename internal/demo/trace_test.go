package demo

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/trace"
	"github.com/kvindex/kvindex/tokenizer"
)

// shippedTrace is the conversation trace the repository ships.
const shippedTrace = "../trace/testdata/conversations.jsonl"

// writeTrace writes lines as a trace file and returns its path.
func writeTrace(t *testing.T, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func mooncake(ms, input, output int, ids ...uint64) string {
	var s []string
	for _, id := range ids {
		s = append(s, fmt.Sprint(id))
	}
	return fmt.Sprintf(`{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": [%s]}`, ms, input, output, strings.Join(s, ", "))
}

// constructed is a Mooncake-format trace whose ceiling is known by
// construction (blocks of 512 tokens, engine blocks of 16):
//
//	[1 2 3] 1536 tokens: nothing before it                        0
//	[1 2 4] 1400: blocks 1 and 2 sent before                   1024
//	[1 2 3] 1300: 1, 2 and the 17 full engine blocks of 3      1296
//	[5]      100: nothing                                         0
//	[1 9]    600: block 1                                       512
//
// 2,832 of 4,936 prompt tokens.
var (
	constructed = []string{
		mooncake(0, 1536, 10, 1, 2, 3),
		mooncake(100, 1400, 20, 1, 2, 4),
		mooncake(200, 1300, 30, 1, 2, 3),
		mooncake(300, 100, 40, 5),
		mooncake(400, 600, 50, 1, 9),
	}
	constructedHits                   = []int{0, 1024, 1296, 0, 512}
	constructedHit, constructedPrompt = 2832, 4936
)

func traceOptions(path string) Options {
	o := Options{Config: Defaults()}
	o.Trace = path
	return o
}

func TestTraceCeilingByConstruction(t *testing.T) {
	o := traceOptions(writeTrace(t, constructed...))
	h, err := o.plan()
	if err != nil {
		t.Fatal(err)
	}
	tp := h.trace
	if tp.PromptTokens != int64(constructedPrompt) || tp.Requests != len(constructed) || tp.Format != trace.FormatMooncake {
		t.Fatalf("trace info %+v", tp)
	}
	if want := ratio(int64(constructedHit), int64(constructedPrompt)); tp.Ceiling != want {
		t.Fatalf("ceiling %v, want %v", tp.Ceiling, want)
	}
	_, hits := ceiling(h.w.Requests)
	if hits != int64(constructedHit) {
		t.Fatalf("ceiling hits %d, want %d", hits, constructedHit)
	}
	got, _ := ceiling(h.w.Requests)
	if !slices.Equal(got, constructedHits) {
		t.Fatalf("hits per request %v, want %v", got, constructedHits)
	}
	// The prompts are the blocks' tokens cut at input_length: equal ids,
	// equal tokens.
	r0 := h.w.Requests[0].appendTokens(nil, 1536)
	r2 := h.w.Requests[2].appendTokens(nil, 1300)
	r1 := h.w.Requests[1].appendTokens(nil, 1400)
	if !slices.Equal(r0[:1300], r2) || !slices.Equal(r0[:1024], r1[:1024]) || slices.Equal(r0[1024:1100], r1[1024:1100]) {
		t.Fatal("the tokens do not follow the block ids")
	}
}

// TestTraceSinglePodUnlimitedReachesTheCeiling: one pod that never
// evicts is the unlimited cache, so every router serves exactly the
// ceiling, through the real engines' hashing and (precise) kvindex.
func TestTraceSinglePodUnlimitedReachesTheCeiling(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lines []string
		limit int
	}{
		{"constructed", constructed, 0},
		{"conversations", nil, 300},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := shippedTrace
			if tc.lines != nil {
				path = writeTrace(t, tc.lines...)
			}
			o := traceOptions(path)
			o.Pods, o.TraceRequests = 1, tc.limit
			p, err := o.plan()
			if err != nil {
				t.Fatal(err)
			}
			o.Capacity = unlimitedCapacity(p.w)
			rep, err := Run(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Trace == nil || rep.Trace.Ceiling <= 0 {
				t.Fatalf("no ceiling: %+v", rep.Trace)
			}
			for _, r := range rep.rows() {
				if r.CachedFraction != rep.Trace.Ceiling || r.OfCeiling == nil || *r.OfCeiling != 1 {
					t.Errorf("%s: cached %v, want the ceiling %v", r.Name, r.CachedFraction, rep.Trace.Ceiling)
				}
			}
		})
	}
}

// TestTraceConversationsPreciseNearTheCeiling replays the shipped
// conversation trace at a tenth of its rate: precise routing keeps each
// conversation with its context, far above round-robin and, with room
// for everything, within a point or two of the ceiling.
func TestTraceConversationsPreciseNearTheCeiling(t *testing.T) {
	o := traceOptions(shippedTrace)
	o.Capacity, o.TimeScale, o.TraceRequests = 20_000, 10, 600
	o.Routers = []string{RouterRoundRobin, RouterPrecise}
	rep, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	ceil, p, rr := rep.Trace.Ceiling, rep.Router(RouterPrecise).CachedFraction, rep.Router(RouterRoundRobin).CachedFraction
	t.Logf("ceiling %.3f precise %.3f round-robin %.3f", ceil, p, rr)
	if p-rr < 0.2 {
		t.Errorf("precise %.3f is not far above round-robin %.3f", p, rr)
	}
	if ceil-p > 0.03 || p > ceil {
		t.Errorf("precise %.3f is not within 3 points under the ceiling %.3f", p, ceil)
	}
	if !slices.ContainsFunc(rep.Setup, func(s string) bool { return strings.Contains(s, "Mooncake format (detected)") }) {
		t.Errorf("setup does not name the format: %q", rep.Setup)
	}
}

// TestTraceKVIndexFormat replays a kvindex trace with sessions, text and
// token ids: a text prompt and the same prompt as token ids are one
// prefix, and the sessions bring the session-affinity row.
func TestTraceKVIndexFormat(t *testing.T) {
	tokPath := "../../tokenizer/testdata/qwen2.5/tokenizer.json.gz"
	tok, err := tokenizer.LoadFile(tokPath)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 20)
	ids := tok.Encode(text, true)
	idsJSON := strings.Trim(strings.Join(strings.Fields(fmt.Sprint(ids)), ", "), "[]")
	path := writeTrace(t,
		fmt.Sprintf(`{"timestamp": 0, "session_id": "a", "text": %q, "output_length": 10}`, text),
		fmt.Sprintf(`{"timestamp": 50, "session_id": "b", "token_ids": [%s], "output_length": 10}`, idsJSON),
		fmt.Sprintf(`{"timestamp": 60, "session_id": "a", "token_ids": [%s, 7, 8], "output_length": 10}`, idsJSON),
	)
	o := traceOptions(path)
	o.Tokenizer, o.Pods = tokPath, 2
	rep, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	full := len(ids) / engineBlockSize * engineBlockSize
	want := ratio(int64(2*full), int64(3*len(ids)+2))
	if rep.Trace.Format != trace.FormatKVIndex || rep.Trace.Sessions != 2 || rep.Trace.Ceiling != want {
		t.Fatalf("trace %+v, want kvindex format, 2 sessions, ceiling %v", rep.Trace, want)
	}
	if rep.Router(RouterSessionAffinity) == nil || rep.Router(PreciseNoLoad) == nil {
		t.Fatalf("rows %v lack session-affinity or precise(load=0)", rep.rows())
	}
	// Without a tokenizer the text line is refused, naming the flag.
	o.Tokenizer = ""
	_, err = Run(context.Background(), o)
	if got := asFlags(err); !strings.Contains(got, "line 1: a text prompt needs a tokenizer (--tokenizer)") {
		t.Fatalf("without a tokenizer: %s", got)
	}
}

// TestTraceSessionsChain checks that a session's requests are a
// conversation's turns (the next waits for the previous answer) and that
// requests without a session stand alone.
func TestTraceSessionsChain(t *testing.T) {
	path := writeTrace(t,
		`{"timestamp": 0, "session_id": "a", "token_ids": [1, 2], "output_length": 1}`,
		`{"timestamp": 1, "token_ids": [1], "output_length": 1}`,
		`{"timestamp": 2, "session_id": "a", "token_ids": [1, 2, 3], "output_length": 1}`,
		`{"timestamp": 3, "token_ids": [1], "output_length": 1}`,
	)
	o := traceOptions(path)
	p, err := o.plan()
	if err != nil {
		t.Fatal(err)
	}
	rs := p.w.Requests
	if rs[0].Conv != rs[2].Conv || rs[0].Next != 2 || rs[2].Prev != 0 || rs[2].Turn != 1 {
		t.Errorf("session a: %+v %+v", rs[0], rs[2])
	}
	if rs[1].Conv == rs[3].Conv || rs[1].Prev != -1 || rs[3].Prev != -1 {
		t.Errorf("requests without a session share a conversation: %+v %+v", rs[1], rs[3])
	}
}

// TestTracePrefixAndTimeScale checks --trace-requests, --trace-window and
// --time-scale.
func TestTracePrefixAndTimeScale(t *testing.T) {
	path := writeTrace(t, constructed...) // arrivals at 0, 100, ..., 400 ms
	for _, tc := range []struct {
		name     string
		set      func(*Options)
		requests int
		span     time.Duration
	}{
		{"all", func(*Options) {}, 5, 400 * time.Millisecond},
		{"first 3", func(o *Options) { o.TraceRequests = 3 }, 3, 200 * time.Millisecond},
		{"window", func(o *Options) { o.TraceWindow = 250 * time.Millisecond }, 3, 200 * time.Millisecond},
		{"both", func(o *Options) { o.TraceWindow, o.TraceRequests = 250*time.Millisecond, 2 }, 2, 100 * time.Millisecond},
		{"faster", func(o *Options) { o.TimeScale = 0.5 }, 5, 200 * time.Millisecond},
		{"slower", func(o *Options) { o.TimeScale = 3 }, 5, 1200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := traceOptions(path)
			tc.set(&o)
			p, err := o.plan()
			if err != nil {
				t.Fatal(err)
			}
			if len(p.w.Requests) != tc.requests || p.w.Span != tc.span || p.trace.Requests != tc.requests {
				t.Fatalf("%d requests over %v, want %d over %v", len(p.w.Requests), p.w.Span, tc.requests, tc.span)
			}
		})
	}
}

// TestTraceErrors checks that Run refuses a bad trace or setting with an
// error naming the flag and, for a bad line, the line.
func TestTraceErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lines []string
		set   func(*Options)
		want  string
	}{
		{"bad line", []string{constructed[0], constructed[1], `{"timestamp": 500, "input_length": 3, "output_length": 1}`}, nil, `: line 3: missing "hash_ids"`},
		{"unsorted", []string{constructed[1], constructed[0]}, nil, ": line 2: timestamp 0ms is before line 1's 100ms"},
		{"capacity", constructed, func(o *Options) { o.Capacity = 10 }, "--capacity 10 cannot hold the trace's largest request (97 blocks)"},
		{"block size", constructed, func(o *Options) { o.TraceBlock = 256 }, "line 1: 3 hash_ids of 256 tokens cannot make input_length 1536"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := traceOptions(writeTrace(t, tc.lines...))
			if tc.set != nil {
				tc.set(&o)
			}
			_, err := Run(context.Background(), o)
			if got := asFlags(err); !strings.Contains(got, tc.want) || !strings.HasPrefix(got, "--") {
				t.Fatalf("error %q, want one naming its flag and containing %q", got, tc.want)
			}
		})
	}
	o := traceOptions(filepath.Join(t.TempDir(), "missing.jsonl"))
	if _, err := Run(context.Background(), o); !strings.HasPrefix(asFlags(err), "--trace: open ") {
		t.Fatalf("missing file: %v", asFlags(err))
	}
}

// unlimitedCapacity is a capacity, in blocks, under which an engine that
// serves the whole workload never evicts: every distinct block of the
// prompts, plus the blocks each request's output can add.
func unlimitedCapacity(w *Workload) int {
	distinct := map[uint64]bool{}
	n := 0
	for i := range w.Requests {
		r := &w.Requests[i]
		for _, k := range r.Keys {
			distinct[k] = true
		}
		n += r.Output()/engineBlockSize + 2
	}
	return n + len(distinct)
}
