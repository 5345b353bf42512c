package indexer

import (
	"testing"

	"github.com/kvindex/kvindex/kvevents"
)

// TestApplyVerdict: the index accepts a batch when it has events and none
// is refused; a removal of a block it does not hold is no refusal.
func TestApplyVerdict(t *testing.T) {
	malformed := stored(1)
	malformed.BlockSize = 0
	for _, tt := range []struct {
		name   string
		events []kvevents.Event
		want   bool
	}{
		{"stores", []kvevents.Event{stored(1, 2)}, true},
		{"stores and removes", []kvevents.Event{stored(1, 2), removed(2)}, true},
		{"removal of an unknown block", []kvevents.Event{removed(9)}, true},
		{"cleared", []kvevents.Event{{Kind: kvevents.AllBlocksCleared}}, true},
		{"no events", nil, false},
		{"a malformed store", []kvevents.Event{stored(1), malformed}, false},
		{"a store without hashes", []kvevents.Event{stored()}, false},
		{"an unknown kind", []kvevents.Event{{Kind: kvevents.Kind(99), Hashes: []uint64{1}}}, false},
	} {
		ix := mustNew(t, Options{})
		if got := ix.ApplyVerdict(eng("pod", 0), 0, tt.events); got != tt.want {
			t.Errorf("%s: accepted %v, want %v", tt.name, got, tt.want)
		}
	}
}
