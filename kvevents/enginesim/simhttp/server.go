package simhttp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/tokenizer"
)

// Config describes one engine's HTTP front.
type Config struct {
	// Ranks are the engine's data-parallel ranks, rank r at index r (at
	// least one). They share one hashing and one block size.
	Ranks []*enginesim.Engine
	// Model is the served model name (default: rank 0's Config().Model).
	Model string
	// Tokenizer tokenizes text prompts and rendered chat messages; nil
	// takes token-id prompts only.
	Tokenizer tokenizer.Tokenizer

	// MaxRunning is the number of requests a rank runs at once (vLLM's
	// --max-num-seqs); later ones wait. Default DefaultMaxRunning.
	MaxRunning int
	// PrefillPerToken is the time a running request takes per uncached
	// prompt token; 0 makes prefill instantaneous. kvindex sim's default
	// is DefaultPrefillPerToken.
	PrefillPerToken time.Duration
	// MaxModelLen bounds prompt plus completion tokens (default: the
	// tokens a rank's pool holds, capacity x block size).
	MaxModelLen int
	// MaxBodyBytes bounds a request body (default DefaultMaxBodyBytes).
	MaxBodyBytes int64

	// Wait passes a running request's prefill time d, returning early with
	// ctx's error (default: a timer). Tests hold requests running with it.
	Wait func(ctx context.Context, d time.Duration) error
	// Observe, if set, is called once per request to the inference and
	// tokenize endpoints, served or refused, after its response is
	// decided. It may be called concurrently.
	Observe func(Request)
}

// Request is what Observe is told about one request.
type Request struct {
	Path         string
	Status       int
	Err          string // the error message of a refused request
	Rank         int    // the rank that ran it (-1: none)
	PromptTokens int
	CachedTokens int
}

// Defaults.
const (
	// DefaultMaxRunning is smaller than vLLM's default --max-num-seqs, so
	// that requests wait, and load shows, at the rates a laptop sends.
	DefaultMaxRunning = 16
	// DefaultPrefillPerToken is about an 8B model's prefill on one
	// H100-class GPU: 50k tokens per second.
	DefaultPrefillPerToken = 20 * time.Microsecond
	// DefaultMaxBodyBytes holds a 128k-token prompt as text or as ids.
	DefaultMaxBodyBytes = 8 << 20
	// fakeTokens caps the completion: decoding is not simulated.
	fakeTokens = 16
)

// Server is one engine's HTTP front. Its handler is safe for concurrent
// use.
type Server struct {
	cfg   Config
	bs    int
	ranks []*rank
	mux   *http.ServeMux
	reg   *prometheus.Registry
	codes *prometheus.CounterVec
	ids   atomic.Uint64 // response ids
	start int64         // unix seconds, for "created"

	mu   sync.Mutex
	http *http.Server
	addr net.Addr
}

// rank is one data-parallel rank and its scheduler state.
type rank struct {
	e        *enginesim.Engine
	capacity int
	slots    chan struct{} // one token per running request
	running  atomic.Int64
	waiting  atomic.Int64
	held     atomic.Int64 // blocks the running requests hold
}

// New builds an engine's front; Start serves it, or use it as an
// http.Handler.
func New(cfg Config) (*Server, error) {
	if len(cfg.Ranks) == 0 {
		return nil, errors.New("simhttp: Config.Ranks is empty")
	}
	switch {
	case cfg.MaxRunning < 0:
		return nil, fmt.Errorf("simhttp: MaxRunning %d, want >= 0", cfg.MaxRunning)
	case cfg.PrefillPerToken < 0:
		return nil, fmt.Errorf("simhttp: PrefillPerToken %v, want >= 0", cfg.PrefillPerToken)
	case cfg.MaxModelLen < 0 || cfg.MaxBodyBytes < 0:
		return nil, fmt.Errorf("simhttp: negative MaxModelLen %d or MaxBodyBytes %d", cfg.MaxModelLen, cfg.MaxBodyBytes)
	}
	c0 := cfg.Ranks[0].Config()
	if cfg.Model == "" {
		cfg.Model = c0.Model
	}
	if cfg.MaxRunning == 0 {
		cfg.MaxRunning = DefaultMaxRunning
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.Wait == nil {
		cfg.Wait = sleep
	}
	s := &Server{cfg: cfg, bs: c0.Hasher.BlockSize(), mux: http.NewServeMux(), reg: prometheus.NewRegistry(), start: time.Now().Unix()}
	for i, e := range cfg.Ranks {
		c := e.Config()
		if c.Hasher.BlockSize() != s.bs {
			return nil, fmt.Errorf("simhttp: rank %d has blocks of %d tokens, rank 0 of %d", i, c.Hasher.BlockSize(), s.bs)
		}
		s.ranks = append(s.ranks, &rank{e: e, capacity: c.CapacityBlocks, slots: make(chan struct{}, cfg.MaxRunning)})
	}
	if s.cfg.MaxModelLen == 0 {
		s.cfg.MaxModelLen = c0.CapacityBlocks * s.bs
	}
	s.codes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "http_requests_total",
		Help: "HTTP requests by handler, method and status class (2xx, 4xx, 5xx), as vLLM's instrumentator counts them.",
	}, []string{"handler", "method", "status"})
	if err := s.reg.Register(s.codes); err != nil {
		return nil, err
	}
	if err := s.reg.Register(collector{s}); err != nil {
		return nil, err
	}
	metrics := promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})
	s.handle("POST /v1/completions", s.completions)
	s.handle("POST /v1/chat/completions", s.chatCompletions)
	s.handle("POST /tokenize", s.tokenize)
	s.handle("GET /v1/models", s.models)
	s.handle("GET /health", func(w http.ResponseWriter, _ *http.Request) int {
		w.WriteHeader(http.StatusOK)
		return http.StatusOK
	})
	s.handle("GET /metrics", func(w http.ResponseWriter, r *http.Request) int {
		metrics.ServeHTTP(w, r)
		return http.StatusOK
	})
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		code := http.StatusNotFound
		msg := "no such endpoint: " + r.Method + " " + r.URL.Path + " (this simulated vLLM engine serves POST /v1/completions, POST /v1/chat/completions, POST /tokenize, GET /v1/models, GET /metrics, GET /health)"
		for _, p := range []string{"/v1/completions", "/v1/chat/completions", "/tokenize", "/v1/models", "/metrics", "/health"} {
			if r.URL.Path == p {
				code, msg = http.StatusMethodNotAllowed, "method "+r.Method+" not allowed on "+p
			}
		}
		s.count("other", r.Method, code)
		writeError(w, code, msg)
	})
	return s, nil
}

