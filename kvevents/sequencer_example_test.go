package kvevents_test

import (
	"fmt"
	"time"

	"github.com/kvindex/kvindex/kvevents"
)

// printOutput prints what a Sequencer decides; a transport would apply
// batches to its Sink and send replay requests on its socket instead.
type printOutput struct{}

func (printOutput) Deliver(seq uint64, payload []byte) { fmt.Printf("deliver %d %s\n", seq, payload) }
func (printOutput) Reset(reason kvevents.ResetReason)  { fmt.Println("reset:", reason) }
func (printOutput) RequestReplay(from uint64) bool {
	fmt.Println("request replay from", from)
	return true
}
func (printOutput) CancelReplay()        { fmt.Println("cancel replay") }
func (printOutput) Note(n kvevents.Note) { fmt.Println("note:", n.Kind) }

// A Sequencer is fed what arrives and answers synchronously: here batch 1
// is lost on the live stream, so it asks for a replay from the last batch
// it delivered and holds the live batch 2; the replay's first reply is
// that batch again, which proves the engine is the same process; the
// replay then delivers 1 and 2, the held copy of 2 is dropped as a
// duplicate, and every batch is delivered once, in order. Time is a value
// the caller passes in, so tests need no clock.
func ExampleSequencer() {
	s := kvevents.NewSequencer(printOutput{}, kvevents.SequencerConfig{CanReplay: true, MaxHeld: 64, ReplayTimeout: time.Second})
	now := int64(0)
	s.Live(0, []byte("a"), now)
	s.Live(2, []byte("c"), now)     // 1 is missing
	s.Replayed(0, []byte("a"), now) // the same batch 0: the same process
	s.Replayed(1, []byte("b"), now)
	s.Replayed(2, []byte("c"), now)
	s.ReplayEnd(now)
	s.Live(3, []byte("d"), now)
	// Output:
	// deliver 0 a
	// note: gap
	// note: replay-start
	// request replay from 0
	// note: verified
	// deliver 1 b
	// deliver 2 c
	// note: replay-done
	// note: duplicate
	// deliver 3 d
}
