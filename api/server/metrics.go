package server

import (
	"cmp"
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/tokenizer"
)

// metrics are the server's Prometheus metrics. Request metrics are
// observed as requests finish; everything else (ingest counters, index
// size, verification, watchers) is read from its owner at scrape time, so
// the ingest path carries no metric updates of its own.
type metrics struct {
	s        *Server
	duration *prometheus.HistogramVec
	errors   *prometheus.CounterVec
	tokenize *prometheus.CounterVec

	observers sync.Map // "api/method" -> prometheus.Observer
}

// httpTokenizerStats is implemented by the engine /tokenize backend
// (*tokenizer.HTTP), whose request and cache counters are exported.
type httpTokenizerStats interface {
	Stats() tokenizer.HTTPStats
}

func newMetrics(s *Server, reg *prometheus.Registry) (*metrics, error) {
	m := &metrics{
		s: s,
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvindex_query_duration_seconds",
			Help: "Time to answer a query, by API (grpc, http) and method.",
			// 25 µs .. ~0.4 s: queries are expected well below a millisecond.
			Buckets: prometheus.ExponentialBuckets(25e-6, 2, 15),
		}, []string{"api", "method"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_query_errors_total",
			Help: "Queries that failed, by API, method and gRPC status code.",
		}, []string{"api", "method", "code"}),
		tokenize: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_tokenize_requests_total",
			Help: "Tokenizations by backend (engine, local) and result (ok, error).",
		}, []string{"source", "result"}),
	}
	for _, c := range []prometheus.Collector{
		m.duration, m.errors, m.tokenize, stateCollector{m},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) observer(api, method string) prometheus.Observer {
	key := api + "/" + method
	if o, ok := m.observers.Load(key); ok {
		return o.(prometheus.Observer)
	}
	o := m.duration.WithLabelValues(api, method)
	m.observers.Store(key, o)
	return o
}

// observe records one finished query.
func (m *metrics) observe(api, method string, start time.Time, err error) {
	m.observer(api, method).Observe(time.Since(start).Seconds())
	if err != nil {
		m.errors.WithLabelValues(api, method, status.Code(err).String()).Inc()
	}
}

func (m *metrics) observeTokenize(source string, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.tokenize.WithLabelValues(source, result).Inc()
}

// unaryInterceptor times the API's unary methods (not health checks).
func (m *metrics) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !strings.HasPrefix(info.FullMethod, "/kvindex.v1.") && !strings.HasPrefix(info.FullMethod, "/indexer.v1.") {
		return handler(ctx, req)
	}
	start := time.Now()
	resp, err := handler(ctx, req)
	m.observe("grpc", shortMethod(info.FullMethod), start, err)
	if err != nil && status.Code(err) == codes.Unknown {
		m.s.log.Warn("request failed without a status code", "method", info.FullMethod, "err", err)
	}
	return resp, err
}

// shortMethod turns "/kvindex.v1.IndexService/LongestPrefix" into
// "LongestPrefix".
func shortMethod(full string) string {
	for i := len(full) - 1; i >= 0; i-- {
		if full[i] == '/' {
			return full[i+1:]
		}
	}
	return full
}

