package faultlab

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/internal/memlimit"
)

// Bounds of the awaited conditions: generous, since they only cost time
// when something is wrong (or, for recovery, when an engine never
// recovers, which is a finding, not a failure).
const (
	awaitBound   = 20 * time.Second // kvindex starting, engines warming up, catching up
	recoverBound = 5 * time.Second  // fault end -> every engine ok and every answer right
	pollEvery    = 20 * time.Millisecond
)

// Check prompts: the prompts of a group share their first prefixBlocks
// blocks, so engines hold overlapping prefixes of different depths; all
// of them (288 distinct blocks) exceed an engine's default capacity (160
// blocks), so traffic keeps evicting.
const (
	promptGroups    = 8
	promptsPerGroup = 8
	prefixBlocks    = 4
	tailBlocks      = 4
)

// checkPrompts is the fixed set of prompts every check asks about; the
// traffic is drawn from it (with random extensions), so the engines hold
// prefixes of them.
var checkPrompts = func() [][]uint64 {
	var out [][]uint64
	for g := range promptGroups {
		for p := range promptsPerGroup {
			toks := make([]uint64, 0, (prefixBlocks+tailBlocks)*blockSize+5)
			for i := range prefixBlocks * blockSize {
				toks = append(toks, uint64(1_000_000*(g+1)+i))
			}
			for i := range tailBlocks*blockSize + 5 {
				toks = append(toks, uint64(100_000_000+1_000_000*g+10_000*p+i))
			}
			out = append(out, toks)
		}
	}
	return out
}()

// checkKeys holds each check prompt's block keys, block 0 first.
var checkKeys = func() [][]uint64 {
	out := make([][]uint64, len(checkPrompts))
	for i, p := range checkPrompts {
		hs, err := hasher.Chain(nil, nil, 0, p, nil)
		if err != nil {
			panic(err)
		}
		for _, h := range hs {
			out[i] = append(out[i], h.Key)
		}
	}
	return out
}()

// traffic drives engines with requests drawn from a seeded RNG: a check
// prompt, cut at a random block or extended by random blocks.
type traffic struct {
	rng  *rand.Rand
	next uint64 // fresh token ids for extensions
}

func newTraffic(seed uint64) *traffic {
	return &traffic{rng: rand.New(rand.NewPCG(seed, 0x7aff1c)), next: 1 << 40}
}

// prompt returns the next request's tokens.
func (tr *traffic) prompt() []uint64 {
	p := checkPrompts[tr.rng.IntN(len(checkPrompts))]
	switch tr.rng.IntN(3) {
	case 0: // a prefix of it
		return p[:(1+tr.rng.IntN(prefixBlocks+tailBlocks))*blockSize]
	case 1: // the whole prompt
		return p
	}
	ext := slices.Clone(p)
	for range (1 + tr.rng.IntN(3)) * blockSize {
		ext = append(ext, tr.next)
		tr.next++
	}
	return ext
}

// run makes each engine process n requests, round robin.
func (tr *traffic) run(t *testing.T, engines []*engine, n int) {
	t.Helper()
	for range n {
		for _, e := range engines {
			if _, err := e.Process(tr.prompt(), nil); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// fresh returns a prompt of n blocks no other request shares.
func (tr *traffic) fresh(n int) []uint64 {
	toks := make([]uint64, n*blockSize)
	for i := range toks {
		toks[i] = tr.next
		tr.next++
	}
	return toks
}

// unique makes e publish a batch of blocks no other request shares.
func (tr *traffic) unique(t *testing.T, e *engine) {
	t.Helper()
	if _, err := e.Process(tr.fresh(1), nil); err != nil {
		t.Fatal(err)
	}
}

// podKey names an engine (every simulated engine is rank 0).
func podKey(pod string, rank uint32) string { return fmt.Sprintf("%s/%d", pod, rank) }

func listPods(t *testing.T, k *kvindexProc) map[string]*kvindexv1.PodInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), awaitBound)
	defer cancel()
	pods, err := k.c.ListPods(ctx, "")
	if err != nil {
		t.Fatalf("ListPods: %v", err)
	}
	out := make(map[string]*kvindexv1.PodInfo, len(pods))
	for _, p := range pods {
		out[podKey(p.GetPod(), p.GetDpRank())] = p
	}
	return out
}

const healthOK = kvindexv1.EngineHealth_ENGINE_HEALTH_OK

