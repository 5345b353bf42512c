// Package enginemetrics scrapes the inference engines' own Prometheus
// metrics for the gateway picker, and keeps the live fleet cached-prefix
// fraction: the share of prompt tokens the engines serve from their
// prefix caches, the number kvindex exists to move. Unlike package
// picker, which is pure, it does I/O: HTTP scrapes on an interval, from
// goroutines it owns.
//
// # Scraping
//
// A Scraper GETs each engine's metrics page (pod name -> URL, such as
// http://10.0.0.5:8000/metrics; MetricsURL builds it from a picker
// endpoint) every Config.Interval, at most Config.Concurrency at once,
// each within Config.Timeout and Config.MaxBytes, and reads, with
// prometheus' text parser (Parse):
//
//   - vllm:num_requests_waiting and vllm:num_requests_running, summed
//     over the engine's data-parallel ranks (the engine label): the pod's
//     queue is its ranks' queues together;
//   - vllm:kv_cache_usage_perc (vllm:gpu_cache_usage_perc before vLLM
//     0.10), averaged over the ranks;
//   - vllm:prefix_cache_queries and vllm:prefix_cache_hits, counters in
//     tokens, per model_name, summed over the ranks, with or without the
//     _total suffix; before vLLM 0.10 vllm:gpu_prefix_cache_queries and
//     _hits, read only when the current names are absent (0.10 exposes
//     both).
//
// Latest and Metrics give a pod's last sample with its scrape time
// (Metrics in picker.Candidate's form) until it is older than
// Config.MaxAge, the picker's own MetricsMaxAge by default: an engine
// that stopped answering loses its load signal instead of keeping a stale
// one. A failed scrape (unreachable, timed out, not 200, too large, not
// parsable, no vLLM metrics) is counted per pod (Status, and the
// kvindex_engine_scrape_errors_total counter) and logged when it starts
// or changes, not on every round.
//
// # The fleet cached fraction
//
// A Fleet sums, over a sliding window (Config.Window, in one-second
// buckets), the increments of the engines' prefix-cache counters between
// scrapes; its fraction is hits over queries, per model and overall
// (model Overall, ""). A pod's first scrape only sets its baseline: what
// an engine counted before kvindex saw it belongs to no window. A counter
// that went down is a restart, and the new process's counts are all new,
// as Prometheus' rate() reads them; a restart whose new counts already
// exceed the old ones at the next scrape looks like a slower engine and
// is undercounted, the same limit rate() has. Status gives each pod's own
// increments over the same window (PodStatus.Cache), its hit rate next to
// the fleet's.
//
// Kept apart, as "observed through the picker": the usage of the
// responses that passed through the picker (Fleet.Observe with
// usage.prompt_tokens and usage.prompt_tokens_details.cached_tokens), in
// a window of its own and as totals. And the picker's predictions
// (Fleet.Predict with the chosen pod's picker.Score.MatchedTokens): the
// predicted and observed cached tokens are counters, so that observed
// falling behind predicted, while the engines' own hit rates stay high,
// shows the picker routing on a wrong view of the caches. Models are
// tracked one by one up to Config.MaxModels; further ones count in the
// overall figures only.
//
// # Exported metrics
//
// Scraper.Collector exports, read at collection time:
//
//   - kvindex_fleet_cached_fraction{model}: the engines' windowed
//     fraction; model="" is the whole fleet (an empty name cannot clash
//     with a served model's); absent while the window saw no query;
//   - kvindex_picker_observed_cached_fraction{model}: the same from the
//     responses' usage;
//   - kvindex_engine_requests_waiting{pod}, kvindex_engine_kv_cache_usage{pod}:
//     the fresh samples;
//   - kvindex_engine_scrape_errors_total{pod};
//   - kvindex_picker_predicted_cached_tokens_total{model},
//     kvindex_picker_observed_cached_tokens_total{model} and
//     kvindex_picker_observed_prompt_tokens_total{model} (per model only;
//     sum() gives the fleet);
//   - kvindex_picker_bad_usage_total: usages Observe refused.
//
// # Wiring
//
// The picker (in its own process, or in kvindex serve --picker) runs one
// Scraper over its endpoints and registers its collector:
//
//	sc, err := enginemetrics.New(enginemetrics.Config{}, map[string]string{
//		"pod-a": enginemetrics.MetricsURL("10.0.0.5:8000"),
//	}, log)
//	go sc.Run(ctx)
//	registry.MustRegister(sc.Collector())
//
// Per request: each candidate's Metrics from sc.Metrics(pod); after the
// pick, sc.Fleet().Predict(model, d.Scores[0].MatchedTokens) (the chosen
// pod's score is first); when the response's usage passes back (the JSON
// body, or the last server-sent event when stream_options.include_usage
// is set; ParseUsage reads both), sc.Fleet().Observe(model, prompt,
// cached). Predict only the requests whose usage the picker will see,
// or the two counters do not compare. Discovery calls sc.SetEndpoints.
// kvindex serve --picker answers ListPods with the engines' figures of
// sc.Fleet().Summary() (the overall figures first, then each model's),
// which kvindex pods prints; sc.Status() gives each pod's scrape state.
package enginemetrics