var (
	engineLabels = []string{"pod", "dp_rank", "model"}

	descBatches       = newDesc("kvindex_ingest_batches_total", "Event batches applied.", engineLabels)
	descEvents        = newDesc("kvindex_ingest_events_total", "Events applied.", engineLabels)
	descDecodeErrors  = newDesc("kvindex_ingest_decode_errors_total", "Batches or frames dropped as undecodable.", engineLabels)
	descUnknownEvents = newDesc("kvindex_ingest_unknown_events_total", "Events skipped for an unknown tag.", engineLabels)
	descGaps          = newDesc("kvindex_ingest_gaps_total", "Sequence gaps detected on the live stream.", engineLabels)
	descLost          = newDesc("kvindex_ingest_lost_batches_total", "Batches lost for good (not replayed).", engineLabels)
	descReplays       = newDesc("kvindex_ingest_replays_total", "Replays of missed batches, by result (ok, failed).", append(engineLabels, "result"))
	descRestarts      = newDesc("kvindex_ingest_restarts_total", "Engine restarts detected (sequence went back, or a replay showed another process).", engineLabels)
	descVerified      = newDesc("kvindex_ingest_verified_total", "Replays that confirmed the engine is the process kvindex followed (after a reconnect, a gap or a restore).", engineLabels)
	descReplayRestart = newDesc("kvindex_ingest_replay_restarts_total", "Engine restarts found by a verifying replay (the engine had moved past its old sequence).", engineLabels)
	descResets        = newDesc("kvindex_ingest_resets_total", "Losses of an engine's state: restarts plus AllBlocksCleared.", engineLabels)
	descLastSeq       = newDesc("kvindex_ingest_last_seq", "Sequence number of the last applied batch.", engineLabels)
	descLastEvent     = newDesc("kvindex_ingest_last_event_timestamp_seconds", "When the last batch was applied (Unix time); 0 if never.", engineLabels)
	descLag           = newDesc("kvindex_ingest_lag_seconds", "Seconds between the engine stamping its last applied batch and kvindex applying it, by each side's clock (queueing, a slow consumer, a stream behind, plus clock skew; negative: the engine's clock is ahead). Absent until a stamped batch is applied.", engineLabels)
	descConnected     = newDesc("kvindex_ingest_connected", "1 if the engine's event socket is connected.", engineLabels)
	descDegraded      = newDesc("kvindex_ingest_degraded", "1 if batches were lost and not recovered: the engine's entries may be stale.", engineLabels)
	descHealth        = newDesc("kvindex_engine_health", "Stream health of the engine: 1 for the current state (ok, partial, restored, unconfirmed, degraded, disconnected); see kvindex.v1.EngineHealth.", append(engineLabels, "state"))

	listenerLabels     = []string{"endpoint"}
	descLsnPeers       = newDesc("kvindex_listener_peers", "Engines connected to the listen socket.", listenerLabels)
	descLsnMessages    = newDesc("kvindex_listener_messages_total", "Messages received on the listen socket.", listenerLabels)
	descLsnRejected    = newDesc("kvindex_listener_rejected_total", "Listen-socket messages not attributable to an engine, by reason (source: no engine allow rule lets the source address speak for the topic's pod).", append(listenerLabels, "reason"))
	descLsnRefused     = newDesc("kvindex_listener_refused_engines_total", "Engine ranks refused a stream because the listener had as many streams as it may hold.", listenerLabels)
	descLsnForgot      = newDesc("kvindex_listener_forgotten_engines_total", "Engine ranks forgotten, their entries dropped, by reason (departed: their connection gone for --forget-after; unproven: nothing they sent in their first seconds was accepted; displaced: silent longest when a newcomer needed their slot).", append(listenerLabels, "reason"))
	descLsnConnRef     = newDesc("kvindex_listener_refused_connections_total", "Connections to the listen socket refused, by reason (handshake: no engine allow rule names the source address; full: the listener had --max-engines connections from sources no exact rule names).", append(listenerLabels, "reason"))
	descEngineBlocks   = newDesc("kvindex_engine_blocks", "Blocks the engine holds in the index (all media and groups).", engineLabels)
	descEngineMedium   = newDesc("kvindex_engine_blocks_by_medium", "Blocks the engine holds in the index in one storage medium (GPU, CPU, a disk tier), all groups; the media it holds blocks in add up to kvindex_engine_blocks.", append(engineLabels, "medium"))
	descHashCheck      = newDesc("kvindex_engine_hash_check", "Hash verification state of the engine: 1 for the current state (verified, mismatch, unknown).", append(engineLabels, "state"))
	descHashVerified   = newDesc("kvindex_engine_hash_verified_blocks_total", "Blocks whose recomputed hash matched the engine's.", engineLabels)
	descHashMismatch   = newDesc("kvindex_engine_hash_mismatch_blocks_total", "Blocks whose recomputed hash differed from the engine's.", engineLabels)
	descFallback       = newDesc("kvindex_engine_fallback_keys", "1 if the engine's blocks are keyed by kvindex's own hashes after a mismatch.", engineLabels)
	descUnverifiable   = newDesc("kvindex_engine_unverifiable_events_total", "Sampled events that could not be verified (parent digest unknown).", engineLabels)
	descEngDropped     = newDesc("kvindex_engine_dropped_blocks_total", "Blocks that could not be keyed (fallback with an unknown parent).", engineLabels)
	descMalformed      = newDesc("kvindex_engine_malformed_events_total", "Events ignored as invalid (lengths, sizes, fields).", engineLabels)
	descRemoveMisses   = newDesc("kvindex_engine_remove_misses_total", "Removals of blocks the index did not hold.", engineLabels)
	descIndexBytes     = newDesc("kvindex_index_bytes", "Estimated memory held by the index.", nil)
	descIndexBudget    = newDesc("kvindex_index_budget_bytes", "The index's share of the memory budget: eviction keeps kvindex_index_bytes within it; 0: no budget.", nil)
	descIndexHolders   = newDesc("kvindex_index_holder_blocks", "Block copies held, summed over engines.", nil)
	descIndexBlocks    = newDesc("kvindex_index_blocks", "Distinct block keys in the index.", nil)
	descIndexEngines   = newDesc("kvindex_index_engines", "Engines with entries in the index.", nil)
	descIndexModels    = newDesc("kvindex_index_models", "Models with entries in the index.", nil)
	descEvictions      = newDesc("kvindex_index_evictions_total", "Entries evicted to stay within the memory budget.", nil)
	descWatchers       = newDesc("kvindex_watchers", "Open Watch streams.", nil)
	descWatchSent      = newDesc("kvindex_watch_events_total", "Events queued to Watch streams.", nil)
	descWatchDropped   = newDesc("kvindex_watch_dropped_events_total", "Events Watch streams lost by falling behind (each such stream was closed).", nil)
	descWatchBehind    = newDesc("kvindex_watch_closed_behind_total", "Watch streams closed because they fell behind (their queue or the fan-out queue overflowed).", nil)
	descWatchRefused   = newDesc("kvindex_watch_refused_total", "Watch streams refused because as many as allowed were open.", nil)
	descHubDropped     = newDesc("kvindex_watch_fanout_dropped_batches_total", "Batches the watch fan-out queue could not take.", nil)
	descHubQueued      = newDesc("kvindex_watch_fanout_queue_batches", "Batches waiting for the watch fan-out.", nil)
	descTokInFlight    = newDesc("kvindex_query_tokens_in_flight", "Tokens of the queries being answered (bounded by the limit on tokens in flight).", nil)
	descQryRefused     = newDesc("kvindex_query_refused_total", "Queries refused before any work, by reason (tokens_in_flight, body_bytes_in_flight).", []string{"reason"})
	descHTTPConns      = newDesc("kvindex_http_connections", "Open HTTP connections (bounded by the connection limit).", nil)
	descEngines        = newDesc("kvindex_engines", "Engine ranks followed, by health state (all of them, those without series of their own included).", []string{"state"})
	descEnginesOmitted = newDesc("kvindex_metrics_engines_omitted", "Engine ranks without per-engine series: beyond the cap on them, the healthy ones are left out first.", nil)
	descHTTPWaits      = newDesc("kvindex_http_connection_waits_total", "HTTP connections that waited for a slot under the connection limit.", nil)
	descHTTPRefused    = newDesc("kvindex_http_connections_refused_total", "HTTP connections closed at once: their client address held its share of the connection limit.", nil)
	descHTTPTimeouts   = newDesc("kvindex_http_read_timeouts_total", "HTTP connections closed because their client did not send its request's headers within --http-read-header-timeout, or the whole request within --http-read-timeout.", nil)
	descReady          = newDesc("kvindex_ready", "1 once the server is ready.", nil)
	descTokHits        = newDesc("kvindex_tokenizer_cache_hits_total", "Tokenizations answered from the tokenizer's cache, by backend.", []string{"source"})
	descTokRequests    = newDesc("kvindex_tokenizer_backend_requests_total", "Requests sent to the engine's /tokenize, by backend.", []string{"source"})
	descTokErrors      = newDesc("kvindex_tokenizer_backend_errors_total", "Tokenizer calls that failed, by backend.", []string{"source"})
	descTokSegments    = newDesc("kvindex_tokenizer_segments_total", "Text segments the local tokenizer encoded (miss) or found in its segment cache (hit): the text between special tokens, or a chunk of it, so that a conversation's next turn encodes only what is new.", []string{"source", "result"})
	descTokEntries     = newDesc("kvindex_tokenizer_cache_entries", "Entries in the tokenizer's cache, by backend.", []string{"source"})
	descTokBytes       = newDesc("kvindex_tokenizer_cache_bytes", "Accounted bytes of the tokenizer's cache, by backend.", []string{"source"})
)

