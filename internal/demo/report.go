package demo

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// WriteJSON writes the report's JSON contract, indented.
func WriteJSON(w io.Writer, rep *Report) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// WriteTable writes the run's setup and one row per router.
func WriteTable(w io.Writer, rep *Report) error {
	var b strings.Builder
	if rep.Trace != nil {
		fmt.Fprintf(&b, "kvindex demo: trace %s, %d pods, seed %d\n", rep.Trace.File, rep.Pods, rep.Seed)
	} else {
		fmt.Fprintf(&b, "kvindex demo: scenario %s, %d pods, seed %d\n", rep.Scenario, rep.Pods, rep.Seed)
	}
	for _, s := range rep.Setup {
		fmt.Fprintf(&b, "  %s\n", s)
	}
	b.WriteByte('\n')
	head := []string{"router", "cached", "prefill tokens", "TTFT p50", "TTFT p90", "imbalance", "engine hit"}
	if rep.Trace != nil {
		head = slices.Insert(head, 2, "of ceiling")
	}
	table := [][]string{head}
	for _, r := range rep.rows() {
		row := []string{r.Name, pct(r.CachedFraction), commas(int(r.PrefillTokens)),
			msText(r.TTFTP50), msText(r.TTFTP90), strconv.FormatFloat(r.Imbalance, 'f', 2, 64), pct(r.EngineHitRate)}
		if rep.Trace != nil {
			share := "-"
			if r.OfCeiling != nil {
				share = pct(*r.OfCeiling)
			}
			row = slices.Insert(row, 2, share)
		}
		table = append(table, row)
	}
	width := make([]int, len(head))
	for _, row := range table {
		for i, c := range row {
			width[i] = max(width[i], len(c))
		}
	}
	for _, row := range table {
		for i, c := range row {
			if i == 0 {
				fmt.Fprintf(&b, "%-*s", width[i], c) // names left, numbers right
			} else {
				fmt.Fprintf(&b, "  %*s", width[i], c)
			}
		}
		b.WriteByte('\n')
	}
	if s := summary(rep); s != "" {
		b.WriteString("\n" + s + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// summary states the headline comparison in one or two sentences.
func summary(rep *Report) string {
	p, rr, o := rep.Router(RouterPrecise), rep.Router(RouterRoundRobin), rep.Router(RouterOracle)
	if p == nil || rr == nil {
		return ""
	}
	s := fmt.Sprintf("precise served %s of prompt tokens from cache (round-robin: %s), computing %s fewer prefill tokens; TTFT p90 %s vs %s.",
		pct(p.CachedFraction), pct(rr.CachedFraction), commas(int(rr.PrefillTokens-p.PrefillTokens)), msText(p.TTFTP90), msText(rr.TTFTP90))
	if o != nil {
		s += fmt.Sprintf(" The oracle, the same policy on the engines' true state, served %s.", pct(o.CachedFraction))
	}
	if rep.Trace != nil && p.OfCeiling != nil {
		s += fmt.Sprintf(" One unlimited cache would serve %s: precise reaches %s of that ceiling, round-robin %s.",
			pct(rep.Trace.Ceiling), pct(*p.OfCeiling), pct(*rr.OfCeiling))
	}
	return s
}

func pct(f float64) string { return strconv.FormatFloat(100*f, 'f', 1, 64) + "%" }

func msText(ms float64) string {
	if ms >= 10_000 {
		return strconv.FormatFloat(ms/1000, 'f', 1, 64) + " s"
	}
	return commas(int(math.Round(ms))) + " ms"
}

// commas formats n with thousands separators.
func commas(n int) string {
	s := strconv.Itoa(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// kTokens formats a token or block count compactly: 980, 13.6k, 218k, 1.2M.
func kTokens(x float64) string {
	switch {
	case x >= 1e6:
		return strconv.FormatFloat(x/1e6, 'f', 1, 64) + "M"
	case x >= 100e3:
		return strconv.FormatFloat(x/1e3, 'f', 0, 64) + "k"
	case x >= 1e3:
		return strconv.FormatFloat(x/1e3, 'f', 1, 64) + "k"
	}
	return strconv.FormatFloat(x, 'f', 0, 64)
}

// routerColor gives each router a fixed colour in the charts.
var routerColor = map[string]string{
	RouterRoundRobin:     "#9e9e9e",
	RouterLeastLoaded:    "#bcaaa4",
	RouterConsistentHash: "#f4a261",
	RouterApproximate:    "#8ab17d",
	RouterPrecise:        "#2a6fdb",
	RouterOracle:         "#264653",
	PreciseNoLoad:        "#e76f51",
}

func colorOf(name string) string {
	if c, ok := routerColor[name]; ok {
		return c
	}
	return "#555555"
}

// WriteSVG draws three charts: cached fraction per router, TTFT p90 per
// router, and the cached fraction over the run per router.
func WriteSVG(w io.Writer, rep *Report) error {
	rows := rep.rows()
	const width, barH, gap, left = 900, 22, 8, 150
	panelH := len(rows)*(barH+gap) + 50
	lineH := 300
	height := 2*panelH + lineH + 40
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="system-ui, sans-serif" font-size="13">`+"\n",
		width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)

	bars := func(y0 int, title string, value func(RouterResult) float64, label func(RouterResult) string, maxV float64) {
		fmt.Fprintf(&b, `<text x="10" y="%d" font-size="15" font-weight="bold">%s</text>`+"\n", y0+18, html.EscapeString(title))
		span := float64(width - left - 120)
		for i, r := range rows {
			y := y0 + 34 + i*(barH+gap)
			v := value(r)
			bw := 0.0
			if maxV > 0 {
				bw = span * v / maxV
			}
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", left-8, y+barH-6, html.EscapeString(r.Name))
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", left, y, bw, barH, colorOf(r.Name))
			fmt.Fprintf(&b, `<text x="%.1f" y="%d">%s</text>`+"\n", float64(left)+bw+6, y+barH-6, html.EscapeString(label(r)))
		}
	}
	bars(0, fmt.Sprintf("Fleet cached-prefix fraction (%s, %d pods)", rep.Scenario, rep.Pods),
		func(r RouterResult) float64 { return r.CachedFraction },
		func(r RouterResult) string { return pct(r.CachedFraction) }, 1)
	maxTTFT := 0.0
	for _, r := range rows {
		maxTTFT = max(maxTTFT, r.TTFTP90)
	}
	bars(panelH, "Time to first token, p90 (simulated)",
		func(r RouterResult) float64 { return r.TTFTP90 },
		func(r RouterResult) string { return msText(r.TTFTP90) }, maxTTFT)

	// Line chart: cached fraction per window of requests.
	y0 := 2 * panelH
	fmt.Fprintf(&b, `<text x="10" y="%d" font-size="15" font-weight="bold">Cached fraction over the run (windows of requests, in arrival order)</text>`+"\n", y0+18)
	x0, x1 := float64(left-80), float64(width-170)
	top, bot := float64(y0+40), float64(y0+lineH)
	for _, v := range []float64{0, 0.25, 0.5, 0.75, 1} {
		y := bot - (bot-top)*v
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e0e0e0"/>`+"\n", x0, y, x1, y)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" fill="#666">%.0f%%</text>`+"\n", x0-6, y+4, v*100)
	}
	for _, m := range rep.marks {
		x := x0 + (x1-x0)*float64(m.request)/float64(max(rep.Requests, 1))
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#888" stroke-dasharray="4 3"/>`+"\n", x, top-8, x, bot)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#555" font-size="11">%s</text>`+"\n", x+4, top-10, html.EscapeString(m.label))
	}
	for i, r := range rows {
		n := len(r.Timeline)
		if n == 0 {
			continue
		}
		var pts strings.Builder
		for j, v := range r.Timeline {
			x := x0 + (x1-x0)*(float64(j)+0.5)/float64(n)
			y := bot - (bot-top)*v
			fmt.Fprintf(&pts, "%.1f,%.1f ", x, y)
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2.5" points="%s"/>`+"\n", colorOf(r.Name), strings.TrimSpace(pts.String()))
		ly := top + float64(i)*20
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="3"/>`+"\n", x1+15, ly, x1+35, ly, colorOf(r.Name))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", x1+42, ly+4, html.EscapeString(r.Name))
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#666">requests 1..%d</text>`+"\n", (x0+x1)/2, bot+22, rep.Requests)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteHTML writes a self-contained page: setup, table, charts and the
// explanation of each router.
func WriteHTML(w io.Writer, rep *Report) error {
	var svg, table strings.Builder
	if err := WriteSVG(&svg, rep); err != nil {
		return err
	}
	if err := WriteTable(&table, rep); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>kvindex demo: %s</title>\n", html.EscapeString(rep.Scenario))
	b.WriteString("<style>body{font-family:system-ui,sans-serif;max-width:960px;margin:2em auto;color:#222}pre{background:#f6f6f6;padding:1em;overflow-x:auto}li{margin-top:.6em}</style></head><body>\n")
	fmt.Fprintf(&b, "<h1>kvindex demo: %s</h1>\n", html.EscapeString(rep.Scenario))
	b.WriteString("<p>The fleet-wide cached-prefix fraction is the share of the prompt tokens every request carried that its engine served from cache after routing. Every router replays the same requests against fresh simulated engines.</p>\n")
	fmt.Fprintf(&b, "<pre>%s</pre>\n", html.EscapeString(table.String()))
	b.WriteString(svg.String())
	b.WriteString("<h2>Why each router lands where it does</h2>\n<ul>\n")
	rows := rep.rows()
	for _, r := range rows {
		if d := routerDoc(r.Name); d != nil {
			text := d.text()
			if rep.Scenario == ScenarioGateways && d.Gateways != "" {
				text += fmt.Sprintf(" With %d gateway replicas: %s", GatewayReplicas, d.Gateways)
			}
			fmt.Fprintf(&b, "<li><b>%s</b> %s</li>\n", html.EscapeString(r.Name), html.EscapeString(text))
		}
	}
	b.WriteString("</ul>\n</body></html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