// handle registers h for pattern, counting its responses by status class.
func (s *Server) handle(pattern string, h func(http.ResponseWriter, *http.Request) int) {
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		s.count(r.URL.Path, r.Method, h(w, r))
	})
}

func (s *Server) count(handler, method string, code int) {
	s.codes.WithLabelValues(handler, method, strconv.Itoa(code/100)+"xx").Inc()
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Model returns the served model name.
func (s *Server) Model() string { return s.cfg.Model }

// Start listens on addr (host:port; port 0 picks one) and serves in the
// background until Close.
func (s *Server) Start(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("simhttp: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.http != nil {
		l.Close()
		return errors.New("simhttp: already started")
	}
	// The timeouts keep slow or idle clients from holding connections
	// forever; a large prompt still has ample time to arrive.
	s.http = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
	s.addr = l.Addr()
	go s.http.Serve(l) //nolint:errcheck // ends with ErrServerClosed on Close
	return nil
}

// Addr returns the address Start listens on, or nil before Start.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Close stops serving and closes every connection; requests in flight
// are abandoned (their engine work is done or never starts). It is safe
// to call more than once, and before Start.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.http == nil {
		return nil
	}
	return s.http.Close()
}

// sleep is the default Wait.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// pick returns the rank a request goes to: the one the
// X-data-parallel-rank header names, or vLLM's data-parallel balancer's
// choice.
func (s *Server) pick(r *http.Request) (*rank, int, error) {
	if h := r.Header.Get("X-data-parallel-rank"); h != "" {
		i, err := strconv.Atoi(h)
		if err != nil || i < 0 || i >= len(s.ranks) {
			return nil, -1, fmt.Errorf("header X-data-parallel-rank %q: want a rank from 0 to %d", h, len(s.ranks)-1)
		}
		return s.ranks[i], i, nil
	}
	best, score := 0, int64(-1)
	for i, rk := range s.ranks {
		if sc := rk.waiting.Load()*4 + rk.running.Load(); score < 0 || sc < score {
			best, score = i, sc
		}
	}
	return s.ranks[best], best, nil
}

// errGone marks a request whose client left while it waited.
var errGone = errors.New("the client went away")

// run runs a prompt on a rank: it waits for a running slot, processes
// the prompt through the engine (storing its blocks and publishing their
// events), holds the prompt's blocks during its prefill time, and returns
// the tokens served from the cache.
func (s *Server) run(ctx context.Context, rk *rank, ids []uint64, x *blockhash.Extras) (int, error) {
	rk.waiting.Add(1)
	select {
	case rk.slots <- struct{}{}:
		// Running, in the same step as leaving the queue, so that a
		// scrape never sees the request in neither.
		rk.running.Add(1)
		rk.waiting.Add(-1)
	case <-ctx.Done():
		rk.waiting.Add(-1)
		return 0, errGone
	}
	defer func() {
		rk.running.Add(-1)
		<-rk.slots
	}()
	cached, err := rk.e.Process(ids, x)
	if err != nil {
		return 0, err
	}
	blocks := int64(min((len(ids)+s.bs-1)/s.bs, rk.capacity))
	rk.held.Add(blocks)
	defer rk.held.Add(-blocks)
	// The client leaving during prefill is not an error of the engine:
	// the blocks are cached either way, as vLLM's are once scheduled.
	_ = s.cfg.Wait(ctx, time.Duration(len(ids)-cached)*s.cfg.PrefillPerToken)
	return cached, nil
}
