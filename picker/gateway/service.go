package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/internal/inflight"
	"github.com/kvindex/kvindex/internal/memlimit"
	"github.com/kvindex/kvindex/picker"
	"github.com/kvindex/kvindex/tokenizer"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Defaults; every default is written here only.
const (
	// DefaultIndexTimeout bounds a query of the index: past it the
	// request is routed without the prefix (load and session only). A
	// gateway adds this to every request's latency at worst.
	DefaultIndexTimeout = 2 * time.Millisecond
	// DefaultIndexTimeoutPer1K is what the index deadline grows by per
	// 1,000 tokens of the prompt (IndexBudget): re-prefilling a long
	// prompt on the wrong pod costs the GPU seconds, waiting a little
	// longer for the index's answer costs milliseconds.
	DefaultIndexTimeoutPer1K = 250 * time.Microsecond
	// DefaultMaxBody bounds a request body the picker buffers: a 128k-token
	// conversation as text with room to spare. Larger requests are refused
	// (413) rather than routed blind.
	DefaultMaxBody = 8 << 20
	// BodiesInFlightFactor sizes the default Config.MaxBodyInFlight: this
	// many bodies of the largest size buffered at once.
	BodiesInFlightFactor = 4
	// DefaultWarmTimeout bounds warming the index's connection at start
	// and after each reconnect (Service.Warm): connection setup, not a
	// query, so far above IndexTimeout.
	DefaultWarmTimeout = 10 * time.Second
	// DefaultPickHold is how long a /v1/pick decision counts as in flight
	// on its pod: the HTTP caller never says when the request ends, so
	// the count decays after about a request's prefill.
	DefaultPickHold = 2 * time.Second
)

// Endpoint is one pod the picker routes to: its name as the index knows
// it and the host:port requests go to.
type Endpoint struct {
	Pod  string
	Addr string
}

// ParseEndpoint reads "POD=HOST:PORT".
func ParseEndpoint(s string) (Endpoint, error) {
	pod, addr, ok := strings.Cut(s, "=")
	if !ok || pod == "" || addr == "" {
		return Endpoint{}, fmt.Errorf("endpoint %q: want POD=HOST:PORT", s)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return Endpoint{}, fmt.Errorf("endpoint %q: %v", s, err)
	}
	return Endpoint{Pod: pod, Addr: addr}, nil
}

