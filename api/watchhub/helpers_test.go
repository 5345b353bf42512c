package watchhub

import (
	"sync"

	"github.com/kvindex/kvindex/kvevents"
)

const testModel = "qwen"

func engine(pod string, rank int) kvevents.EngineID {
	return kvevents.EngineID{Model: testModel, Pod: pod, DPRank: rank}
}

// recordingSink records the calls a Hub forwards.
type recordingSink struct {
	mu     sync.Mutex
	calls  []string
	events int
	onCall func()
}

func (r *recordingSink) Apply(e kvevents.EngineID, seq uint64, evs []kvevents.Event) {
	r.mu.Lock()
	r.calls = append(r.calls, "apply "+e.String())
	r.events += len(evs)
	f := r.onCall
	r.mu.Unlock()
	if f != nil {
		f()
	}
}

func (r *recordingSink) Reset(e kvevents.EngineID, reason kvevents.ResetReason) {
	r.mu.Lock()
	r.calls = append(r.calls, "reset "+e.String()+" "+string(reason))
	r.mu.Unlock()
}

func (r *recordingSink) Health(e kvevents.EngineID, h kvevents.Health) {
	r.mu.Lock()
	r.calls = append(r.calls, "health "+e.String()+" "+h.String())
	r.mu.Unlock()
}