// streamHealthStates are the states streamHealth reports, each a label
// value of kvindex_engine_health.
var streamHealthStates = []kvindexv1.EngineHealth{
	kvindexv1.EngineHealth_ENGINE_HEALTH_OK,
	kvindexv1.EngineHealth_ENGINE_HEALTH_RESTORED,
	kvindexv1.EngineHealth_ENGINE_HEALTH_UNCONFIRMED,
	kvindexv1.EngineHealth_ENGINE_HEALTH_DEGRADED,
	kvindexv1.EngineHealth_ENGINE_HEALTH_DISCONNECTED,
	kvindexv1.EngineHealth_ENGINE_HEALTH_PARTIAL,
}

func newDesc(name, help string, labels []string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

// stateCollector reads the server's state at scrape time. It is an
// unchecked collector (Describe sends nothing): the set of engines changes.
type stateCollector struct{ m *metrics }

func (stateCollector) Describe(chan<- *prometheus.Desc) {}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.m.s
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	engines := s.index.Engines()
	var streams []kvevents.StreamStats
	if s.cfg.Streams != nil {
		streams = s.cfg.Streams.Streams()
	}
	evicted := evictedOf(engines)
	shown, counts, omitted := s.metricsEngines(streams, engines, evicted)
	for _, state := range streamHealthStates {
		gauge(descEngines, float64(counts[state]), client.HealthName(state))
	}
	gauge(descEnginesOmitted, float64(omitted))
	if s.cfg.Streams != nil {
		for _, st := range streams {
			if !shown[st.Engine] {
				continue
			}
			l := []string{st.Engine.Pod, strconv.Itoa(st.Engine.DPRank), st.Engine.Model}
			counter(descBatches, st.Batches, l...)
			counter(descEvents, st.Events, l...)
			counter(descDecodeErrors, st.DecodeErrors, l...)
			counter(descUnknownEvents, st.UnknownEvents, l...)
			counter(descGaps, st.Gaps, l...)
			counter(descLost, st.LostBatches, l...)
			counter(descReplays, st.ReplaysOK, append(l, "ok")...)
			counter(descReplays, st.ReplaysFailed, append(l, "failed")...)
			counter(descRestarts, st.Restarts, l...)
			counter(descVerified, st.Verified, l...)
			counter(descReplayRestart, st.ReplayRestarts, l...)
			counter(descResets, st.Resets, l...)
			gauge(descLastSeq, float64(st.LastSeq), l...)
			gauge(descLastEvent, float64(st.LastEventUnixNano)/1e9, l...)
			if st.LastBatchStampUnixNano != 0 {
				gauge(descLag, st.LastBatchLag.Seconds(), l...)
			}
			gauge(descConnected, b2f(st.Connected), l...)
			gauge(descDegraded, b2f(st.Health == kvevents.HealthDegraded), l...)
			h := withEviction(streamHealth(&st), evicted[st.Engine] != 0)
			for _, state := range streamHealthStates {
				gauge(descHealth, b2f(h == state), append(l, client.HealthName(state))...)
			}
		}
		if ls, ok := s.cfg.Streams.(ListenerSource); ok {
			if st, ok := ls.ListenerStats(); ok {
				gauge(descLsnPeers, float64(st.Peers), st.Endpoint)
				counter(descLsnMessages, st.Messages, st.Endpoint)
				counter(descLsnRejected, st.MalformedFrames, st.Endpoint, "malformed")
				counter(descLsnRejected, st.UnknownTopics, st.Endpoint, "unknown_topic")
				counter(descLsnRejected, st.DecodeErrors, st.Endpoint, "decode_error")
				counter(descLsnRejected, st.BadRanks, st.Endpoint, "bad_rank")
				counter(descLsnRejected, st.Conflicts, st.Endpoint, "conflict")
				counter(descLsnRejected, st.RefusedSources, st.Endpoint, "source")
				counter(descLsnConnRef, st.RefusedHandshakes, st.Endpoint, "handshake")
				counter(descLsnConnRef, st.RefusedConnections, st.Endpoint, "full")
				counter(descLsnRefused, st.RefusedEngines, st.Endpoint)
				counter(descLsnForgot, st.ForgottenEngines, st.Endpoint, "departed")
				counter(descLsnForgot, st.UnprovenEngines, st.Endpoint, "unproven")
				counter(descLsnForgot, st.DisplacedEngines, st.Endpoint, "displaced")
			}
		}
	}
	for _, e := range engines {
		if !shown[e.Engine] {
			continue
		}
		l := []string{e.Engine.Pod, strconv.Itoa(e.Engine.DPRank), e.Engine.Model}
		gauge(descEngineBlocks, float64(e.HolderBlocks), l...)
		for _, t := range e.Tiers {
			gauge(descEngineMedium, float64(t.Blocks), append(l, t.Medium)...)
		}
		for _, hc := range []indexer.HashCheck{indexer.HashVerified, indexer.HashMismatch, indexer.HashUnknown} {
			gauge(descHashCheck, b2f(e.HashCheck == hc), append(l, hc.String())...)
		}
		counter(descHashVerified, e.Verified, l...)
		counter(descHashMismatch, e.Mismatches, l...)
		gauge(descFallback, b2f(e.Fallback), l...)
		counter(descUnverifiable, e.Unverifiable, l...)
		counter(descEngDropped, e.Dropped, l...)
		counter(descMalformed, e.Malformed, l...)
		counter(descRemoveMisses, e.RemoveMisses, l...)
	}
	st := s.index.Stats()
	gauge(descIndexBytes, float64(st.Bytes))
	gauge(descIndexBudget, float64(st.Budget))
	gauge(descIndexHolders, float64(st.HolderBlocks))
	gauge(descIndexBlocks, float64(st.Blocks))
	gauge(descIndexEngines, float64(st.Engines))
	gauge(descIndexModels, float64(st.Models))
	counter(descEvictions, st.Evictions)
	if h := s.cfg.Hub; h != nil {
		gauge(descWatchers, float64(h.Open()))
		counter(descWatchSent, h.Delivered())
		counter(descWatchDropped, h.Dropped())
		counter(descWatchBehind, h.ClosedBehind())
		counter(descWatchRefused, h.Refused())
		counter(descHubDropped, h.DroppedBatches())
		gauge(descHubQueued, float64(h.Queued()))
	}
	gauge(descTokInFlight, float64(s.tokens.InFlight()))
	counter(descQryRefused, s.tokens.Refused(), "tokens_in_flight")
	counter(descQryRefused, s.bodies.Refused(), "body_bytes_in_flight")
	gauge(descHTTPConns, float64(s.conns.open.Load()))
	counter(descHTTPWaits, s.conns.waits.Load())
	counter(descHTTPRefused, s.conns.refused.Load())
	counter(descHTTPTimeouts, s.conns.timeouts.Load())
	gauge(descReady, b2f(s.Ready()))
	TokenizerMetrics(s.cfg.Tokenizers).Collect(ch)
}