// caughtUp reports whether kvindex has applied e's last batch.
func caughtUp(p *kvindexv1.PodInfo, e *engine) bool {
	seq := e.Seq()
	return p != nil && seq > 0 && p.GetBatches() > 0 && p.GetLastSeq() == seq-1
}

// quiescent reports whether kvindex has caught up with every engine or
// reports it as not ok.
func quiescent(t *testing.T, k *kvindexProc, engines []*engine) bool {
	t.Helper()
	pods := listPods(t, k)
	for _, e := range engines {
		p := pods[podKey(e.name, 0)]
		if p == nil || (p.GetHealth() == healthOK && !caughtUp(p, e)) {
			return false
		}
	}
	return true
}

// quiesce waits (bounded) for a quiescent point; traffic must be stopped.
// It returns whether one came within the bound.
func quiesce(t *testing.T, k *kvindexProc, engines []*engine) bool {
	t.Helper()
	for deadline := time.Now().Add(awaitBound); !quiescent(t, k, engines); {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pollEvery)
	}
	return true
}

// awaitOK waits until kvindex has caught up with every engine and reports
// it ok: the baseline every scenario starts from.
func awaitOK(t *testing.T, k *kvindexProc, engines []*engine) {
	t.Helper()
	deadline := time.Now().Add(awaitBound)
	for {
		pods := listPods(t, k)
		var behind []string
		for _, e := range engines {
			if p := pods[podKey(e.name, 0)]; p == nil || p.GetHealth() != healthOK || !caughtUp(p, e) {
				behind = append(behind, fmt.Sprintf("%s (engine seq %d): %v", e.name, e.Seq(), p))
				if len(behind) == 3 {
					break
				}
			}
		}
		if behind == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("baseline: kvindex is not caught up and ok with every engine: %s", strings.Join(behind, "; "))
		}
		time.Sleep(pollEvery)
	}
}

// tally counts answers compared with the engines' true caches.
type tally struct {
	checked, wrongOK, wrongFlagged int
	examples                       []string // the first few wrong-while-ok answers
}

func (a *tally) add(b tally) {
	a.checked += b.checked
	a.wrongOK += b.wrongOK
	a.wrongFlagged += b.wrongFlagged
	for _, ex := range b.examples {
		if len(a.examples) < 5 {
			a.examples = append(a.examples, ex)
		}
	}
}

// check asks kvindex for every check prompt and compares each engine's
// reported depth with its true one. Departed engines hold nothing: any
// depth kvindex reports for them is wrong.
func check(t *testing.T, k *kvindexProc, engines, departed []*engine) tally {
	t.Helper()
	pods := listPods(t, k)
	var out tally
	ctx, cancel := context.WithTimeout(context.Background(), awaitBound)
	defer cancel()
	for i, p := range checkPrompts {
		r, err := k.c.LongestPrefixTokens(ctx, model, p, nil)
		if err != nil {
			t.Fatalf("LongestPrefix: %v", err)
		}
		got := make(map[string]*kvindexv1.PodMatch, len(r.GetPods()))
		for _, m := range r.GetPods() {
			got[podKey(m.GetPod(), m.GetDpRank())] = m
		}
		compare := func(e *engine, truth int) {
			key := podKey(e.name, 0)
			depth, health := 0, kvindexv1.EngineHealth_ENGINE_HEALTH_DISCONNECTED
			if pi := pods[key]; pi != nil {
				health = pi.GetHealth()
			}
			if m := got[key]; m != nil {
				depth, health = int(m.GetMatchedBlocks()), m.GetHealth()
			}
			out.checked++
			switch {
			case depth == truth:
			case health == healthOK:
				out.wrongOK++
				if len(out.examples) < 5 {
					out.examples = append(out.examples, fmt.Sprintf("prompt %d: %s reported ok with %d blocks, holds %d", i, e.name, depth, truth))
				}
			default:
				out.wrongFlagged++
			}
		}
		for _, e := range engines {
			compare(e, e.LookupKeys(checkKeys[i]))
		}
		for _, e := range departed {
			compare(e, 0)
		}
	}
	return out
}

// allOK reports whether kvindex reports every engine ok.
func allOK(t *testing.T, k *kvindexProc, engines []*engine) bool {
	pods := listPods(t, k)
	for _, e := range engines {
		if p := pods[podKey(e.name, 0)]; p == nil || p.GetHealth() != healthOK {
			return false
		}
	}
	return true
}

