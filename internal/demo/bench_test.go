package demo

import (
	"context"
	"testing"
	"time"
)

// BenchmarkRouters replays the small agents scenario against each router
// with fresh engines, and reports simulated requests per wall-clock
// second (engines, routing and, for precise, the whole event path).
func BenchmarkRouters(b *testing.B) {
	for _, name := range Routers {
		b.Run(name, func(b *testing.B) {
			o := small(ScenarioAgents, 1)
			o.Routers = []string{name}
			o.Parallel = 1
			var requests int
			start := time.Now()
			for range b.N {
				rep, err := Run(context.Background(), o)
				if err != nil {
					b.Fatal(err)
				}
				requests += rep.Requests
			}
			b.ReportMetric(float64(requests)/time.Since(start).Seconds(), "requests/s")
		})
	}
}
