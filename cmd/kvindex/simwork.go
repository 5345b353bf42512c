package main

import (
	"math/rand/v2"
	"strconv"
	"strings"
)

// simWorkload generates kvindex sim's requests: agent conversations that
// share one system prompt, each growing turn by turn by the previous answer
// and the next message, so that a conversation's next request resends its
// whole context. A conversation stays on the engine it started on (session
// affinity), so the index shows each conversation on one engine and the
// system prompt on every engine that started one. Everything is drawn from
// PRNG streams seeded by the seed: the same seed gives the same requests in
// the same order, and the arrival times do not change them.
//
// Prompts are text (single lines, so a log holds one per line) when the
// sim tokenizes, and token ids otherwise.
type simWorkload struct {
	text     bool
	rng      *rand.Rand
	targets  int // engines x ranks: where new conversations start
	turns    int
	vocab    int
	system   simPiece
	convs    []*simConv // the active conversations, one per slot
	nextConv int
}

// simPiece is a part of a prompt: text, or token ids without a tokenizer.
type simPiece struct {
	text string
	ids  []uint64
}

// simConv is one conversation: its context so far and its engine.
type simConv struct {
	id        int
	target    int
	turn      int // requests made
	turnsLeft int
	ctx       simPiece
}

// simRequest is one request: its conversation, engine and prompt.
type simRequest struct {
	conv, turn int
	target     int
	prompt     simPiece
}

// Token counts of the generated pieces, in words for text (a word of the
// list is one to two tokens) and in ids otherwise.
const (
	simMessageMin, simMessageMax = 20, 80  // a user message
	simAnswerMin, simAnswerMax   = 30, 150 // an answer, resent by the next turn
	simSystemIDs                 = 512     // the system prompt, without a tokenizer
)

func newSimWorkload(seed uint64, text bool, sessions, turns, targets, vocab int) *simWorkload {
	w := &simWorkload{
		text: text, rng: rand.New(rand.NewPCG(seed, 0x5157)), targets: targets, turns: turns, vocab: vocab,
		convs: make([]*simConv, sessions),
	}
	if text {
		w.system = simPiece{text: systemPrompt(w.rng)}
	} else {
		w.system = simPiece{ids: randomIDs(w.rng, nil, simSystemIDs, vocab)}
	}
	return w
}

// next returns the next request and records its answer in the
// conversation, for the turn after it.
func (w *simWorkload) next() simRequest {
	slot := w.rng.IntN(len(w.convs))
	c := w.convs[slot]
	if c == nil || c.turnsLeft == 0 {
		c = &simConv{id: w.nextConv, target: w.rng.IntN(w.targets), turnsLeft: w.turns}
		w.nextConv++
		c.ctx = w.system
		if !w.text {
			c.ctx.ids = append([]uint64(nil), w.system.ids...)
		}
		w.convs[slot] = c
	}
	w.add(&c.ctx, "User:", simMessageMin, simMessageMax)
	req := simRequest{conv: c.id, turn: c.turn, target: c.target, prompt: c.ctx}
	if !w.text {
		req.prompt.ids = c.ctx.ids[:len(c.ctx.ids):len(c.ctx.ids)] // later appends do not touch it
	}
	w.add(&c.ctx, "Assistant:", simAnswerMin, simAnswerMax)
	c.turn++
	c.turnsLeft--
	return req
}

// add appends a message of min..max words or ids to a context.
func (w *simWorkload) add(p *simPiece, role string, lo, hi int) {
	n := lo + w.rng.IntN(hi-lo+1)
	if !w.text {
		p.ids = randomIDs(w.rng, p.ids, n, w.vocab)
		return
	}
	p.text += " " + role + " " + sentences(w.rng, n)
}

func randomIDs(rng *rand.Rand, dst []uint64, n, vocab int) []uint64 {
	for range n {
		dst = append(dst, uint64(rng.IntN(vocab)))
	}
	return dst
}

// systemPrompt is the shared prefix of every conversation: instructions
// and tool descriptions, a few hundred tokens.
func systemPrompt(rng *rand.Rand) string {
	var b strings.Builder
	b.WriteString("You are a coding agent working in a large Go repository. Answer precisely, call a tool when you need a fact, and never invent file contents. Tools:")
	for _, tool := range simTools {
		b.WriteString(" " + tool + ": " + sentences(rng, 25+rng.IntN(15)))
	}
	return b.String()
}

var simTools = []string{
	"read_file(path)", "write_file(path, content)", "search(query)", "run_tests(package)",
	"list_dir(path)", "git_diff(ref)", "git_log(path, n)", "grep(pattern, path)", "build(target)", "lint(package)",
}

// sentences returns n words as sentences of 6 to 14 words.
func sentences(rng *rand.Rand, n int) string {
	var b strings.Builder
	for n > 0 {
		k := min(n, 6+rng.IntN(9))
		n -= k
		for i := range k {
			word := simWords[rng.IntN(len(simWords))]
			if i == 0 {
				word = strings.ToUpper(word[:1]) + word[1:]
				if b.Len() > 0 {
					b.WriteByte(' ')
				}
			} else {
				b.WriteByte(' ')
			}
			b.WriteString(word)
		}
		b.WriteByte('.')
		if rng.IntN(8) == 0 {
			b.WriteString(" See line " + strconv.Itoa(1+rng.IntN(900)) + ".")
		}
	}
	return b.String()
}

var simWords = strings.Fields(`the a an this that each every one two three cache block prefix request
engine router index pod replica token prompt event batch stream queue server client
test build file function method type value error result change commit branch merge
read write open close start stop send receive check compare measure count find fix
add remove update keep return call pass fail run wait retry hash chain model layer
memory budget latency throughput fast slow small large new old first last next
previous shared local remote warm cold hot full partial empty ready healthy stale
because when while after before until unless so but and or if then also only
should must can will would may might not never always often rarely again
config flag option default setting limit range port endpoint socket message
user agent tool answer question context history turn session conversation`)