// localTokenizerStats is implemented by the local tokenizer
// (*tokenizer.Local, *tokenizer.ChatLocal), whose segment cache's
// counters are exported.
type localTokenizerStats interface {
	Stats() tokenizer.LocalStats
}

// TokenizerMetrics collects the tokenizers' counters (their caches', the
// engine backend's requests) as kvindex_tokenizer_* metrics labelled by
// source: the server's and, with the same names, kvindex picker's own
// tokenizer's.
type TokenizerMetrics []NamedTokenizer

// Describe implements prometheus.Collector; it is unchecked (it sends
// nothing), as the server's state collector is.
func (TokenizerMetrics) Describe(chan<- *prometheus.Desc) {}

// Collect implements prometheus.Collector.
func (ts TokenizerMetrics) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, t := range ts {
		switch st := t.Tokenizer.(type) {
		case httpTokenizerStats:
			s := st.Stats()
			counter(descTokHits, s.CacheHits, t.Source)
			counter(descTokRequests, s.Requests, t.Source)
			counter(descTokErrors, s.Errors, t.Source)
			gauge(descTokEntries, float64(s.CacheEntries), t.Source)
			gauge(descTokBytes, float64(s.CacheBytes), t.Source)
		case localTokenizerStats:
			s := st.Stats()
			counter(descTokSegments, s.SegmentHits, t.Source, "hit")
			counter(descTokSegments, s.SegmentMisses, t.Source, "miss")
			gauge(descTokEntries, float64(s.SegmentEntries), t.Source)
			gauge(descTokBytes, float64(s.SegmentBytes), t.Source)
		}
	}
}

