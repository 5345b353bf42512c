package client

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/api/kvindexv1"
)

// Text views of answers and events, as the CLI prints them, for programs
// that log them the same way.

// FormatTiers prints a match's blocks per storage medium
// (PodMatchJSON.Tiers) as "GPU:2 CPU:1", the most blocks first, ties by
// name; "-" for none.
func FormatTiers(tiers map[string]uint32) string {
	if len(tiers) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(tiers))
	for k := range tiers {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		return cmp.Or(cmp.Compare(tiers[b], tiers[a]), strings.Compare(a, b))
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + ":" + strconv.FormatUint(uint64(tiers[k]), 10)
	}
	return strings.Join(parts, " ")
}

// CachedFractionLines prints the engines' cached fraction over the
// server's window: a line for the fleet, overall then per model ("no
// queries" while the window saw none), and a line with each pod's own,
// e.g.
//
//	fleet cached fraction (last 1m0s): 91.3% (qwen: 91.3%)
//	engine cached fraction (same window): pod-a: 95.0%, pod-b: 87.4%
//
// "" when the answer has no fleet fraction (the server scrapes no
// engines).
func (p PodsJSON) CachedFractionLines() string {
	fleet := p.Fleet
	if len(fleet) == 0 {
		return ""
	}
	pct := func(f *float64) string {
		if f == nil {
			return "no queries"
		}
		return strconv.FormatFloat(*f*100, 'f', 1, 64) + "%"
	}
	var b strings.Builder
	window := time.Duration(fleet[0].WindowSeconds * float64(time.Second))
	fmt.Fprintf(&b, "fleet cached fraction (last %s):", window)
	var models []string
	overall := false
	for _, f := range fleet {
		if f.Model == "" {
			overall = true
			fmt.Fprintf(&b, " %s", pct(f.Fraction))
		} else {
			models = append(models, f.Model+": "+pct(f.Fraction))
		}
	}
	switch {
	case len(models) == 0:
	case overall:
		fmt.Fprintf(&b, " (%s)", strings.Join(models, ", "))
	default: // an answer for one model: that model's only
		fmt.Fprintf(&b, " %s", strings.Join(models, ", "))
	}
	b.WriteByte('\n')
	if len(p.PodCache) > 0 {
		ps := make([]string, len(p.PodCache))
		for i, pc := range p.PodCache {
			ps[i] = pc.Pod + ": " + pct(pc.Fraction)
		}
		fmt.Fprintf(&b, "engine cached fraction (same window): %s\n", strings.Join(ps, ", "))
	}
	return b.String()
}

// FormatLag prints an engine's ingest lag (PodInfoJSON.LastBatchLagSeconds):
// microseconds below a millisecond (a healthy local lag), milliseconds
// below a second, tenths below a minute.
func FormatLag(seconds float64) string {
	d := time.Duration(seconds * float64(time.Second))
	switch a := d.Abs(); {
	case a < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case a < time.Second:
		return d.Round(time.Millisecond).String()
	case a < time.Minute:
		return d.Round(time.Second / 10).String()
	}
	return d.Round(time.Second).String()
}

// TokenizerCheckLine prints the comparison of the server's local
// tokenizer with the engines' /tokenize, one form after the other, e.g.
//
//	local tokenizer vs the engines' /tokenize: completion match; chat mismatch (ids differ at 12: ...)
//
// "" when the server has no local tokenizer.
func (p PodsJSON) TokenizerCheckLine() string {
	if len(p.TokenizerChecks) == 0 {
		return ""
	}
	parts := make([]string, len(p.TokenizerChecks))
	for i, c := range p.TokenizerChecks {
		parts[i] = c.Form + " " + c.Verdict
		if c.Detail != "" && c.Verdict != "match" {
			parts[i] += " (" + c.Detail + ")"
		}
	}
	return "local tokenizer vs the engines' /tokenize: " + strings.Join(parts, "; ") + "\n"
}

// EventLine prints a streamed event as one line (newline included):
//
//	TIME ENGINE seq=N KIND n=HASHES first=HASH [parent=HASH] [tokens=N] [MEDIUM] [group=N] [lora=NAME]
//
// with TIME the local time kvindex applied it (15:04:05.000); a reset
// prints as "TIME ENGINE seq=N Reset reason=REASON model=MODEL".
func EventLine(ev *kvindexv1.WatchResponse) string {
	var b strings.Builder
	t := time.UnixMilli(ev.GetAppliedUnixMs())
	fmt.Fprintf(&b, "%s %s seq=%d ", t.Format("15:04:05.000"), EngineName(ev.GetPod(), ev.GetDpRank()), ev.GetSeq())
	switch ev.GetKind() {
	case kvindexv1.EventKind_EVENT_KIND_BLOCK_STORED:
		b.WriteString("BlockStored")
	case kvindexv1.EventKind_EVENT_KIND_BLOCK_REMOVED:
		b.WriteString("BlockRemoved")
	case kvindexv1.EventKind_EVENT_KIND_ALL_BLOCKS_CLEARED:
		b.WriteString("AllBlocksCleared")
	case kvindexv1.EventKind_EVENT_KIND_RESET:
		fmt.Fprintf(&b, "Reset reason=%s model=%s\n", ev.GetResetReason(), ev.GetModel())
		return b.String()
	default:
		b.WriteString(ev.GetKind().String())
	}
	if hs := ev.GetBlockHashes(); len(hs) > 0 {
		fmt.Fprintf(&b, " n=%d first=%d", len(hs), hs[0])
	}
	if ev.GetHasParent() {
		fmt.Fprintf(&b, " parent=%d", ev.GetParentHash())
	}
	if n := ev.GetNumTokens(); n > 0 {
		fmt.Fprintf(&b, " tokens=%d", n)
	}
	if m := ev.GetMedium(); m != "" {
		b.WriteString(" " + m)
	}
	if g := ev.GetGroupIdx(); g > 0 {
		fmt.Fprintf(&b, " group=%d", g)
	}
	if l := ev.GetLoraName(); l != "" {
		b.WriteString(" lora=" + l)
	}
	b.WriteByte('\n')
	return b.String()
}
