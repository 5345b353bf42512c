package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/internal/demo"
)

// The APIs a run can send to.
const (
	APICompletions = "completions" // /v1/completions: token ids or text
	APIChat        = "chat"        // /v1/chat/completions: text, as one user message
)

// Options configure how a run sends its input.
type Options struct {
	API         string // APICompletions or APIChat
	Model       string
	Concurrency int           // requests in flight at most
	Duration    time.Duration // stop sending after this long (0: send everything)
	// Client sends the requests (nil: one without a timeout, as a
	// stream has no bound).
	Client *http.Client
	// Progress, if set, is called every ProgressInterval during a run.
	Progress func(Progress)
}

// DefaultOptions returns kvindex loadgen's defaults.
func DefaultOptions() Options {
	return Options{API: APICompletions, Model: DefaultModel, Concurrency: 16}
}

// DefaultModel is kvindex sim's engines' model.
const DefaultModel = "Qwen/Qwen2.5-7B-Instruct"

// ProgressInterval is how often a run reports its progress.
const ProgressInterval = time.Second

// markerTokens is the length of the marker a run puts before every token
// prompt: one block of vLLM's default size, so that the prompts' blocks
// stay aligned as the ceiling counts them.
const markerTokens = 16

// maxConcurrency bounds Options.Concurrency.
const maxConcurrency = 1 << 16

// Check returns what is wrong with o for input in.
func (o *Options) Check(in *Input) error {
	switch {
	case o.API != APICompletions && o.API != APIChat:
		return fmt.Errorf("--api %q: want %s or %s", o.API, APIChat, APICompletions)
	case o.API == APIChat && !in.Text:
		return fmt.Errorf("--api chat sends text, and the prompts of %s are token ids: use --api completions", in.Name)
	case o.Concurrency < 1 || o.Concurrency > maxConcurrency:
		return fmt.Errorf("--concurrency %d: want 1..%d", o.Concurrency, maxConcurrency)
	case o.Duration < 0:
		return fmt.Errorf("--duration %v: want 0 (send everything) or more", o.Duration)
	case o.Model == "":
		return errors.New("--model: want the model the engines serve")
	}
	return nil
}

// Progress is a run's state so far.
type Progress struct {
	Route        string
	Sent, Total  int
	Done, Errors int
	PromptTokens int64 // of the answered requests, per their usage
	CachedTokens int64
	Elapsed      time.Duration
}

// String is the progress as one line.
func (p Progress) String() string {
	rate := 0.0
	if s := p.Elapsed.Seconds(); s > 0 {
		rate = float64(p.Done) / s
	}
	return fmt.Sprintf("%s: %d/%d sent, %d done, %d errors, %.1f req/s, cached %s",
		p.Route, p.Sent, p.Total, p.Done, p.Errors, rate, pct(ratio(p.CachedTokens, p.PromptTokens)))
}

// Result is the outcome of one run. Its JSON form is part of kvindex
// loadgen's output.
type Result struct {
	Route    string `json:"route"`
	Requests int    `json:"requests"` // sent
	Errors   int    `json:"errors"`
	// TTFT is the time to the first streamed chunk, over the answered
	// requests, in milliseconds.
	TTFT                  Percentiles `json:"ttft_ms"`
	Seconds               float64     `json:"seconds"`
	RequestsPerSecond     float64     `json:"requests_per_s"`
	PromptTokensPerSecond float64     `json:"prompt_tokens_per_s"`
	// PromptTokens and CachedTokens sum the engines' own usage
	// (prompt_tokens, prompt_tokens_details.cached_tokens) over the
	// answered requests, the run's marker left out.
	PromptTokens   int64   `json:"prompt_tokens"`
	CachedTokens   int64   `json:"cached_tokens"`
	CachedFraction float64 `json:"cached_fraction"`
	// Ceiling is what one unlimited cache would serve of the requests
	// sent (Input.Ceiling).
	Ceiling float64 `json:"ceiling_cached_fraction"`
	// Pods counts the requests each pod was sent (not for a gateway,
	// which does not say).
	Pods       map[string]int `json:"pods,omitempty"`
	FirstError string         `json:"first_error,omitempty"`
}

// Percentiles of a latency, in milliseconds.
type Percentiles struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
}

// Run sends in's requests by route and measures what the engines say of
// them. A request waits for its planned arrival and for the answer to its
// conversation's previous turn. Every prompt starts with a marker of the
// run's own (markerTokens random token ids, or a bracketed word before
// text), so that no run finds an earlier run's blocks in the engines'
// caches: a run starts cold, as the ceiling assumes. A request that fails
// counts as an error; Run returns an error only when it cannot start.
func Run(ctx context.Context, in *Input, route Route, o Options) (*Result, error) {
	if err := o.Check(in); err != nil {
		return nil, err
	}
	r := newRunner(in, route, o)
	return r.run(ctx), nil
}

