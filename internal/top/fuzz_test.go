package top

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// Whatever page a metrics URL answers, top gives a frame or an error
// line, never a panic, and the frame fits the terminal.
func FuzzPageToFrame(f *testing.F) {
	f.Add("# TYPE kvindex_picker_index_fallbacks_total counter\nkvindex_picker_index_fallbacks_total{reason=\"timeout\"} 3\n", uint8(40), uint8(10))
	f.Add("kvindex_fleet_cached_fraction{model=\"\"} NaN\nkvindex_picker_observed_cached_fraction{model=\"m\"} +Inf\n", uint8(1), uint8(1))
	f.Add("kvindex_ingest_events_total{pod=\"\xff\xfe\",dp_rank=\"0\",model=\"m\"} -5\n", uint8(9), uint8(3))
	f.Fuzz(func(t *testing.T, page string, width, height uint8) {
		m, err := ParseMetrics(strings.NewReader(page))
		if err != nil {
			return
		}
		prev := fleetSample(0, 1)
		cur := fleetSample(time.Second, 2)
		cur.Serve.merge(m)
		cur.Pickers[0].Metrics.merge(m)
		lines := Render(Build(header, prev, cur), int(width), int(height))
		if height > 0 && len(lines) > int(height) {
			t.Errorf("%d lines for a height of %d", len(lines), height)
		}
		for _, l := range lines {
			if width > 0 && utf8.RuneCountInString(l) > int(width) {
				t.Errorf("line %q wider than %d", l, width)
			}
		}
	})
}
