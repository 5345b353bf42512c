package enginemetrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"sort"
	"sync"
	"time"

	"github.com/kvindex/kvindex/picker"
)

// minDefaultTimeout is the least default Config.Timeout.
const minDefaultTimeout = time.Second

// Config configures a Scraper and its Fleet. The zero value of a field
// takes its default.
type Config struct {
	// Interval is the time between scrape rounds (default
	// DefaultInterval).
	Interval time.Duration
	// Timeout bounds one scrape, connection to last byte (default: the
	// Interval, so that rounds do not pile up, but at least
	// minDefaultTimeout: a short interval must not make a busy engine's
	// page, or a busy machine's scrape, a timeout every round).
	Timeout time.Duration
	// MaxBytes bounds a metrics page, after decompression (default
	// DefaultMaxBytes); a longer page is a scrape error.
	MaxBytes int64
	// Concurrency is the number of scrapes in flight at once (default
	// DefaultConcurrency).
	Concurrency int
	// MaxAge is how old a pod's last sample may be before it is treated as
	// gone (default: the picker's MetricsMaxAge, past which it ignores
	// them anyway).
	MaxAge time.Duration
	// Window is the span of the fleet's cached fraction (default
	// DefaultWindow); at least a second, counted in whole seconds.
	Window time.Duration
	// MaxModels bounds the models tracked one by one (default
	// DefaultMaxModels).
	MaxModels int
	// Client sends the scrapes (default: a client of its own).
	Client *http.Client
	// Now returns the time samples are stamped with (default time.Now).
	Now func() time.Time
}

// Defaults.
const (
	// DefaultInterval keeps the picker's load signal within about a second
	// of the engine's queue, at one small GET per engine per second.
	DefaultInterval = time.Second
	// DefaultMaxBytes is far above a vLLM page (tens of kilobytes, its
	// histograms included) and far below what would hurt.
	DefaultMaxBytes = 4 << 20
	// DefaultConcurrency bounds the sockets and goroutines of a round.
	DefaultConcurrency = 16
	// DefaultWindow smooths the fraction over a minute of traffic.
	DefaultWindow = time.Minute
	// DefaultMaxModels is well above the models one fleet serves.
	DefaultMaxModels = 64
)

// ErrConfig is wrapped by the errors of a bad Config or endpoint.
var ErrConfig = errors.New("enginemetrics: bad config")

