package picker_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/kvindex/kvindex/picker"
)

// BenchmarkPick: 64 candidates, a 1,024-block prompt (16k tokens), each
// candidate holding part of it. "speculative" picks the same prompt every
// millisecond of simulated time, so every pick walks live speculative
// entries and the size limit keeps dropping old records: the worst case.
func BenchmarkPick(b *testing.B) {
	const pods, blocks = 64, 1024
	prompt := keys(blocks)
	cands := make([]picker.Candidate, pods)
	for i := range cands {
		name := "pod-" + strconv.Itoa(i)
		cands[i] = picker.Candidate{
			Pod: name, Endpoint: "10.0.0." + strconv.Itoa(i) + ":8000", InFlight: i % 4,
			Metrics: picker.Metrics{Waiting: i % 3, KVUsage: float64(i%10) / 10, ScrapedAt: t0},
			Prefix:  picker.Prefix{GPU: (i * 37) % blocks, CPU: i % 5},
		}
	}
	for _, bc := range []struct {
		name string
		ttl  time.Duration
	}{{"index-only", 0}, {"speculative", 2 * time.Second}} {
		b.Run(bc.name, func(b *testing.B) {
			cfg := picker.DefaultConfig()
			cfg.SpeculativeTTL = bc.ttl
			s, err := picker.New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			req := picker.Request{Keys: prompt, Session: "s"}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if _, err := s.Pick(t0.Add(time.Duration(i)*time.Millisecond), &req, cands); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}
