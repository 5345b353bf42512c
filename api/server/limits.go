package server

import (
	"time"

	"github.com/kvindex/kvindex/api/watchhub"
	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/internal/memlimit"
)

// Limits bound what clients can make the server hold: connections, time,
// concurrent streams, query tokens and watchers. Each has a default in
// DefaultLimits, which kvindex serve's flags take theirs from; a zero
// field takes its default. The defaults are written here, the watch
// bounds' in package watchhub, once each.
type Limits struct {
	// HTTPReadHeaderTimeout bounds reading a request's headers: a client
	// sending them byte by byte is cut off after it.
	HTTPReadHeaderTimeout time.Duration
	// HTTPReadTimeout bounds reading a whole request, body included.
	HTTPReadTimeout time.Duration
	// HTTPWriteTimeout bounds answering a request from the end of its
	// headers; it also caps /debug/pprof/profile's seconds. The HTTP API
	// has no streaming endpoint (Watch is gRPC).
	HTTPWriteTimeout time.Duration
	// HTTPIdleTimeout closes keep-alive connections idle this long.
	HTTPIdleTimeout time.Duration
	// HTTPMaxConns caps open HTTP connections; a connection beyond it
	// waits in the listen backlog until one closes (the timeouts above
	// make every connection close eventually).
	HTTPMaxConns int

	// GRPCMaxStreams caps concurrent streams (calls) per gRPC connection.
	GRPCMaxStreams uint32
	// GRPCMaxConnIdle sends GOAWAY to a gRPC connection without calls for
	// this long; clients reconnect transparently.
	GRPCMaxConnIdle time.Duration
	// GRPCKeepaliveTime is how often the server pings a quiet connection
	// to find dead peers (it closes one that does not answer within
	// GRPCKeepaliveTimeout).
	GRPCKeepaliveTime    time.Duration
	GRPCKeepaliveTimeout time.Duration
	// GRPCKeepaliveMinTime is the shortest ping interval a client may use;
	// a client pinging more often is disconnected (too_many_pings).
	GRPCKeepaliveMinTime time.Duration

	// MaxTokensInFlight caps the tokens of all queries being answered at
	// once (a text prompt counts its bytes, a hash its block's tokens); a
	// query that would exceed it is refused with ResourceExhausted (HTTP
	// 429). 0: TokensInFlightFactor x Config.MaxTokens.
	MaxTokensInFlight int64
	// MaxBodyBytesInFlight caps the bytes of HTTP request bodies being
	// read at once, across requests: a body whose reading would exceed it
	// is refused with HTTP 429, so that many large or endless bodies
	// cannot each be buffered up to the per-request limit at the same
	// time. Beyond it, small bodies have a reserve of their own
	// (inflight.BodyReserve), so that large ones cannot turn small queries
	// away. 0: BodyBytesInFlight without a budget.
	MaxBodyBytesInFlight int64

	// MetricsEngines caps the engine ranks /metrics gives series of their
	// own: with more, the engines that are not ok come first, then the
	// others by model, pod and rank, so that a fleet of thousands (or a
	// flood of fake topics) keeps /metrics small while the engines that
	// need attention stay visible; kvindex_engines counts them all by
	// health and kvindex_metrics_engines_omitted says how many were left
	// out.
	MetricsEngines int

	// Limits are the Watch bounds (MaxWatchers, WatchQueueEvents and
	// WatchQueueBytes, HubQueueBatches and HubQueueBytes), embedded so
	// that one Limits holds every bound of kvindex serve. They are the
	// hub's: Watch streams are held by Config.Hub, which must be built
	// with them (watchhub.New(sink, l.Limits)); the server reads none.
	watchhub.Limits
}

// TokensInFlightFactor sizes the default MaxTokensInFlight: this many
// queries of the largest size at once.
const TokensInFlightFactor = 4

// BodyBytesInFlight is the MaxBodyBytesInFlight of a server whose queries
// carry at most maxTokens tokens, in a process with memory budget budget
// (bytes, 0 for none): TokensInFlightFactor bodies of the largest size,
// or under a budget its share of request bodies (memlimit.BodyBytes),
// which still admits one body of the largest size.
func BodyBytesInFlight(maxTokens int, budget int64) int64 {
	largest := maxBodyBytes(maxTokens)
	return memlimit.BodyBytes(budget, largest, TokensInFlightFactor*largest)
}