// metricsEngines picks the engines that get series of their own
// (Limits.MetricsEngines; the ones not ok first, then by model, pod and
// rank), counts every followed engine by health, and says how many known
// engines were left out; evicted is evictedOf(engines).
func (s *Server) metricsEngines(streams []kvevents.StreamStats, engines []indexer.EngineInfo, evicted map[kvevents.EngineID]uint64) (shown map[kvevents.EngineID]bool, counts map[kvindexv1.EngineHealth]int, omitted int) {
	type cand struct {
		id kvevents.EngineID
		ok bool
	}
	seen := make(map[kvevents.EngineID]bool, len(streams)+len(engines))
	cands := make([]cand, 0, len(streams)+len(engines))
	counts = make(map[kvindexv1.EngineHealth]int, len(streamHealthStates))
	for _, st := range streams {
		h := withEviction(streamHealth(&st), evicted[st.Engine] != 0)
		counts[h]++
		seen[st.Engine] = true
		cands = append(cands, cand{st.Engine, h == kvindexv1.EngineHealth_ENGINE_HEALTH_OK})
	}
	for _, e := range engines {
		if !seen[e.Engine] {
			seen[e.Engine] = true
			cands = append(cands, cand{e.Engine, e.HashCheck != indexer.HashMismatch && e.Evicted == 0})
		}
	}
	limit := s.cfg.Limits.MetricsEngines
	if len(cands) > limit {
		slices.SortFunc(cands, func(a, b cand) int {
			if a.ok != b.ok {
				if a.ok {
					return 1
				}
				return -1
			}
			return cmp.Or(cmp.Compare(a.id.Model, b.id.Model), compareEngines(a.id, b.id))
		})
		omitted = len(cands) - limit
		cands = cands[:limit]
	}
	shown = make(map[kvevents.EngineID]bool, len(cands))
	for _, c := range cands {
		shown[c.id] = true
	}
	return shown, counts, omitted
}
