package top

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kvindex/kvindex/api/client"
)

// ellipsis marks text cut to fit.
const ellipsis = "…"

// A name column is cut to minKept runes (ellipsis included) before
// optional columns are dropped, and then down to minShrunk before whole
// lines are cut instead.
const minKept, minShrunk = 16, 8

// Render lays a Model out as lines of at most width runes (0: no limit)
// and at most height lines (0: no limit). It is a pure function of its
// arguments, so a frame can be checked against a golden file.
func Render(m Model, width, height int) []string {
	var lines []string
	title := fmt.Sprintf("kvindex top  %s  every %s  %s", m.Server, m.Interval, m.At.UTC().Format("2006-01-02 15:04:05 UTC"))
	if m.Interactive {
		title += "  (q quits)"
	}
	lines = append(lines, title)
	if m.PodsKnown {
		lines = append(lines, summary(m, width)...)
	}
	for _, e := range m.Errors {
		lines = append(lines, "! "+e)
	}
	if m.PodsKnown {
		lines = append(lines, "")
		if len(m.Engines) == 0 {
			lines = append(lines, "no engines")
		} else {
			lines = append(lines, engineTable(m.Engines, width)...)
		}
	}
	if len(m.Fractions) > 0 {
		rows := [][]string{}
		for _, f := range m.Fractions {
			name := f.Model
			if name == "" {
				name = "all models"
			}
			rows = append(rows, []string{name, pct(f.Engines), pct(f.Observed), pct(f.Predicted)})
		}
		lines = append(lines, "")
		lines = append(lines, table([]string{"CACHED FRACTION", "ENGINES", "PICKER OBSERVED", "PICKER PREDICTED"}, rows, []bool{false, true, true, true}, []int{0}, nil, width)...)
	}
	if len(m.Fallbacks) > 0 {
		rows := [][]string{}
		for _, f := range m.Fallbacks {
			rows = append(rows, []string{f.Reason, strconv.FormatFloat(f.Total, 'f', -1, 64), rate(f.PerSec), pct(f.ShareOfPick)})
		}
		lines = append(lines, "")
		lines = append(lines, table([]string{"PICKER FALLBACKS", "TOTAL", "PER S", "OF PICKS"}, rows, []bool{false, true, true, true}, []int{0}, nil, width)...)
	}
	for i, l := range lines {
		lines[i] = cut(l, width)
	}
	if height > 0 && len(lines) > height {
		more := len(lines) - height + 1
		lines = append(lines[:height-1], cut(fmt.Sprintf("%s %d more lines: enlarge the terminal", ellipsis, more), width))
	}
	return lines
}

// summary is the line under the title: the engines by health and the
// fleet's ingest figures, on two lines if one is too narrow.
func summary(m Model, width int) []string {
	var health []string
	for _, h := range m.Health {
		health = append(health, fmt.Sprintf("%d %s", h.N, h.State))
	}
	s := fmt.Sprintf("engines %d", len(m.Engines))
	if len(health) > 0 {
		s += ": " + strings.Join(health, ", ")
	}
	ingest := fmt.Sprintf("events/s %s   gaps %d   replays %d ok, %d failed", rate(m.EventsPerSec), m.Gaps, m.ReplaysOK, m.ReplaysFail)
	if one := s + "   " + ingest; width <= 0 || utf8.RuneCountInString(one) <= width {
		return []string{one}
	}
	return []string{s, ingest}
}

func engineTable(engines []Engine, width int) []string {
	rows := func(split bool) [][]string {
		rows := make([][]string, len(engines))
		for i, e := range engines {
			b := strconv.FormatUint(e.Blocks, 10)
			if split {
				b = blocks(e)
			}
			rows[i] = []string{e.Name, e.Model, e.Health, b, rate(e.EventsPerSec),
				strconv.FormatUint(e.Gaps, 10), fmt.Sprintf("%d/%d", e.ReplaysOK, e.ReplaysFailed), e.HashCheck, age(e), lag(e.Lag)}
		}
		return rows
	}
	header := []string{"ENGINE", "MODEL", "HEALTH", "BLOCKS", "EVENTS/S", "GAPS", "REPLAYS OK/FAILED", "HASH CHECK", "LAST EVENT", "LAG"}
	right := []bool{false, false, false, false, true, true, true, false, true, true}
	shrinkable := []int{0, 1}
	// Dropped first when the terminal is narrow: the replays and gaps
	// (their totals are on the summary line), then the model. Then the
	// blocks by medium give way to their total, before the last event's
	// age goes, then the lag (the health tells an engine gone quiet).
	drop := []int{6, 5, 1, 8, 9, 7, 3}
	r := rows(true)
	if width > 0 && !fits(header, r, shrinkable, drop[:3], width) {
		r = rows(false)
		right[3] = true
	}
	return table(header, r, right, shrinkable, drop, width)
}

