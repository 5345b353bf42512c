package demo_test

import (
	"context"
	"fmt"
	"log"

	"github.com/kvindex/kvindex/internal/demo"
)

// ExampleRun compares round-robin with kvindex's precise routing on a
// tiny agent fleet: two pods, three conversations.
func ExampleRun() {
	cfg := demo.Defaults()
	cfg.Pods, cfg.Sessions, cfg.Turns, cfg.Requests = 2, 3, 4, 24
	rep, err := demo.Run(context.Background(), demo.Options{
		Config:  cfg,
		Routers: []string{demo.RouterRoundRobin, demo.RouterPrecise},
	})
	if err != nil {
		log.Fatal(err)
	}
	rr, precise := rep.Router(demo.RouterRoundRobin), rep.Router(demo.RouterPrecise)
	fmt.Println(rep.Scenario, rep.Pods, rep.Requests)
	fmt.Println("precise served more from cache:", precise.CachedFraction > rr.CachedFraction)
	fmt.Println("precise prefilled less:", precise.PrefillTokens < rr.PrefillTokens)
	// Output:
	// agents 2 24
	// precise served more from cache: true
	// precise prefilled less: true
}