type runner struct {
	in     *Input
	route  Route
	o      Options
	client *http.Client
	path   string
	marker []uint64
	text   string // the marker before text prompts
	rr     atomic.Uint64

	mu       sync.Mutex
	sent     int
	done     int
	errs     int
	prompt   int64
	cached   int64
	ttft     []time.Duration
	pods     map[string]int
	firstErr string
}

func newRunner(in *Input, route Route, o Options) *runner {
	r := &runner{in: in, route: route, o: o, client: o.Client, pods: map[string]int{}}
	if r.client == nil {
		// As many idle connections per engine as requests in flight, so
		// that a busy run reuses them rather than dialling anew.
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = o.Concurrency
		r.client = &http.Client{Transport: t}
	}
	r.path = "/v1/completions"
	if o.API == APIChat {
		r.path = "/v1/chat/completions"
	}
	seed := rand.Uint64()
	g := rand.New(rand.NewPCG(seed, seed>>1))
	for range markerTokens {
		r.marker = append(r.marker, g.Uint64N(1<<31))
	}
	r.text = "[run " + strconv.FormatUint(seed, 36) + "]\n"
	return r
}

func (r *runner) run(ctx context.Context) *Result {
	reqs := r.in.Requests
	done := make([]chan struct{}, len(reqs))
	for i := range done {
		done[i] = make(chan struct{})
	}
	sem := make(chan struct{}, r.o.Concurrency)
	start := time.Now()
	stopProgress := r.progress(start)
	var wg sync.WaitGroup
	timer := time.NewTimer(0)
	defer timer.Stop()
	sent := 0
send:
	for i := range reqs {
		req := &reqs[i]
		if r.o.Duration > 0 && req.Planned >= r.o.Duration {
			break
		}
		if wait := time.Until(start.Add(req.Planned)); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				break send
			case <-timer.C:
			}
		}
		if ctx.Err() != nil || r.o.Duration > 0 && time.Since(start) >= r.o.Duration {
			break
		}
		sent++
		r.mu.Lock()
		r.sent = sent
		r.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(done[req.ID])
			if req.Prev >= 0 {
				select {
				case <-done[req.Prev]:
				case <-ctx.Done():
					r.record(0, 0, 0, "", ctx.Err())
					return
				}
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				r.record(0, 0, 0, "", ctx.Err())
				return
			}
			defer func() { <-sem }()
			r.record(r.send(ctx, req))
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	stopProgress()
	return r.result(sent, elapsed)
}

// progress calls Options.Progress every ProgressInterval until the
// returned stop is called.
func (r *runner) progress(start time.Time) (stop func()) {
	if r.o.Progress == nil {
		return func() {}
	}
	quit, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(ProgressInterval)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				r.mu.Lock()
				p := Progress{Route: r.route.String(), Sent: r.sent, Total: len(r.in.Requests), Done: r.done, Errors: r.errs,
					PromptTokens: r.prompt, CachedTokens: r.cached, Elapsed: time.Since(start)}
				r.mu.Unlock()
				r.o.Progress(p)
			}
		}
	}()
	return func() { close(quit); <-finished }
}

func (r *runner) record(ttft time.Duration, prompt, cached int, pod string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if pod != "" {
		r.pods[pod]++
	}
	if err != nil {
		r.errs++
		if r.firstErr == "" {
			r.firstErr = err.Error()
		}
		return
	}
	r.done++
	r.ttft = append(r.ttft, ttft)
	r.prompt += int64(prompt)
	r.cached += int64(cached)
}

func (r *runner) result(sent int, elapsed time.Duration) *Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := &Result{
		Route: r.route.String(), Requests: sent, Errors: r.errs,
		Seconds: round(elapsed.Seconds(), 3), PromptTokens: r.prompt, CachedTokens: r.cached,
		CachedFraction: round(ratio(r.cached, r.prompt), 4), Ceiling: round(r.in.Ceiling(sent), 4),
		FirstError: r.firstErr,
	}
	if len(r.pods) > 0 {
		res.Pods = r.pods
	}
	if s := elapsed.Seconds(); s > 0 {
		res.RequestsPerSecond = round(float64(r.done)/s, 2)
		res.PromptTokensPerSecond = round(float64(r.prompt)/s, 0)
	}
	slices.Sort(r.ttft)
	res.TTFT = Percentiles{P50: percentile(r.ttft, 0.5), P90: percentile(r.ttft, 0.9), P99: percentile(r.ttft, 0.99)}
	return res
}