// row is one line of the fault table.
type row struct {
	fault                          string
	checked, wrongOK, wrongFlagged int
	recovered                      string
	rss                            string
	note                           string
	skipped                        string // why the scenario could not run
}

var (
	tableMu sync.Mutex
	table   []row
	// tableOrder is the faults' order in the table, whatever order they
	// ran in.
	tableOrder []string
)

func record(r row) {
	tableMu.Lock()
	defer tableMu.Unlock()
	table = append(table, r)
}

func printTable(w io.Writer) {
	tableMu.Lock()
	defer tableMu.Unlock()
	slices.SortStableFunc(table, func(a, b row) int {
		return cmp.Compare(slices.Index(tableOrder, a.fault), slices.Index(tableOrder, b.fault))
	})
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "fault\tanswers checked\twrong while ok (must be 0)\twrong while flagged\ttime to recover\tpeak RSS vs budget\t")
	for _, r := range table {
		fault := r.fault
		if r.note != "" {
			fault += " (" + r.note + ")"
		}
		if r.skipped != "" {
			fmt.Fprintf(tw, "%s (skipped: %s)\t-\t-\t-\t-\t-\t\n", fault, r.skipped)
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t\n", fault, r.checked, r.wrongOK, r.wrongFlagged, r.recovered, r.rss)
	}
	tw.Flush()
}

func mib(b int64) string { return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20)) }

// skip records the scenario as skipped and skips it.
func skip(t *testing.T, why string) {
	t.Helper()
	record(row{fault: strings.TrimPrefix(t.Name(), "TestFaults/"), skipped: why})
	t.Skip(why)
}

// settle ends a scenario whose fault ended at faultEnd: it waits for a
// quiescent point, checks every answer, then measures the time until
// every engine is ok and every answer right (or "never" within
// recoverBound). It records the row and fails the test for any answer
// wrong for an ok engine, at the first quiescent point or a later one
// while recovering.
// departed engines hold nothing; budget is the --memory-budget (0: none).
func settle(t *testing.T, k *kvindexProc, faultEnd time.Time, engines, departed []*engine, budget int64) row {
	t.Helper()
	r, total := measure(t, k, faultEnd, engines, departed, budget)
	record(r)
	failWrongOK(t, total)
	return r
}

// failWrongOK fails the test for any answer wrong for an ok engine.
func failWrongOK(t *testing.T, total tally) {
	t.Helper()
	if total.wrongOK > 0 {
		t.Errorf("%d of %d answers wrong for an engine reported ok, e.g.\n  %s", total.wrongOK, total.checked, strings.Join(total.examples, "\n  "))
	}
}

// measure is settle without recording the row or failing the test: for
// a scenario that settles several kvindex processes into one row.
func measure(t *testing.T, k *kvindexProc, faultEnd time.Time, engines, departed []*engine, budget int64) (row, tally) {
	t.Helper()
	r := row{fault: strings.TrimPrefix(t.Name(), "TestFaults/"), recovered: "never"}
	if !quiesce(t, k, engines) {
		r.note = "no quiescent point"
	}
	total := check(t, k, engines, departed)
	for cur, deadline := total, time.Now().Add(recoverBound); total.wrongOK == 0; {
		if cur.wrongOK+cur.wrongFlagged == 0 && allOK(t, k, engines) {
			r.recovered = time.Since(faultEnd).Round(time.Millisecond).String()
			break
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
		if !quiescent(t, k, engines) {
			continue // answers are compared at quiescent points only
		}
		if cur = check(t, k, engines, departed); cur.wrongOK > 0 {
			total.add(cur)
		}
	}
	if r.recovered == "never" && total.wrongOK == 0 && !quiescent(t, k, engines) {
		// An engine reported ok has stayed behind for the whole bound
		// with no traffic: it will not catch up, so its answers count.
		r.note = "ok but behind"
		if cur := check(t, k, engines, departed); cur.wrongOK > 0 {
			total.add(cur)
		}
	}
	r.checked, r.wrongOK, r.wrongFlagged = total.checked, total.wrongOK, total.wrongFlagged
	rss := k.readPeakRSS()
	if budget > 0 {
		r.rss = fmt.Sprintf("%s / %s (limit %s)", mib(rss), mib(budget), mib(memlimit.ProcessBound(budget)))
	} else {
		r.rss = mib(rss) + " / unlimited"
	}
	return r, total
}