// Config configures a Service.
type Config struct {
	// Endpoints are the candidates; at least one unless Dynamic, pods
	// and addresses unique.
	Endpoints []Endpoint
	// Dynamic: the candidates change at run time (SetEndpoints), so
	// Endpoints may start empty; until there are some, every pick
	// fails with ErrNoEndpoint.
	Dynamic bool
	// Scorer configures the scoring (picker.DefaultConfig when zero).
	Scorer picker.Config
	// IndexTimeout and IndexTimeoutPer1K bound each index query
	// (IndexBudget; DefaultIndexTimeout and DefaultIndexTimeoutPer1K if
	// 0; a negative IndexTimeoutPer1K: a fixed IndexTimeout).
	IndexTimeout      time.Duration
	IndexTimeoutPer1K time.Duration
	// HashMemoEntries sizes the memo of the block keys the picker hashed
	// (DefaultHashMemoEntries if 0).
	HashMemoEntries int
	// MaxBody bounds a buffered request body (DefaultMaxBody if 0).
	MaxBody int
	// MaxBodyInFlight bounds the request bodies buffered at once, across
	// ext_proc streams and /v1/pick requests: a request whose body would
	// pass it is answered 429, so that many large or endless bodies
	// cannot each be buffered up to MaxBody at the same time
	// (BodiesInFlightFactor x MaxBody if 0, or with a MemoryBudget its
	// share, memlimit.BodyBytes). Small bodies have a reserve beyond it
	// (inflight.BodyReserve), so that large ones cannot turn them away.
	MaxBodyInFlight int64
	// MemoryBudget is the process's memory budget (bytes, 0 for none),
	// which sizes the default MaxBodyInFlight.
	MemoryBudget int64
	// PickHold is how long a /v1/pick counts as in flight
	// (DefaultPickHold if 0).
	PickHold time.Duration
	// UnknownModel is what ext_proc does with a request whose model the
	// index does not know (UnknownModelRoute if ""); /v1/pick always
	// answers it 404.
	UnknownModel UnknownModel
	// Tokenizer, if set, tokenizes the prompts given as text or chat
	// messages in the picker (kvindex picker --tokenizer), so that they
	// go the token ids' way (hashed into the index's block keys here)
	// rather than to the index as text, which the index must tokenize
	// within the query's deadline (the engine's /tokenize, for chat). A
	// prompt it declines (tokenizer.ErrChatUnsupported,
	// ErrChatTemplate) or fails, and a form CheckTokenizer turned off,
	// go to the index as text, as without it.
	Tokenizer tokenizer.Tokenizer
	// TokenizerModel, if set, is the model Tokenizer tokenizes for: the
	// other models' prompts go to the index as text.
	TokenizerModel string
	// Metrics, if set, gives the engines' scraped load metrics.
	Metrics MetricsSource
	// Outcomes, if set, hears what each ext_proc pick predicted and the
	// response that came back (see Outcomes).
	Outcomes Outcomes
	// Registry receives the picker's metrics; none if nil.
	Registry prometheus.Registerer
	// Logger; slog.Default if nil.
	Logger *slog.Logger
	// Now is the clock (time.Now if nil).
	Now func() time.Time
	// Tracer, if set, records a span for each pick (SpanPick, a child of
	// the request's traceparent: the gateway's span), and within it the
	// picker's tokenizing (SpanTokenize) and hashing (SpanHash) of the
	// prompt; the index query carries the pick's context. nil: no
	// spans, at the cost of a nil check.
	Tracer trace.Tracer
}

// endpoint is an Endpoint and its in-flight counts.
type endpoint struct {
	Endpoint
	inFlight, interactive atomic.Int64
}

// Service picks an endpoint for each request: it reads the request, asks
// the index which pods hold its prompt, and scores the candidates. The
// ext_proc server and the HTTP handler are two fronts on it. Safe for
// concurrent use.
type Service struct {
	cfg    Config
	src    Source
	scorer *picker.Scorer
	set    atomic.Pointer[endpointSet]
	setMu  sync.Mutex // serialises SetEndpoints
	log    *slog.Logger
	m      *metrics
	pool   sync.Pool // *pickState
	bodies inflight.Gate
	idx    indexState
	fbLog  *fallbackLog
	// hash is the index's hashing as the picker learnt it (learnHashing);
	// nil while it is not known: queries then send token ids.
	hash atomic.Pointer[hashing]
	lt   *localTokenizer // nil without Config.Tokenizer
	cpu  chan struct{}   // the requests doing their CPU work (cpuSlots)
	body chan struct{}   // the ext_proc requests reading their body (bodySlots)
}

// endpointSet is the candidates, replaced whole by SetEndpoints so that a
// pick reads one consistent set without a lock.
type endpointSet struct {
	eps    []*endpoint
	byAddr map[string]*endpoint
	pods   []string
}

// newEndpointSet checks eps and builds their set, keeping the endpoints
// (and so the in-flight counts) of old that are listed again unchanged.
func newEndpointSet(eps []Endpoint, old *endpointSet) (*endpointSet, error) {
	set := &endpointSet{byAddr: make(map[string]*endpoint, len(eps))}
	seen := map[string]bool{}
	for _, e := range eps {
		if e.Pod == "" || e.Addr == "" {
			return nil, fmt.Errorf("gateway: endpoint %+v: pod and address are required", e)
		}
		if seen[e.Pod] || set.byAddr[e.Addr] != nil {
			return nil, fmt.Errorf("gateway: endpoint %s=%s: pod or address listed twice", e.Pod, e.Addr)
		}
		seen[e.Pod] = true
		ep := &endpoint{Endpoint: e}
		if old != nil {
			if o := old.byAddr[e.Addr]; o != nil && o.Endpoint == e {
				ep = o
			}
		}
		set.eps = append(set.eps, ep)
		set.byAddr[e.Addr] = ep
		set.pods = append(set.pods, e.Pod)
	}
	return set, nil
}

