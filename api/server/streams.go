package server

import (
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents"
)

// StreamSource reports the subscriber's per-stream ingest counters;
// *zmqtransport.Subscriber implements it. The returned slice belongs to the
// caller.
type StreamSource interface {
	Streams() []kvevents.StreamStats
}

// ListenerSource is implemented by sources that may have a bind-mode
// listen socket (*zmqtransport.Subscriber); its counters are exported as
// metrics.
type ListenerSource interface {
	ListenerStats() (kvevents.ListenerStats, bool)
}

// streamHealth maps a stream's state to the API's health: a stream
// kvindex cannot hear is DISCONNECTED whatever it held; otherwise the
// sequencer's kvevents.Health, whose doc says what each state means.
func streamHealth(st *kvevents.StreamStats) kvindexv1.EngineHealth {
	if !st.Connected {
		return kvindexv1.EngineHealth_ENGINE_HEALTH_DISCONNECTED
	}
	return apiHealth(st.Health)
}

// withEviction is an engine's health once the index's own state is known:
// an OK stream whose entries budget eviction thinned (evicted: see
// indexer.EngineInfo.Evicted) is PARTIAL, its matches lower bounds; a
// worse stream state says more and stays.
func withEviction(h kvindexv1.EngineHealth, evicted bool) kvindexv1.EngineHealth {
	if h == kvindexv1.EngineHealth_ENGINE_HEALTH_OK && evicted {
		return kvindexv1.EngineHealth_ENGINE_HEALTH_PARTIAL
	}
	return h
}

// evictedOf lists the engines whose entries budget eviction thinned (nil
// when none: the common case costs one pass over the engines).
func evictedOf(engines []indexer.EngineInfo) map[kvevents.EngineID]uint64 {
	var m map[kvevents.EngineID]uint64
	for _, e := range engines {
		if e.Evicted != 0 {
			if m == nil {
				m = make(map[kvevents.EngineID]uint64)
			}
			m[e.Engine] = e.Evicted
		}
	}
	return m
}

// apiHealth maps a kvevents.Health to the API's enum; an unknown value
// (a state added to kvevents and not here) is reported as DEGRADED, the
// worst state that still says the engine is heard.
func apiHealth(h kvevents.Health) kvindexv1.EngineHealth {
	switch h {
	case kvevents.HealthOK:
		return kvindexv1.EngineHealth_ENGINE_HEALTH_OK
	case kvevents.HealthRestored:
		return kvindexv1.EngineHealth_ENGINE_HEALTH_RESTORED
	case kvevents.HealthUnconfirmed:
		return kvindexv1.EngineHealth_ENGINE_HEALTH_UNCONFIRMED
	}
	return kvindexv1.EngineHealth_ENGINE_HEALTH_DEGRADED
}