// fits reports whether table would lay rows out within width with no
// more columns dropped than hidden.
func fits(header []string, rows [][]string, shrinkable, hidden []int, width int) bool {
	widths := columnWidths(header, rows)
	shown := make([]bool, len(header))
	for i := range shown {
		shown[i] = !slices.Contains(hidden, i)
	}
	return span(widths, shown, shrinkable, minKept) <= width
}

// columnWidths is, per column, the width of its widest cell.
func columnWidths(header []string, rows [][]string) []int {
	widths := make([]int, len(header))
	for _, r := range append([][]string{header}, rows...) {
		for i, c := range r {
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	return widths
}

// span is the width of the shown columns, two spaces apart, with the
// shrinkable ones cut to minName.
func span(widths []int, shown []bool, shrinkable []int, minName int) int {
	total := -2
	for i, w := range widths {
		if shown[i] {
			if slices.Contains(shrinkable, i) {
				w = min(w, minName)
			}
			total += w + 2
		}
	}
	return total
}

// blocks is an engine's BLOCKS cell: its blocks by medium ("GPU:120
// CPU:40"), or the total from a kvindex that does not split it.
func blocks(e Engine) string {
	if len(e.ByMedium) == 0 {
		return strconv.FormatUint(e.Blocks, 10)
	}
	parts := make([]string, len(e.ByMedium))
	for i, m := range e.ByMedium {
		parts[i] = m.Medium + ":" + strconv.FormatUint(m.Blocks, 10)
	}
	return strings.Join(parts, " ")
}

// table lays rows out under header in columns two spaces apart, each as
// wide as its widest cell. When that is wider than width (0: no limit),
// the columns of drop are left out, in that order, until the table fits
// with its shrinkable columns cut to minKept; then the shrinkable columns
// are cut, widest first, down to minShrunk, their cells ending in an
// ellipsis.
func table(header []string, rows [][]string, right []bool, shrinkable, drop []int, width int) []string {
	widths := columnWidths(header, rows)
	shown := make([]bool, len(header))
	for i := range shown {
		shown[i] = true
	}
	for _, i := range drop {
		if width <= 0 || span(widths, shown, shrinkable, minKept) <= width {
			break
		}
		shown[i] = false
	}
	for i := range widths {
		if !shown[i] {
			widths[i] = 0
		}
	}
	total := span(widths, shown, shrinkable, math.MaxInt)
	for width > 0 && total > width {
		widest := -1
		for _, i := range shrinkable {
			if widths[i] > minShrunk && (widest < 0 || widths[i] > widths[widest]) {
				widest = i
			}
		}
		if widest < 0 {
			break
		}
		// Cut the widest down to the next widest, or by what is needed.
		next := minShrunk
		for _, i := range shrinkable {
			if i != widest && widths[i] < widths[widest] {
				next = max(next, widths[i])
			}
		}
		cutBy := min(total-width, widths[widest]-next)
		if cutBy == 0 { // equal widths: cut one by one
			cutBy = 1
		}
		widths[widest] -= cutBy
		total -= cutBy
	}
	last := len(shown) - 1
	for !shown[last] {
		last--
	}
	var out []string
	for _, r := range append([][]string{header}, rows...) {
		var b strings.Builder
		for i, c := range r {
			if !shown[i] {
				continue
			}
			if b.Len() > 0 {
				b.WriteString("  ")
			}
			c = cut(c, widths[i])
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c))
			if right[i] {
				b.WriteString(pad + c)
			} else if i < last {
				b.WriteString(c + pad)
			} else {
				b.WriteString(c)
			}
		}
		out = append(out, b.String())
	}
	return out
}

// cut shortens s to at most n runes (0: no limit), ending in an ellipsis
// when anything was cut.
func cut(s string, n int) string {
	if n <= 0 || utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + ellipsis
}

func rate(n Num) string {
	if !n.OK {
		return "-"
	}
	return strconv.FormatFloat(n.V, 'f', 1, 64)
}

func pct(n Num) string {
	if !n.OK {
		return "-"
	}
	return strconv.FormatFloat(100*n.V, 'f', 1, 64) + "%"
}

// age prints how long ago an engine's last event was: "restored" if it
// sent none to this process but has entries from a snapshot, else "never"
// if it sent none.
func age(e Engine) string {
	switch {
	case e.LastEvent.OK:
	case e.Restored:
		return "restored"
	default:
		return "never"
	}
	d := time.Duration(e.LastEvent.V * float64(time.Second))
	if d < time.Minute {
		return d.Round(time.Second/10).String() + " ago"
	}
	return d.Round(time.Second).String() + " ago"
}

// lag prints an engine's ingest lag (client.FormatLag), "-" if unknown.
func lag(n Num) string {
	if !n.OK {
		return "-"
	}
	return client.FormatLag(n.V)
}