type pickState struct {
	cands []picker.Candidate
	pre   map[string]picker.Prefix
	req   kvindexv1.LongestPrefixRequest
}

// New returns a Service asking src.
func New(cfg Config, src Source) (*Service, error) {
	var err error
	if src == nil {
		return nil, errors.New("gateway: no index source")
	}
	if len(cfg.Endpoints) == 0 && !cfg.Dynamic {
		return nil, errors.New("gateway: no endpoints (give at least one POD=HOST:PORT)")
	}
	if cfg.Scorer == (picker.Config{}) {
		cfg.Scorer = picker.DefaultConfig()
	}
	if cfg.IndexTimeout < 0 || cfg.MaxBody < 0 || cfg.PickHold < 0 {
		return nil, fmt.Errorf("gateway: negative index timeout %v, max body %d or pick hold %v", cfg.IndexTimeout, cfg.MaxBody, cfg.PickHold)
	}
	if cfg.IndexTimeout == 0 {
		cfg.IndexTimeout = DefaultIndexTimeout
	}
	switch {
	case cfg.IndexTimeoutPer1K == 0:
		cfg.IndexTimeoutPer1K = DefaultIndexTimeoutPer1K
	case cfg.IndexTimeoutPer1K < 0:
		cfg.IndexTimeoutPer1K = 0
	}
	if cfg.MaxBody == 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	if cfg.MaxBodyInFlight <= 0 {
		cfg.MaxBodyInFlight = memlimit.BodyBytes(cfg.MemoryBudget, int64(cfg.MaxBody), BodiesInFlightFactor*int64(cfg.MaxBody))
	}
	if cfg.PickHold == 0 {
		cfg.PickHold = DefaultPickHold
	}
	if cfg.UnknownModel, err = ParseUnknownModel(string(cfg.UnknownModel)); err != nil {
		return nil, fmt.Errorf("gateway: unknown-model policy %q: %v", cfg.UnknownModel, err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	sc, err := picker.New(cfg.Scorer)
	if err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, src: src, scorer: sc, log: cfg.Logger, fbLog: newFallbackLog(cfg.Logger, cfg.Now), bodies: inflight.Gate{Max: cfg.MaxBodyInFlight, Reserve: inflight.BodyReserve(cfg.MaxBodyInFlight)}}
	set, err := newEndpointSet(cfg.Endpoints, nil)
	if err != nil {
		return nil, err
	}
	s.set.Store(set)
	s.pool.New = func() any { return &pickState{pre: map[string]picker.Prefix{}} }
	if s.m, err = newMetrics(cfg.Registry, s.bodies.InFlight); err != nil {
		return nil, err
	}
	s.cpu = make(chan struct{}, cpuSlots())
	s.body = make(chan struct{}, bodySlots())
	if s.lt, err = newLocalTokenizer(&cfg); err != nil {
		return nil, err
	}
	return s, nil
}

// SetEndpoints replaces the candidates (Config.Dynamic: discovery). An
// endpoint listed again with the same pod and address keeps its
// in-flight counts; requests in flight on a removed one end as usual.
func (s *Service) SetEndpoints(eps []Endpoint) error {
	if !s.cfg.Dynamic {
		return errors.New("gateway: SetEndpoints on a Service whose endpoints are fixed (Config.Dynamic is false)")
	}
	s.setMu.Lock()
	defer s.setMu.Unlock()
	set, err := newEndpointSet(eps, s.set.Load())
	if err != nil {
		return err
	}
	s.set.Store(set)
	return nil
}

// MaxBody is the largest request body the Service reads.
func (s *Service) MaxBody() int { return s.cfg.MaxBody }

// ErrNoEndpoint is matched by Pick's error when no candidate may serve
// the request (none, or none in the subset hint): answer 503.
var ErrNoEndpoint = picker.ErrNoCandidates

// Pick chooses an endpoint for r among the candidates (only those in
// subset when it is not nil: the gateway's hint, by address or pod). The
// chosen endpoint counts the request as in flight until done is called
// (done is idempotent). r may be nil for a request without a body. With
// Config.Tokenizer, a text or chat prompt it tokenizes is replaced by its
// ids (r.Prompt and r.Tokens).
//
// When the index's answer is missing the request is routed by load and
// session, and d.Fallback says why. A model the index does not know is
// such a fallback under UnknownModelRoute, and an error matching
// ErrUnknownModel (naming the model) under UnknownModelReject.
func (s *Service) Pick(ctx context.Context, r *Request, subset []string) (d picker.Decision, done func(), err error) {
	return s.pick(ctx, r, subset, s.cfg.UnknownModel == UnknownModelReject)
}

// pick is Pick, rejecting an unknown model when rejectUnknown.
func (s *Service) pick(ctx context.Context, r *Request, subset []string, rejectUnknown bool) (d picker.Decision, done func(), err error) {
	if s.cfg.Tracer != nil {
		var span trace.Span
		ctx, span = s.startPick(ctx, r)
		defer func() { endPick(span, d, err) }()
	}
	if r != nil {
		if r.cpu == nil {
			if r.cpu = s.enterCPU(ctx); r.cpu == nil {
				s.m.picks.WithLabelValues("error").Inc()
				return d, nil, ctx.Err()
			}
		}
		defer r.cpu.leave() // if the index was not asked
	}
	st := s.pool.Get().(*pickState)
	defer s.pool.Put(st)
	if subset != nil && len(subset) == 0 {
		s.m.picks.WithLabelValues("no_endpoint").Inc()
		return d, nil, fmt.Errorf("%w: the subset hint is empty", ErrNoEndpoint)
	}
	preq := &picker.Request{Subset: subset}
	if r != nil && s.lt != nil {
		s.lt.tokenize(ctx, s, r)
	}
	if r != nil {
		preq.Model, preq.Session, preq.Priority, preq.TieBreak = r.Model, r.Session, r.Priority, r.BodyHash
		preq.Keys = blockKeys(r.Tokens, s.cfg.Scorer.BlockSize)
		preq.Tokens = len(r.Tokens)
	}
	clear(st.pre)
	var seq uint64
	var fallback picker.Fallback
	set := s.set.Load()
	if r != nil && r.Prompt != nil {
		var n int
		var qerr error
		if n, seq, fallback, qerr = s.query(ctx, r, st, set.pods); n > 0 {
			preq.Tokens = n
		}
		if fallback == picker.FallbackUnknownModel && rejectUnknown {
			s.m.picks.WithLabelValues("unknown_model").Inc()
			s.fbLog.note(fallback, r.Model, "picker: request for a model the index does not know refused (404)", qerr)
			return d, nil, unknownModelError{msg: status.Convert(qerr).Message()}
		}
		if fallback != "" {
			s.m.fallbacks.WithLabelValues(string(fallback)).Inc()
			s.fbLog.note(fallback, r.Model, "picker: request routed by load and session, without the index's answer", qerr)
		}
	}
	now := s.cfg.Now()
	st.cands = st.cands[:0]
	for _, e := range set.eps {
		c := picker.Candidate{Pod: e.Pod, Endpoint: e.Addr, InFlight: int(e.inFlight.Load()), InFlightInteractive: int(e.interactive.Load()), Prefix: st.pre[e.Pod]}
		if s.cfg.Metrics != nil {
			c.Metrics, _ = s.cfg.Metrics.EngineMetrics(e.Pod)
		}
		st.cands = append(st.cands, c)
	}
	d, err = s.scorer.Pick(now, preq, st.cands)
	if err != nil {
		if errors.Is(err, picker.ErrNoCandidates) {
			s.m.picks.WithLabelValues("no_endpoint").Inc()
		} else {
			s.m.picks.WithLabelValues("error").Inc()
		}
		return d, nil, err
	}
	s.m.picks.WithLabelValues("ok").Inc()
	d.IndexSeq, d.Fallback = seq, fallback
	ep := set.byAddr[d.Endpoint]
	interactive := preq.Priority == picker.Interactive
	ep.inFlight.Add(1)
	if interactive {
		ep.interactive.Add(1)
	}
	var once sync.Once
	return d, func() {
		once.Do(func() {
			ep.inFlight.Add(-1)
			if interactive {
				ep.interactive.Add(-1)
			}
		})
	}, nil
}

// query asks the index within IndexTimeout and fills st.pre; on failure
// st.pre stays empty (the request is scored by load and session only)
// and fallback says why, err what the index said. It returns the
// prompt's length in tokens as the index counted it (0 when unknown) and
// the index sequence the answer reflects (index_seq; 0 without an
// answer). While the remote index is known to be unreachable it is not
// asked: the request would only wait for the deadline.
func (s *Service) query(ctx context.Context, r *Request, st *pickState, pods []string) (tokens int, seq uint64, fallback picker.Fallback, err error) {
	state := s.idx.state.Load()
	if state == idxDown {
		return 0, 0, picker.FallbackIndexUnreachable, nil
	}
	st.req.Model = r.Model
	st.req.CandidatePods = pods
	hs, hashed := s.tracedHashedPrompt(ctx, r)
	// The request's CPU work is done: the slot goes to the next request,
	// and the index's deadline runs from here.
	r.cpu.leave()
	ctx, cancel := context.WithTimeout(ctx, IndexBudget(s.cfg.IndexTimeout, s.cfg.IndexTimeoutPer1K, r.tokenCount()))
	defer cancel()
	start := time.Now()
	if hashed != nil {
		st.req.Prompt = hashed
		s.m.queries.WithLabelValues(inputHashes).Inc()
	} else {
		st.req.Prompt, r.idsSent = r.Prompt, true
		s.m.queries.WithLabelValues(inputOf(r.Prompt)).Inc()
	}
	resp, err := s.src.LongestPrefix(ctx, &st.req)
	if hashed != nil && status.Code(err) == codes.FailedPrecondition {
		// The index refused the picker's keys: it hashes otherwise than
		// the picker learnt. Never again with this hashing; this request
		// asks again with its ids, within what is left of its deadline.
		s.dropHashing(hs, err)
		st.req.Prompt, r.idsSent = r.Prompt, true
		s.m.queries.WithLabelValues(inputOf(r.Prompt)).Inc()
		resp, err = s.src.LongestPrefix(ctx, &st.req)
	}
	st.req.Prompt = nil
	s.m.indexSeconds.Observe(time.Since(start).Seconds())
	if err != nil {
		fallback = fallbackOf(ctx, err)
		if fallback == picker.FallbackTimeout && state == idxConnecting {
			// No connection has been warm yet: the deadline passed while
			// connecting.
			fallback = picker.FallbackIndexUnreachable
		}
		return 0, 0, fallback, err
	}
	prefixes(resp, s.cfg.Scorer.BlockSize, st.pre)
	return int(resp.GetPromptTokens()), resp.GetIndexSeq(), "", nil
}

// hold counts d's request as in flight for PickHold, for callers that
// never report the end of the request (/v1/pick).
func (s *Service) hold(done func()) { time.AfterFunc(s.cfg.PickHold, done) }

// InFlight returns the requests the picker counts in flight on the pod
// at addr.
func (s *Service) InFlight(addr string) int {
	if e := s.set.Load().byAddr[addr]; e != nil {
		return int(e.inFlight.Load())
	}
	return 0
}

// busyMessage answers a request refused by Config.MaxBodyInFlight.
func (s *Service) busyMessage() string {
	return "picker busy: the request bodies being buffered would exceed " + strconv.FormatInt(s.bodies.Max, 10) + " bytes; retry shortly"
}