// The read deadlines of DefaultLimits, also kvindex picker's
// (DefaultHTTPServer). A connection that hits one is closed and counted
// (kvindex_http_read_timeouts_total).
const (
	// DefaultHTTPReadHeaderTimeout: a request's headers are a few hundred
	// bytes that a client sends at once, so 5 s leaves a slow network
	// ample room, and a client trickling its headers holds a connection
	// slot no longer than that.
	DefaultHTTPReadHeaderTimeout = 5 * time.Second
	// DefaultHTTPReadTimeout bounds a whole request, body included: the
	// largest body (DefaultMaxTokens tokens as JSON, 22 MiB) arrives in
	// it at 1 MB/s, and a client trickling its body holds its slot, and
	// the bytes it buffered (MaxBodyBytesInFlight), no longer than that.
	DefaultHTTPReadTimeout = 30 * time.Second
)

// DefaultLimits are the Limits a zero field takes.
var DefaultLimits = Limits{
	HTTPReadHeaderTimeout: DefaultHTTPReadHeaderTimeout,
	HTTPReadTimeout:       DefaultHTTPReadTimeout,
	HTTPWriteTimeout:      60 * time.Second,
	HTTPIdleTimeout:       2 * time.Minute,
	HTTPMaxConns:          1024,
	MetricsEngines:        1000,

	GRPCMaxStreams:       1024,
	GRPCMaxConnIdle:      30 * time.Minute,
	GRPCKeepaliveTime:    time.Minute,
	GRPCKeepaliveTimeout: 20 * time.Second,
	GRPCKeepaliveMinTime: 10 * time.Second,

	Limits: watchhub.DefaultLimits,
}

// withDefaults fills l's zero fields; maxTokens is the query size bound
// (Config.MaxTokens) the tokens in flight default is sized from.
func (l Limits) withDefaults(maxTokens int) Limits {
	d := DefaultLimits
	or := func(v *time.Duration, def time.Duration) {
		if *v <= 0 {
			*v = def
		}
	}
	or(&l.HTTPReadHeaderTimeout, d.HTTPReadHeaderTimeout)
	or(&l.HTTPReadTimeout, d.HTTPReadTimeout)
	or(&l.HTTPWriteTimeout, d.HTTPWriteTimeout)
	or(&l.HTTPIdleTimeout, d.HTTPIdleTimeout)
	or(&l.GRPCMaxConnIdle, d.GRPCMaxConnIdle)
	or(&l.GRPCKeepaliveTime, d.GRPCKeepaliveTime)
	or(&l.GRPCKeepaliveTimeout, d.GRPCKeepaliveTimeout)
	or(&l.GRPCKeepaliveMinTime, d.GRPCKeepaliveMinTime)
	if l.HTTPMaxConns <= 0 {
		l.HTTPMaxConns = d.HTTPMaxConns
	}
	if l.MetricsEngines <= 0 {
		l.MetricsEngines = d.MetricsEngines
	}
	if l.GRPCMaxStreams == 0 {
		l.GRPCMaxStreams = d.GRPCMaxStreams
	}
	if l.MaxTokensInFlight <= 0 {
		l.MaxTokensInFlight = TokensInFlightFactor * int64(min(maxTokens, MaxMaxTokens))
	}
	if l.MaxBodyBytesInFlight <= 0 {
		l.MaxBodyBytesInFlight = BodyBytesInFlight(maxTokens, 0)
	}
	l.Limits = l.Limits.WithDefaults()
	return l
}

// The settings that the server's configuration errors name
// (configerr.Field): Config.MaxTokens and Limits.MaxTokensInFlight. A
// front end maps them to its own names (kvindex serve: its flags).
const (
	FieldMaxTokens         configerr.Field = "MaxTokens"
	FieldMaxTokensInFlight configerr.Field = "MaxTokensInFlight"
)

// Check refuses limits that cannot work together with the query size
// bound maxTokens (Config.MaxTokens); its error is a *configerr.Error.
func (l Limits) Check(maxTokens int) error {
	if l.MaxTokensInFlight < int64(maxTokens) {
		return configerr.New(FieldMaxTokensInFlight, "%v %d is below %v %d: a query of the largest size could never run",
			FieldMaxTokensInFlight, l.MaxTokensInFlight, FieldMaxTokens, maxTokens)
	}
	return nil
}