func (c *Config) setDefaults() error {
	if c.Interval < 0 || c.Timeout < 0 || c.MaxBytes < 0 || c.Concurrency < 0 || c.MaxAge < 0 || c.Window < 0 || c.MaxModels < 0 {
		return fmt.Errorf("%w: negative setting in %+v", ErrConfig, *c)
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Timeout == 0 {
		c.Timeout = max(c.Interval, minDefaultTimeout)
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.MaxAge == 0 {
		c.MaxAge = picker.DefaultConfig().MetricsMaxAge
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.Window < time.Second {
		return fmt.Errorf("%w: window %v, want at least 1s", ErrConfig, c.Window)
	}
	if c.MaxModels == 0 {
		c.MaxModels = DefaultMaxModels
	}
	if c.Client == nil {
		c.Client = &http.Client{}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Sample is a pod's last successful scrape.
type Sample struct {
	Pod string
	Reading
	ScrapedAt time.Time
}

// PodStatus is a pod's scrape state, for an API answer or a log.
type PodStatus struct {
	Pod string `json:"pod"`
	URL string `json:"url"`
	// Errors counts failed scrapes since the pod was added.
	Errors uint64 `json:"scrape_errors"`
	// LastError is the last scrape's error, "" when it succeeded.
	LastError string `json:"last_error,omitempty"`
	// ScrapedAt is the last successful scrape, zero for none.
	ScrapedAt time.Time `json:"scraped_at"`
	// Cache is the pod's own prefix-cache lookups over the window, every
	// model together: the same increments the Fleet sums.
	Cache Fraction `json:"cache"`
}

// Scraper scrapes the engines' metrics pages and keeps each pod's latest
// sample; it feeds the counters' increments to its Fleet. It is safe for
// concurrent use.
type Scraper struct {
	cfg   Config
	log   *slog.Logger
	fleet *Fleet

	mu    sync.Mutex
	pods  map[string]*pod
	round chan struct{} // closed when the current round ends
}

// pod is one engine's scrape state.
type pod struct {
	url     string
	sample  Sample
	ok      bool // sample is set
	errors  uint64
	lastErr string
	// base is the counters as last read, the baseline of the next
	// increments; nil until the first successful scrape, which only sets
	// it (what an engine counted before kvindex saw it is not in any
	// window).
	base map[string]Counters
	// cache sums the pod's increments over the window, for its own hit
	// rate next to the fleet's.
	cache ring
}

// New makes a Scraper of endpoints (pod name -> metrics URL, such as
// http://10.0.0.5:8000/metrics). log may be nil. Run scrapes on the
// interval; Scrape runs one round.
func New(cfg Config, endpoints map[string]string, log *slog.Logger) (*Scraper, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Scraper{cfg: cfg, log: log, fleet: newFleet(cfg), pods: map[string]*pod{}, round: make(chan struct{})}
	if err := s.SetEndpoints(endpoints); err != nil {
		return nil, err
	}
	return s, nil
}

// Fleet returns the fleet figures the Scraper feeds; the picker adds its
// predictions and the responses' usage to them.
func (s *Scraper) Fleet() *Fleet { return s.fleet }

// SetEndpoints replaces the pods to scrape (as discovery changes them).
// Pods kept with the same URL keep their state; a pod whose URL changed
// starts over, as a different engine.
func (s *Scraper) SetEndpoints(endpoints map[string]string) error {
	for name, u := range endpoints {
		if err := checkURL(name, u); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, p := range s.pods {
		if u, ok := endpoints[name]; !ok || u != p.url {
			delete(s.pods, name)
		}
	}
	for name, u := range endpoints {
		if _, ok := s.pods[name]; !ok {
			s.pods[name] = &pod{url: u, cache: newRing(s.cfg.Window)}
		}
	}
	return nil
}

func checkURL(name, raw string) error {
	if name == "" {
		return fmt.Errorf("%w: empty pod name for %q", ErrConfig, raw)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%w: pod %s: %v", ErrConfig, name, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%w: pod %s: metrics URL %q, want http(s)://host:port/path", ErrConfig, name, raw)
	}
	return nil
}

// Run scrapes every Interval, the first round at once, until ctx ends.
func (s *Scraper) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		s.Scrape(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// NextRound returns a channel closed when the round in progress, or the
// next one to start, has ended: a caller can wait on fresh samples.
func (s *Scraper) NextRound() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.round
}

// Scrape scrapes every pod once, at most Concurrency at a time, and
// returns when all are done.
func (s *Scraper) Scrape(ctx context.Context) {
	s.mu.Lock()
	type job struct{ name, url string }
	jobs := make([]job, 0, len(s.pods))
	for name, p := range s.pods {
		jobs = append(jobs, job{name, p.url})
	}
	s.mu.Unlock()
	sem := make(chan struct{}, s.cfg.Concurrency)
	var wg sync.WaitGroup
	for _, j := range jobs {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			rd, err := s.fetch(ctx, j.url)
			s.record(j.name, j.url, rd, err)
		})
	}
	wg.Wait()
	s.mu.Lock()
	close(s.round)
	s.round = make(chan struct{})
	s.mu.Unlock()
}

// errTooLarge is the error of a page longer than MaxBytes.
var errTooLarge = errors.New("metrics page too large")

// fetch GETs and parses one metrics page.
func (s *Scraper) fetch(ctx context.Context, u string) (Reading, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return Reading{}, err
	}
	// The text format: what Parse reads (vLLM would answer OpenMetrics to
	// a client asking for it).
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := s.cfg.Client.Do(req)
	if err != nil {
		return Reading{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10)) //nolint:errcheck // best effort, to reuse the connection
		return Reading{}, fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	if resp.ContentLength > s.cfg.MaxBytes {
		return Reading{}, fmt.Errorf("GET %s: %w: %d bytes, limit %d", u, errTooLarge, resp.ContentLength, s.cfg.MaxBytes)
	}
	rd, err := Parse(&limitReader{r: resp.Body, n: s.cfg.MaxBytes})
	if errors.Is(err, errTooLarge) {
		return Reading{}, fmt.Errorf("GET %s: %w: over %d bytes", u, errTooLarge, s.cfg.MaxBytes)
	}
	return rd, err
}

// limitReader fails with errTooLarge past n bytes, where io.LimitReader
// would end the page early and let a truncated page parse.
type limitReader struct {
	r io.Reader
	n int64
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.n < 0 {
		return 0, errTooLarge
	}
	if int64(len(p)) > l.n+1 {
		p = p[:l.n+1]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	if l.n < 0 {
		return n, errTooLarge
	}
	return n, err
}

// record applies one scrape's outcome; url guards against a pod whose
// endpoint changed while it was scraped.
func (s *Scraper) record(name, u string, rd Reading, err error) {
	now := s.cfg.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.pods[name]
	if !ok || p.url != u {
		return
	}
	if err != nil {
		p.errors++
		// Logged on the first failure and on a change of error, not on
		// every round of an engine that stays down.
		if p.lastErr != err.Error() {
			s.log.Warn("engine metrics scrape failed", "pod", name, "url", u, "err", err, "errors", p.errors)
		}
		p.lastErr = err.Error()
		return
	}
	if p.lastErr != "" {
		s.log.Info("engine metrics scrape recovered", "pod", name, "url", u, "errors", p.errors)
	}
	p.lastErr = ""
	p.sample = Sample{Pod: name, Reading: rd, ScrapedAt: now}
	p.ok = true
	if p.base != nil {
		for model, c := range rd.Prefix {
			prev := p.base[model]
			d := Counters{Queries: c.Queries - prev.Queries, Hits: c.Hits - prev.Hits}
			// A counter that went down was reset: the engine restarted
			// and counts from zero, so all it counted is new. (A model
			// the baseline lacks is new on the engine, counted from
			// zero too.)
			if d.Queries < 0 || d.Hits < 0 {
				d = c
			}
			if d.Queries > 0 || d.Hits > 0 {
				s.fleet.engineDelta(now, model, d)
				p.cache.add(now, d)
			}
		}
	}
	p.base = rd.Prefix
	if p.base == nil {
		p.base = map[string]Counters{}
	}
}

// Latest returns the pod's last sample, and false when there is none or
// it is older than MaxAge (the engine stopped answering).
func (s *Scraper) Latest(podName string) (Sample, bool) {
	now := s.cfg.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.pods[podName]
	if !ok || !p.ok || now.Sub(p.sample.ScrapedAt) > s.cfg.MaxAge {
		return Sample{}, false
	}
	return p.sample, true
}

// Metrics returns the pod's engine metrics as picker.Candidate wants
// them; the zero Metrics (never scraped) when Latest has none.
func (s *Scraper) Metrics(podName string) picker.Metrics {
	sm, ok := s.Latest(podName)
	if !ok {
		return picker.Metrics{}
	}
	return picker.Metrics{Waiting: sm.Waiting, KVUsage: sm.KVUsage, ScrapedAt: sm.ScrapedAt}
}

// Samples returns every pod's fresh sample (see Latest), by pod name.
func (s *Scraper) Samples() []Sample {
	now := s.cfg.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Sample
	for _, p := range s.pods {
		if p.ok && now.Sub(p.sample.ScrapedAt) <= s.cfg.MaxAge {
			out = append(out, p.sample)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pod < out[j].Pod })
	return out
}

// Status returns every pod's scrape state, by pod name.
func (s *Scraper) Status() []PodStatus {
	now := s.cfg.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]PodStatus, 0, len(s.pods))
	for name, p := range s.pods {
		st := PodStatus{Pod: name, URL: p.url, Errors: p.errors, LastError: p.lastErr, Cache: p.cache.sum(now)}
		if p.ok {
			st.ScrapedAt = p.sample.ScrapedAt
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pod < out[j].Pod })
	return out
}

// MetricsURL returns the metrics page of a vLLM server at hostport (a
// picker endpoint, "10.0.0.5:8000" or "[fd00::5]:8000"): vLLM serves it
// on its API port.
func MetricsURL(hostport string) string { return "http://" + hostport + "/metrics" }
