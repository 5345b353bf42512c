package server

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
)

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %d %v", resp.StatusCode, err)
	}
	return string(b)
}

func TestMetrics(t *testing.T) {
	streams := &fakeStreams{}
	streams.set(kvevents.StreamStats{
		Engine: engine("a", 0), Connected: true, Batches: 10, Events: 25, DecodeErrors: 2, UnknownEvents: 3,
		Gaps: 4, ReplaysOK: 5, ReplaysFailed: 6, Resets: 7, LastSeq: 99, Health: kvevents.HealthDegraded, LastEventUnixNano: 1_500_000_000_000_000_000,
		LastBatchStampUnixNano: 1_499_999_997_500_000_000, LastBatchLag: 2500 * time.Millisecond,
	}, kvevents.StreamStats{Engine: engine("b", 0), Connected: true}) // no stamped batch: no lag
	ids := testutil.Seq(1, 32)
	engineTok := engineTokenizer(t, vllmTokenize(t, ids, http.StatusOK).URL)
	f := newFixtureIndex(t, indexer.Options{MemoryBudget: 1 << 20}, func(c *Config) {
		c.Streams = streams
		c.Tokenizers = []NamedTokenizer{{client.SourceEngine, engineTok}}
	})
	loadThree(t, f, testutil.Seq(1, 64))
	offloaded := stored(t, testutil.Seq(1, 64), 2)
	offloaded.Medium = "CPU"
	f.hub.Apply(engine("a", 0), 1, []kvevents.Event{offloaded})
	ctx := context.Background()
	if _, err := f.client.LongestPrefixTokens(ctx, testModel, ids, nil); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := f.client.LongestPrefixText(ctx, testModel, "same text", nil); err != nil {
			t.Fatal(err)
		}
	}
	f.client.LongestPrefixTokens(ctx, testModel, ids, &client.QueryOptions{Candidates: []string{""}}) // InvalidArgument
	post(t, f.url+"/v1/longest-prefix", `{"tokens":[1,2]}`)

	text := scrape(t, f.url)
	engineL := `dp_rank="0",model="qwen",pod="a"`
	for _, want := range []string{
		`kvindex_ingest_batches_total{` + engineL + `} 10`,
		`kvindex_ingest_events_total{` + engineL + `} 25`,
		`kvindex_ingest_decode_errors_total{` + engineL + `} 2`,
		`kvindex_ingest_unknown_events_total{` + engineL + `} 3`,
		`kvindex_ingest_gaps_total{` + engineL + `} 4`,
		`kvindex_ingest_replays_total{` + engineL + `,result="ok"} 5`,
		`kvindex_ingest_replays_total{` + engineL + `,result="failed"} 6`,
		`kvindex_ingest_resets_total{` + engineL + `} 7`,
		`kvindex_ingest_last_seq{` + engineL + `} 99`,
		`kvindex_ingest_connected{` + engineL + `} 1`,
		`kvindex_ingest_degraded{` + engineL + `} 1`,
		`kvindex_ingest_last_event_timestamp_seconds{` + engineL + `} 1.5e+09`,
		`kvindex_ingest_lag_seconds{` + engineL + `} 2.5`,
		`kvindex_engine_blocks{` + engineL + `} 6`,
		`kvindex_engine_blocks_by_medium{dp_rank="0",medium="GPU",model="qwen",pod="a"} 4`,
		`kvindex_engine_blocks_by_medium{dp_rank="0",medium="CPU",model="qwen",pod="a"} 2`,
		`kvindex_engine_blocks_by_medium{dp_rank="0",medium="GPU",model="qwen",pod="b"} 2`,
		`kvindex_engine_hash_check{` + engineL + `,state="verified"} 1`,
		`kvindex_engine_hash_check{` + engineL + `,state="mismatch"} 0`,
		`kvindex_index_holder_blocks 11`,
		`kvindex_index_blocks 4`,
		`kvindex_index_engines 3`,
		`kvindex_index_evictions_total 0`,
		`kvindex_index_budget_bytes 1.048576e+06`,
		`kvindex_query_duration_seconds_count{api="grpc",method="LongestPrefix"} 4`,
		`kvindex_query_duration_seconds_count{api="http",method="longest-prefix"} 1`,
		`kvindex_query_errors_total{api="grpc",code="InvalidArgument",method="LongestPrefix"} 1`,
		`kvindex_tokenize_requests_total{result="ok",source="engine"} 2`,
		`kvindex_tokenizer_cache_hits_total{source="engine"} 1`,
		`kvindex_tokenizer_backend_requests_total{source="engine"} 1`,
		`kvindex_watchers 0`,
		`kvindex_watch_dropped_events_total 0`,
		`kvindex_ready 1`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(text, `kvindex_ingest_lag_seconds{dp_rank="0",model="qwen",pod="b"}`) {
		t.Error("a lag is exported for an engine that sent no stamped batch")
	}
	if !strings.Contains(text, "kvindex_index_bytes ") || strings.Contains(text, "kvindex_index_bytes 0\n") {
		t.Error("kvindex_index_bytes missing or zero")
	}
	if !strings.Contains(text, "go_goroutines ") || !strings.Contains(text, "process_cpu_seconds_total ") {
		t.Error("runtime metrics missing")
	}
}

// listenerStreams is a StreamSource with a listen socket.
type listenerStreams struct {
	fakeStreams
	ls kvevents.ListenerStats
}

func (l *listenerStreams) ListenerStats() (kvevents.ListenerStats, bool) { return l.ls, true }

func TestListenerMetrics(t *testing.T) {
	ep := "tcp://0.0.0.0:5557"
	streams := &listenerStreams{ls: kvevents.ListenerStats{
		Endpoint: ep, Peers: 2, Messages: 100, MalformedFrames: 1, UnknownTopics: 2, DecodeErrors: 3,
		BadRanks: 4, Conflicts: 5, RefusedEngines: 6, RefusedSources: 7, RefusedHandshakes: 8,
		RefusedConnections: 9,
	}}
	f := newFixture(t, func(c *Config) { c.Streams = streams })
	text := scrape(t, f.url)
	l := `endpoint="` + ep + `"`
	for _, want := range []string{
		`kvindex_listener_peers{` + l + `} 2`,
		`kvindex_listener_messages_total{` + l + `} 100`,
		`kvindex_listener_rejected_total{` + l + `,reason="malformed"} 1`,
		`kvindex_listener_rejected_total{` + l + `,reason="unknown_topic"} 2`,
		`kvindex_listener_rejected_total{` + l + `,reason="decode_error"} 3`,
		`kvindex_listener_rejected_total{` + l + `,reason="bad_rank"} 4`,
		`kvindex_listener_rejected_total{` + l + `,reason="conflict"} 5`,
		`kvindex_listener_refused_engines_total{` + l + `} 6`,
		`kvindex_listener_rejected_total{` + l + `,reason="source"} 7`,
		`kvindex_listener_refused_connections_total{` + l + `,reason="handshake"} 8`,
		`kvindex_listener_refused_connections_total{` + l + `,reason="full"} 9`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
}
