package sim

import (
	"slices"
	"strings"
	"testing"
)

func testWorkload(t *testing.T, seed uint64, text bool) *workload {
	t.Helper()
	o := DefaultOptions()
	o.Seed, o.Sessions, o.Turns = seed, 3, 4
	w, err := newWorkload(&o, 5, text)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// The workload is a function of the seed: conversations share the system
// prompt, each resends its growing context every turn and stays on its
// engine, and text prompts are single lines that grow as their ids do.
func TestWorkload(t *testing.T) {
	for _, tc := range []struct {
		name string
		text bool
	}{{"token ids", false}, {"text", true}} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := testWorkload(t, 7, tc.text), testWorkload(t, 7, tc.text)
			last := map[int]request{}
			var system []uint64
			for i := range 40 {
				ra, rb := a.next(), b.next()
				if ra.Conv != rb.Conv || ra.Turn != rb.Turn || ra.target != rb.target || ra.text != rb.text || !slices.Equal(ra.Prompt, rb.Prompt) {
					t.Fatalf("request %d differs between two workloads of one seed", i)
				}
				if ra.target < 0 || ra.target >= 5 || ra.Turn >= 4 {
					t.Fatalf("request %d: target %d, turn %d", i, ra.target, ra.Turn)
				}
				if system == nil {
					system = ra.Prompt[:systemTokens]
				}
				if !slices.Equal(ra.Prompt[:systemTokens], system) {
					t.Fatalf("request %d does not start with the system prompt", i)
				}
				if tc.text != (ra.text != "") || strings.ContainsAny(ra.text, "\n\r") ||
					tc.text && !strings.HasPrefix(ra.text, promptText(system)+" ") {
					t.Fatalf("request %d: %.80q...", i, ra.text)
				}
				// A conversation's next turn resends its previous prompt
				// and stays on its engine.
				if prev, ok := last[ra.Conv]; ok {
					grew := len(ra.Prompt) > len(prev.Prompt) && slices.Equal(ra.Prompt[:len(prev.Prompt)], prev.Prompt) &&
						len(ra.text) >= len(prev.text) && strings.HasPrefix(ra.text, prev.text)
					if ra.target != prev.target || ra.Turn != prev.Turn+1 || !grew {
						t.Fatalf("request %d does not continue conversation %d", i, ra.Conv)
					}
				} else if ra.Turn != 0 {
					t.Fatalf("request %d opens conversation %d at turn %d", i, ra.Conv, ra.Turn)
				}
				last[ra.Conv] = ra
			}
			if len(last) < 4 {
				t.Errorf("only %d conversations in 40 requests of 4 turns", len(last))
			}
			if slices.Equal(testWorkload(t, 8, tc.text).next().Prompt, testWorkload(t, 7, tc.text).next().Prompt) {
				t.Error("two seeds gave the same first prompt")
			}
		})
	}
}

// A prompt's text begins the text of any prompt extending it, word for
// word: a sentence's end and the capital after it depend on the ids
// before them only.
func TestPromptText(t *testing.T) {
	ids := testWorkload(t, 3, false).next().Prompt
	whole := promptText(ids)
	// A word per id, in sentences of a few words, the first capitalized.
	first := strings.TrimSuffix(strings.Fields(whole)[0], ".")
	if len(strings.Fields(whole)) != len(ids) || strings.Count(whole, ".") < len(ids)/16 ||
		!strings.EqualFold(first, words[ids[0]%uint64(len(words))]) || first[:1] != strings.ToUpper(first[:1]) {
		t.Fatalf("%d ids read as %.120q...", len(ids), whole)
	}
	for n := range len(ids) {
		if p := promptText(ids[:n]); !strings.HasPrefix(whole, p) || n > 0 && whole[len(p)] != ' ' {
			t.Fatalf("the text of the first %d ids does not begin the text of all %d", n, len(ids))
		}
	}
}
