package sim

import (
	"math/rand/v2"
	"strings"
	"time"

	"github.com/kvindex/kvindex/internal/demo"
)

// workload is the sim's requests: the demo's agent conversations, sized
// for a terminal, each conversation on one engine rank. Everything is
// drawn from the seed, so the same seed gives the same requests in the
// same order; the arrival rate only spaces them.
type workload struct {
	gen     *demo.Generator
	seed    uint64
	targets int  // engine ranks a conversation may start on
	text    bool // render the prompts as text
}

// request is one request of the workload.
type request struct {
	demo.Request
	target int    // the engine rank it goes to
	text   string // its prompt as text, in text mode
}

// Token counts of the workload's pieces; a word of text is about one
// token, so text prompts are as long.
const (
	systemTokens           = 512     // the system prompt all conversations share
	messageMin, messageMax = 20, 80  // a user message, the first one included
	answerMin, answerMax   = 30, 150 // an answer, resent by the next turn
)

// streamTargets seeds, with the seed, the draw of conversations' engines.
const streamTargets uint64 = 0x7a29_7a29_7a29_7a29

func newWorkload(o *Options, targets int, text bool) (*workload, error) {
	c := demo.DefaultWorkload(demo.ScenarioAgents)
	c.Seed, c.Conversations, c.Turns, c.Rate = o.Seed, o.Sessions, o.Turns, o.Rate
	c.SharedTokens = systemTokens
	c.HistoryMin, c.HistoryMax = messageMin, messageMax
	c.MessageMin, c.MessageMax = messageMin, messageMax
	c.OutputMin, c.OutputMax = answerMin, answerMax
	c.ZipfS = 0    // any active conversation as likely to go next
	c.ForkProb = 0 // every conversation makes Turns requests
	// The engines answer at once, so a conversation is never busy when
	// its next turn comes.
	gen, err := demo.NewGenerator(c, func(int, int) time.Duration { return 0 })
	if err != nil {
		return nil, err
	}
	return &workload{gen: gen, seed: o.Seed, targets: targets, text: text}, nil
}

// next returns the next request.
func (w *workload) next() request {
	r := request{Request: w.gen.Next()}
	// A conversation's engine is drawn from its id alone, so it needs no
	// memory of the conversations that ended.
	r.target = rand.New(rand.NewPCG(w.seed^streamTargets, uint64(r.Conv))).IntN(w.targets)
	if w.text {
		r.text = promptText(r.Prompt)
	}
	return r
}

// promptText writes token ids as a line of text, one word per id, in
// sentences. A word and what follows it depend on its id and the one
// before only, so the text of a prompt begins the text of every prompt
// that extends it: a conversation's text grows as its ids do, and its
// leading tokens stay the same turn after turn, as an engine's prefix
// cache needs.
func promptText(ids []uint64) string {
	var b strings.Builder
	n := uint64(len(words))
	capital := true
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(' ')
		}
		w := words[id%n]
		if capital {
			b.WriteString(strings.ToUpper(w[:1]))
			w = w[1:]
		}
		b.WriteString(w)
		// About one word in eight ends a sentence.
		if capital = id/n%8 == 0; capital {
			b.WriteByte('.')
		}
	}
	return b.String()
}

// words are what the ids read as.
var words = strings.Fields(`the a an this that each every one two three cache block prefix request
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