// percentile is the nearest-rank q-quantile of sorted, in milliseconds.
func percentile(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return round(float64(sorted[max(i, 0)])/float64(time.Millisecond), 1)
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func round(x float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(x*p) / p
}

// body is the OpenAI request of req, with the run's marker.
func (r *runner) body(req *demo.Request) ([]byte, int) {
	out := max(1, req.Output())
	m := map[string]any{"model": r.o.Model, "max_tokens": out, "stream": true, "stream_options": map[string]bool{"include_usage": true}}
	marker := 0
	switch text := req.Text(); {
	case r.o.API == APIChat:
		m["messages"] = []map[string]string{{"role": "user", "content": r.text + text}}
	case text != "":
		m["prompt"] = r.text + text
	default:
		m["prompt"] = append(slices.Clone(r.marker), req.PromptTokens()...)
		marker = markerTokens
	}
	b, _ := json.Marshal(m) // plain values: cannot fail
	return b, marker
}

// send sends one request by the route and reads its streamed answer.
func (r *runner) send(ctx context.Context, req *demo.Request) (ttft time.Duration, prompt, cached int, pod string, err error) {
	body, marker := r.body(req)
	session := "c" + strconv.Itoa(req.Conv)
	var target string
	switch r.route.Kind {
	case RoundRobin:
		e := r.route.Endpoints[(r.rr.Add(1)-1)%uint64(len(r.route.Endpoints))]
		target, pod = "http://"+e.Addr+r.path, e.Pod
	case Gateway:
		target = r.route.URL + r.path
	case Pick:
		e, p, err := r.pick(ctx, body, session)
		if err != nil {
			return 0, 0, 0, "", err
		}
		target, pod = "http://"+e+r.path, p
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return 0, 0, 0, pod, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("x-session-id", session)
	start := time.Now()
	resp, err := r.client.Do(hreq)
	if err != nil {
		return 0, 0, 0, pod, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, 0, pod, statusError(target, resp)
	}
	ttft, u, err := readStream(resp.Body, start)
	if err != nil {
		return 0, 0, 0, pod, fmt.Errorf("%s: %w", target, err)
	}
	prompt, cached = u.PromptTokens-marker, u.PromptTokensDetails.CachedTokens-min(marker, u.PromptTokensDetails.CachedTokens)
	return ttft, prompt, max(cached, 0), pod, nil
}

// pick asks the picker where the request goes: the endpoint's address
// and pod.
func (r *runner) pick(ctx context.Context, body []byte, session string) (endpoint, pod string, err error) {
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, r.route.URL, bytes.NewReader(body))
	if err != nil {
		return "", "", err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("x-session-id", session)
	resp, err := r.client.Do(hreq)
	if err != nil {
		return "", "", fmt.Errorf("picker: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", "", fmt.Errorf("picker: %w", statusError(r.route.URL, resp))
	}
	var d struct {
		Endpoint string `json:"endpoint"`
		Pod      string `json:"pod"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&d); err != nil {
		return "", "", fmt.Errorf("picker %s: reading its decision: %w", r.route.URL, err)
	}
	if d.Endpoint == "" {
		return "", "", fmt.Errorf("picker %s: a decision without an endpoint", r.route.URL)
	}
	return d.Endpoint, d.Pod, nil
}

// statusError is a non-200 answer, with the start of its body.
func statusError(target string, resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return fmt.Errorf("%s: %s: %s", target, resp.Status, strings.TrimSpace(string(b)))
}

// usage is the part of an OpenAI usage a run reads.
type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// maxSSELine bounds one server-sent event line.
const maxSSELine = 1 << 20

// readStream reads a streamed OpenAI answer (server-sent events ending in
// [DONE]): the time from start to its first chunk, and the usage its
// last chunk carries.
func readStream(body io.Reader, start time.Time) (time.Duration, usage, error) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 4096), maxSSELine)
	var ttft time.Duration
	var u *usage
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data:")
		if !ok {
			continue
		}
		if ttft == 0 {
			ttft = time.Since(start)
		}
		data = strings.TrimSpace(data)
		if data == "[DONE]" {
			if u == nil {
				return 0, usage{}, errors.New("the stream ended without a usage chunk (does the server honour stream_options.include_usage?)")
			}
			return ttft, *u, nil
		}
		var chunk struct {
			Usage *usage `json:"usage"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			return 0, usage{}, fmt.Errorf("a stream chunk is not JSON: %w", err)
		}
		if chunk.Error != nil {
			return 0, usage{}, fmt.Errorf("the stream reports an error: %s", chunk.Error.Message)
		}
		if chunk.Usage != nil {
			u = chunk.Usage
		}
	}
	if err := sc.Err(); err != nil {
		return 0, usage{}, fmt.Errorf("reading the stream: %w", err)
	}
	return 0, usage{}, errors.New("the stream ended before [DONE]")
}
