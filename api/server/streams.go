package server

import (
	"github.com/kvindex/kvindex/api/kvindexv1"
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

// streamHealth maps a stream's state to the API's health.
func streamHealth(st *kvevents.StreamStats) kvindexv1.EngineHealth {
	switch {
	case !st.Connected:
		return kvindexv1.EngineHealth_ENGINE_HEALTH_DISCONNECTED
	case st.Health != kvevents.HealthOK:
		return kvindexv1.EngineHealth_ENGINE_HEALTH_DEGRADED
	}
	return kvindexv1.EngineHealth_ENGINE_HEALTH_OK
}
