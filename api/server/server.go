package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/api/indexerv1"
	"github.com/kvindex/kvindex/api/internal/wire"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/api/server/security"
	"github.com/kvindex/kvindex/api/watchhub"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/internal/inflight"
	"github.com/kvindex/kvindex/kvevents"
)

// Defaults of Config.
const (
	// DefaultMaxTokens bounds the token ids of one query: 1 Mi tokens is
	// far beyond any model's context.
	DefaultMaxTokens = 1 << 20
	// MaxMaxTokens bounds MaxTokens: a query's gRPC message (MaxRecvMsgSize,
	// ten bytes per id) stays below 2 GiB, and every count of an answer
	// fits its uint32 field.
	MaxMaxTokens      = 200_000_000
	DefaultReadyGrace = 30 * time.Second
)

// Index is what the server needs from the index; *indexer.Index
// implements it.
type Index interface {
	LongestPrefix(q *indexer.Query, res *indexer.Result) error
	Lookup(q *indexer.Query) ([]indexer.BlockHolders, error)
	Engines() []indexer.EngineInfo
	Models() []string
	Stats() indexer.Stats
}

var _ Index = (*indexer.Index)(nil)

// Config configures a Server.
type Config struct {
	// Index answers the queries. Required.
	Index Index
	// BlockSize is the fleet's tokens per block (the hasher's), reported
	// by queries by block hashes. Required.
	BlockSize int
	// Hasher is the index's hashing (its BlockSize is BlockSize): what
	// GetHashConfig reports, and what a query by block hashes that
	// carries a config digest must have been made with. nil: unknown
	// (GetHashConfig answers Unimplemented, and such queries are refused).
	Hasher *blockhash.Hasher
	// Tokenizers turn text and chat messages into token ids, tried in
	// order (typically the engine's /tokenize, then a local
	// tokenizer.json). None: such prompts fail with FailedPrecondition.
	Tokenizers []NamedTokenizer
	// Hub feeds Watch: the hub the subscriber applies its batches
	// through (its sink). nil disables Watch (Unavailable).
	Hub *watchhub.Hub
	// Streams reports ingest state for ListPods, health and metrics; nil
	// means no ingest.
	Streams StreamSource
	// Fleet gives ListPods the fleet's cached-prefix fraction; nil: none
	// (no picker scraping the engines).
	Fleet FleetSource
	// TokenizerChecks gives ListPods the comparison of the local
	// tokenizer with the engine's /tokenize, per prompt form, once made;
	// nil: none.
	TokenizerChecks func() []TokenizerCheck
	// IndexSeq reports the index sequence: how far through its ordered
	// input the index has applied, so that the answers of kvindex
	// replicas fed the same input can be compared. Fed from a NATS
	// JetStream stream, it is the stream sequence of the last message
	// the index applied (the stream consumer's AppliedSeq); it only
	// grows. nil reports 0: an index fed straight from the engines'
	// sockets has no sequence another replica shares.
	//
	// Answers carry it as index_seq: LongestPrefix and ListPods (gRPC
	// and HTTP/JSON) and, through them, the picker's decisions. It is
	// read just before the index is asked, so an answer reflects every
	// message through index_seq, and, while messages are being applied,
	// possibly some after it. The index is a function of the messages it
	// applied, in order: two replicas that report the same index_seq,
	// asked the same request while neither was applying a message, give
	// the same answer. The one exception is an engine's health, which
	// also follows each replica's own view of the relays' heartbeats and
	// can differ between replicas for a heartbeat timeout's time.
	IndexSeq func() uint64
	// DefaultModel is the model of requests that name none.
	DefaultModel string
	// MaxTokens bounds a query's token ids (and block hashes, as blocks
	// of BlockSize tokens); DefaultMaxTokens if 0.
	MaxTokens int
	// ExpectStreams is the number of streams that must be connected for
	// readiness (connect mode: every configured engine rank). 0 (bind
	// mode): ready at the first applied event.
	ExpectStreams int
	// ReadyGrace makes the server ready after this long in any case;
	// DefaultReadyGrace if 0, never if negative.
	ReadyGrace time.Duration
	// ReadyWhen, if not nil, makes the server ready once it is closed
	// (e.g. a replica that has caught up with its event log), instead of
	// waiting for ExpectStreams; ReadyGrace still applies.
	ReadyWhen <-chan struct{}
	// Limits bound the server's resources (zero fields: DefaultLimits).
	// The embedded watch bounds are the Hub's: build it with them.
	Limits Limits
	// Security configures TLS and caller authorization; the zero value
	// serves plaintext to every caller.
	Security security.Config
	// Registry receives the server's metrics; a new one if nil.
	Registry *prometheus.Registry
	// Logger logs the server's noteworthy events; slog.Default if nil.
	Logger *slog.Logger
	// Now is the clock (time.Now if nil).
	Now func() time.Time
	// Tracer, if set, records a span for each tokenizing of a prompt
	// (SpanTokenize) and each walk of the index (SpanIndexWalk), as
	// children of the call's span; nil: no spans, at the cost of a nil
	// check.
	Tracer trace.Tracer
}

// Server implements kvindex.v1.IndexService and llm-d's
// indexer.v1.IndexerService over an Index, and serves the same answers
// over HTTP/JSON (Handler).
type Server struct {
	kvindexv1.UnimplementedIndexServiceServer
	indexerv1.UnimplementedIndexerServiceServer

	cfg     Config
	index   Index
	hashing *kvindexv1.HashConfig // nil without Config.Hasher
	log     *slog.Logger
	now     func() time.Time
	start   time.Time
	metrics *metrics
	health  *health.Server

	ready     atomic.Bool
	readyOnce sync.Once
	readyCh   chan struct{}

	view      atomic.Pointer[healthView]
	refreshMu sync.Mutex

	tokens tokenGate
	bodies inflight.Gate // HTTP request body bytes being read (Limits.MaxBodyBytesInFlight)
	conns  connStats

	certs    *security.Reloader[security.Certs]  // nil without TLS
	auth     *security.Reloader[security.Policy] // nil without an auth file
	authMode authMode
	sec      securityMetrics
}

// NamedTokenizer is one tokenizer backend and the token_source name its
// answers carry ("engine" for the engine's /tokenize, "local" for a
// tokenizer.json).
type NamedTokenizer struct {
	Source    string
	Tokenizer Tokenizer
}

// New returns a Server for cfg.
func New(cfg Config) (*Server, error) {
	if cfg.Index == nil {
		return nil, errors.New("server: Config.Index is required")
	}
	if cfg.BlockSize < 1 {
		return nil, errors.New("server: Config.BlockSize must be >= 1")
	}
	if cfg.Hasher != nil && cfg.Hasher.BlockSize() != cfg.BlockSize {
		return nil, fmt.Errorf("server: Config.Hasher's block size %d is not Config.BlockSize %d", cfg.Hasher.BlockSize(), cfg.BlockSize)
	}
	if cfg.MaxTokens <= 0 {
		cfg.MaxTokens = DefaultMaxTokens
	}
	if cfg.MaxTokens > MaxMaxTokens {
		return nil, configerr.Within("server", configerr.New(FieldMaxTokens, "%v %d is above %d", FieldMaxTokens, cfg.MaxTokens, MaxMaxTokens))
	}
	if cfg.ReadyGrace == 0 {
		cfg.ReadyGrace = DefaultReadyGrace
	}
	cfg.Limits = cfg.Limits.withDefaults(cfg.MaxTokens)
	if err := cfg.Limits.Check(cfg.MaxTokens); err != nil {
		return nil, configerr.Within("server", err)
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	for i, t := range cfg.Tokenizers {
		if t.Tokenizer == nil || t.Source == "" {
			return nil, fmt.Errorf("server: Config.Tokenizers[%d] needs a Source and a Tokenizer", i)
		}
	}
	s := &Server{
		cfg:     cfg,
		index:   cfg.Index,
		log:     cfg.Logger,
		now:     cfg.Now,
		start:   cfg.Now(),
		health:  health.NewServer(),
		readyCh: make(chan struct{}),
		tokens:  tokenGate{Gate: inflight.Gate{Max: cfg.Limits.MaxTokensInFlight}},
		bodies:  inflight.Gate{Max: cfg.Limits.MaxBodyBytesInFlight, Reserve: inflight.BodyReserve(cfg.Limits.MaxBodyBytesInFlight)},
	}
	if h := cfg.Hasher; h != nil {
		c := h.Config()
		s.hashing = &kvindexv1.HashConfig{Algo: string(c.Algo), Seed: c.Seed, BlockSize: uint32(c.BlockSize), Digest: h.Digest()}
	}
	m, err := newMetrics(s, cfg.Registry)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	if err := s.setupSecurity(); err != nil {
		return nil, configerr.Within("server", err)
	}
	for _, svc := range healthServices {
		s.health.SetServingStatus(svc, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	return s, nil
}

// healthServices are the names the gRPC health service reports on: the
// whole server ("") and each API.
var healthServices = []string{"", kvindexv1.IndexService_ServiceDesc.ServiceName, indexerv1.IndexerService_ServiceDesc.ServiceName}

// Registry is the registry holding the server's metrics.
func (s *Server) Registry() *prometheus.Registry { return s.cfg.Registry }

// MaxRecvMsgSize is the gRPC message size a query of MaxTokens token ids
// needs: ten bytes per id at most (a varint), plus room for the rest.
func (s *Server) MaxRecvMsgSize() int { return s.cfg.MaxTokens*10 + 1<<20 }

// NewGRPCServer returns a gRPC server with the kvindex and indexer APIs,
// the standard health service (NOT_SERVING until Ready) and reflection
// registered. Its codec decodes prompts into pooled buffers; opts are
// appended to the server's own options.
//
// Its bounds come from Config.Limits: concurrent streams per connection,
// keepalive (idle connections closed, dead peers found, clients pinging
// too often refused) and the message size (MaxRecvMsgSize).
func (s *Server) NewGRPCServer(opts ...grpc.ServerOption) *grpc.Server {
	base := append(s.transportOptions(),
		grpc.ForceServerCodecV2(poolingCodec{}),
		grpc.ChainUnaryInterceptor(s.authUnary, s.metrics.unaryInterceptor),
		grpc.ChainStreamInterceptor(s.authStream),
	)
	if cfg := s.GRPCTLSConfig(); cfg != nil {
		base = append(base, grpc.Creds(credentials.NewTLS(cfg)))
	}
	gs := grpc.NewServer(append(base, opts...)...)
	s.Register(gs)
	healthpb.RegisterHealthServer(gs, s.health)
	reflection.Register(gs)
	return gs
}

// transportOptions are the gRPC server's transport settings: buffers,
// flow-control windows and the bounds from Config.Limits.
func (s *Server) transportOptions() []grpc.ServerOption {
	l := s.cfg.Limits
	return []grpc.ServerOption{
		experimental.BufferPool(wire.Buffers),   // see wire.BufferPool
		grpc.InitialWindowSize(wire.WindowSize), // see wire.WindowSize
		grpc.InitialConnWindowSize(wire.ConnWindowSize),
		grpc.ReadBufferSize(wire.IOBufferSize),
		grpc.WriteBufferSize(wire.IOBufferSize),

		grpc.MaxRecvMsgSize(s.MaxRecvMsgSize()),
		grpc.MaxConcurrentStreams(l.GRPCMaxStreams),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: l.GRPCMaxConnIdle, Time: l.GRPCKeepaliveTime, Timeout: l.GRPCKeepaliveTimeout,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: l.GRPCKeepaliveMinTime, PermitWithoutStream: true}),
	}
}

// Register registers the kvindex and indexer APIs on gs (without health,
// reflection or the pooling codec; NewGRPCServer adds those).
func (s *Server) Register(gs grpc.ServiceRegistrar) {
	kvindexv1.RegisterIndexServiceServer(gs, grpcIndexService{s})
	indexerv1.RegisterIndexerServiceServer(gs, s)
}

// Run drives readiness until ctx is done: it flips the gRPC health
// service to SERVING once Ready, and to NOT_SERVING when ctx ends. Meanwhile
// it logs each engine the index flags (a hash mismatch), once per message.
func (s *Server) Run(ctx context.Context) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var first <-chan struct{}
	if s.cfg.Hub != nil {
		first = s.cfg.Hub.FirstEvent()
	}
	for !s.Ready() {
		select {
		case <-ctx.Done():
			s.Shutdown()
			return
		case <-first:
			first = nil
		case <-tick.C:
		}
	}
	flagged := map[kvevents.EngineID]string{}
	check := time.NewTicker(engineCheckInterval)
	defer check.Stop()
	for {
		s.logFlagged(flagged)
		select {
		case <-ctx.Done():
			s.Shutdown()
			return
		case <-check.C:
		}
	}
}

// engineCheckInterval is how often Run looks for newly flagged engines.
const engineCheckInterval = 2 * time.Second

// logFlagged warns about engines whose flag message is new.
func (s *Server) logFlagged(logged map[kvevents.EngineID]string) {
	for _, e := range s.index.Engines() {
		if e.Message == "" || logged[e.Engine] == e.Message {
			continue
		}
		logged[e.Engine] = e.Message
		s.log.Warn("engine flagged", "pod", e.Engine.Pod, "dp_rank", e.Engine.DPRank, "model", e.Engine.Model,
			"hash_check", e.HashCheck.String(), "message", e.Message)
	}
}

// Shutdown reports NOT_SERVING on the health service and ends every Watch
// stream, so that a graceful stop of the gRPC server can complete.
func (s *Server) Shutdown() {
	s.health.Shutdown()
	if s.cfg.Hub != nil {
		s.cfg.Hub.Close()
	}
}

// Ready reports whether the server is ready: every expected stream has
// connected (bind mode: an event was applied), or the grace period has
// passed. Once ready it stays ready.
func (s *Server) Ready() bool {
	if s.ready.Load() {
		return true
	}
	if !s.computeReady() {
		return false
	}
	s.readyOnce.Do(func() {
		s.ready.Store(true)
		close(s.readyCh)
		for _, svc := range healthServices {
			s.health.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
		}
		s.log.Info("ready", "after", s.now().Sub(s.start).Round(time.Millisecond).String())
	})
	return true
}

// ReadyC is closed once the server is ready.
func (s *Server) ReadyC() <-chan struct{} { return s.readyCh }

func (s *Server) computeReady() bool {
	if g := s.cfg.ReadyGrace; g > 0 && s.now().Sub(s.start) >= g {
		return true
	}
	if s.cfg.ReadyWhen != nil {
		select {
		case <-s.cfg.ReadyWhen:
			return true
		default:
			return false
		}
	}
	if s.cfg.ExpectStreams <= 0 {
		return s.cfg.Hub != nil && s.cfg.Hub.SawEvent()
	}
	if s.cfg.Streams == nil {
		return false
	}
	connected := 0
	for _, st := range s.cfg.Streams.Streams() {
		if st.Connected && !st.Bind {
			connected++
		}
	}
	return connected >= s.cfg.ExpectStreams
}

// healthView caches, for queries, what the streams and the index say
// about engines and models: a query must not snapshot every stream each
// time.
type healthView struct {
	at     time.Time
	health map[kvevents.EngineID]kvindexv1.EngineHealth
	// streams are the engines kvindex follows, by model: configured ones
	// from the start, discovered ones (bind mode) from their first message.
	streams map[string]*followed
	// models are the models known at the refresh (knownModels).
	models map[string]bool
}

// followed are the engines of one model that kvindex follows, sorted by
// pod and rank, and the same by pod.
type followed struct {
	all   []kvevents.EngineID
	byPod map[string][]kvevents.EngineID
}

// healthViewTTL bounds how stale the health a query reports may be.
const healthViewTTL = 250 * time.Millisecond

func (s *Server) healthOf() *healthView {
	v := s.view.Load()
	if v != nil && s.now().Sub(v.at) < healthViewTTL {
		return v
	}
	if !s.refreshMu.TryLock() {
		if v != nil {
			return v // another query is refreshing it
		}
		s.refreshMu.Lock()
	}
	defer s.refreshMu.Unlock()
	if nv := s.view.Load(); nv != v && nv != nil {
		return nv
	}
	nv := &healthView{
		at:      s.now(),
		health:  make(map[kvevents.EngineID]kvindexv1.EngineHealth),
		streams: make(map[string]*followed),
		models:  make(map[string]bool),
	}
	var streams []kvevents.StreamStats
	if s.cfg.Streams != nil {
		streams = s.cfg.Streams.Streams()
	}
	for _, st := range streams {
		nv.health[st.Engine] = streamHealth(&st)
		f := nv.streams[st.Engine.Model]
		if f == nil {
			f = &followed{byPod: make(map[string][]kvevents.EngineID)}
			nv.streams[st.Engine.Model] = f
		}
		f.all = append(f.all, st.Engine)
		f.byPod[st.Engine.Pod] = append(f.byPod[st.Engine.Pod], st.Engine)
	}
	for _, f := range nv.streams {
		slices.SortFunc(f.all, compareEngines)
		for _, es := range f.byPod {
			slices.SortFunc(es, compareEngines)
		}
	}
	for _, m := range s.index.Models() {
		nv.models[m] = true
	}
	for _, st := range streams {
		nv.models[st.Engine.Model] = true
	}
	if s.cfg.DefaultModel != "" {
		nv.models[s.cfg.DefaultModel] = true
	}
	delete(nv.models, "") // no request names it: it resolves to the default
	s.view.Store(nv)
	return nv
}

func compareEngines(a, b kvevents.EngineID) int {
	return cmp.Or(cmp.Compare(a.Pod, b.Pod), cmp.Compare(a.DPRank, b.DPRank))
}

// checkModel refuses a model this kvindex does not know with NotFound,
// naming the models it knows: the default model (--model), the models of
// the engines it follows (configured ones before their first event
// included) and the models the index holds. A model unknown at the view's
// refresh is looked for in the index again before it is refused, as its
// first event may have come since; that costs a refused request no more
// than a look at the index's few models.
func (s *Server) checkModel(model string, hv *healthView) error {
	if model == s.cfg.DefaultModel || hv.models[model] {
		return nil
	}
	known := s.index.Models()
	if slices.Contains(known, model) {
		return nil
	}
	for m := range hv.models {
		known = append(known, m)
	}
	slices.Sort(known)
	known = slices.Compact(slices.DeleteFunc(known, func(m string) bool { return m == "" }))
	return unknownModel(model, known)
}

// model resolves a request's model.
func (s *Server) model(m string) (string, error) {
	if m != "" {
		return m, nil
	}
	if s.cfg.DefaultModel != "" {
		return s.cfg.DefaultModel, nil
	}
	return "", status.Error(codes.InvalidArgument, "model is required (this kvindex has no default model)")
}

// grpcIndexService is the kvindex.v1.IndexService a gRPC server calls.
// Its requests are gRPC's own, dropped once answered, so their block
// hashes, as well as their token ids, go back to the pools the codec
// decodes into; Server's own methods recycle only token ids, as their
// in-process callers' hashes may be held elsewhere.
type grpcIndexService struct{ *Server }

func (g grpcIndexService) LongestPrefix(ctx context.Context, req *kvindexv1.LongestPrefixRequest) (*kvindexv1.LongestPrefixResponse, error) {
	defer releaseRequestHashes(req.GetPrompt())
	return g.Server.LongestPrefix(ctx, req)
}

func (g grpcIndexService) Lookup(ctx context.Context, req *kvindexv1.LookupRequest) (*kvindexv1.LookupResponse, error) {
	defer releaseRequestHashes(req.GetPrompt())
	return g.Server.Lookup(ctx, req)
}

// LongestPrefix implements kvindex.v1.IndexService.
func (s *Server) LongestPrefix(ctx context.Context, req *kvindexv1.LongestPrefixRequest) (*kvindexv1.LongestPrefixResponse, error) {
	defer releaseRequestTokens(req.GetPrompt())
	return s.longestPrefix(ctx, req)
}

func (s *Server) longestPrefix(ctx context.Context, req *kvindexv1.LongestPrefixRequest) (*kvindexv1.LongestPrefixResponse, error) {
	st := getQueryState()
	defer putQueryState(st)
	p, err := s.resolveLongestPrefix(ctx, st, prefixQuestion{
		model:           req.GetModel(),
		prompt:          req.GetPrompt(),
		candidates:      req.GetCandidatePods(),
		candidatesField: "candidate_pods",
	})
	if err != nil {
		return nil, err
	}
	return s.prefixResponse(&st.res, p), nil
}

// prefixQuestion is a longest-prefix query as both APIs ask it:
// kvindex.v1 LongestPrefix, and llm-d's indexer.v1 GetPodScores (whose
// prompt is always text). candidatesField names the request field the
// candidates came from, for error messages.
type prefixQuestion struct {
	model           string
	prompt          *kvindexv1.Prompt
	candidates      []string
	candidatesField string
}

// resolveLongestPrefix is the one path of a longest-prefix query, whichever
// API asked it: model, candidates and prompt are checked and resolved
// (the prompt to tokens or block hashes), and the index answers into
// st.res. The callers only convert st.res to their answer's shape.
func (s *Server) resolveLongestPrefix(ctx context.Context, st *queryState, in prefixQuestion) (resolved, error) {
	model, err := s.model(in.model)
	if err != nil {
		return resolved{}, err
	}
	for i, c := range in.candidates {
		if c == "" {
			return resolved{}, status.Errorf(codes.InvalidArgument, "%s[%d] is empty", in.candidatesField, i)
		}
	}
	hv := s.healthOf()
	if err := s.checkModel(model, hv); err != nil {
		return resolved{}, err
	}
	if err := s.checkTenant(ctx, in.prompt); err != nil {
		return resolved{}, err
	}
	release, err := s.admit(in.prompt)
	if err != nil {
		return resolved{}, err
	}
	defer release()
	p, err := s.resolvePrompt(ctx, in.prompt, model, &st.q, &st.x)
	if err != nil {
		return resolved{}, err
	}
	st.q.Model = model
	st.q.Candidates = in.candidates
	p.seq = s.indexSeq()
	if err := s.walk(ctx, st); err != nil {
		return resolved{}, indexStatus(err)
	}
	completeScope(&st.res, model, in.candidates, hv)
	return p, nil
}

// completeScope adds to res the engines in the query's scope that the
// index does not list, each matching 0 blocks, so that a router sees
// every pod it may send the request to (an empty pod is where a new
// conversation should go). The index lists the engines it has applied
// events of; the scope is every engine kvindex follows for the model
// (or, with candidates, those of the candidate pods), configured ones
// before their first event included, and every candidate pod: one that
// kvindex does not know at all is listed once, as rank 0, and its health
// (UNSPECIFIED, "unknown") says that kvindex cannot vouch for it.
//
// Usually the index lists them all; that is checked without allocating.
func completeScope(res *indexer.Result, model string, candidates []string, hv *healthView) {
	f := hv.streams[model]
	if scopeListed(res, f, candidates, hv) {
		return
	}
	listed := make(map[kvevents.EngineID]bool, len(res.Pods))
	pods := make(map[string]bool, len(res.Pods))
	for i := range res.Pods {
		listed[res.Pods[i].Engine] = true
		pods[res.Pods[i].Engine.Pod] = true
	}
	zeros := len(res.Pods)
	for zeros > 0 && res.Pods[zeros-1].MatchedBlocks == 0 {
		zeros--
	}
	add := func(e kvevents.EngineID) {
		if !listed[e] {
			listed[e], pods[e.Pod] = true, true
			res.Pods = append(res.Pods, indexer.PodMatch{Engine: e})
		}
	}
	if len(candidates) == 0 && f != nil {
		for _, e := range f.all {
			add(e)
		}
	}
	for _, c := range candidates {
		if f != nil {
			for _, e := range f.byPod[c] {
				add(e)
			}
		}
		if !pods[c] {
			add(kvevents.EngineID{Model: model, Pod: c})
		}
	}
	slices.SortFunc(res.Pods[zeros:], func(a, b indexer.PodMatch) int { return compareEngines(a.Engine, b.Engine) })
}

// scopeListed reports whether res already lists every engine of the
// scope completeScope completes: as many followed engines as the scope
// has (a repeated candidate only makes it answer false), and each
// candidate pod.
func scopeListed(res *indexer.Result, f *followed, candidates []string, hv *healthView) bool {
	want := 0
	switch {
	case f == nil:
	case len(candidates) == 0:
		want = len(f.all)
	default:
		for _, c := range candidates {
			want += len(f.byPod[c])
		}
	}
	if want > 0 {
		n := 0
		for i := range res.Pods {
			if _, ok := hv.health[res.Pods[i].Engine]; ok {
				n++
			}
		}
		if n != want {
			return false
		}
	}
	for _, c := range candidates {
		if f != nil && len(f.byPod[c]) > 0 {
			continue
		}
		if !slices.ContainsFunc(res.Pods, func(m indexer.PodMatch) bool { return m.Engine.Pod == c }) {
			return false
		}
	}
	return true
}

// indexSeq is Config.IndexSeq's answer, 0 without one.
func (s *Server) indexSeq() uint64 {
	if s.cfg.IndexSeq == nil {
		return 0
	}
	return s.cfg.IndexSeq()
}

// prefixResponse converts res into a pooled response message.
func (s *Server) prefixResponse(res *indexer.Result, p resolved) *kvindexv1.LongestPrefixResponse {
	out := getPrefixResponse()
	out.BlocksTotal = sat32(res.BlocksTotal)
	out.BlockSize = sat32(res.BlockSize)
	if out.BlockSize == 0 {
		out.BlockSize = uint32(s.cfg.BlockSize)
	}
	out.PromptTokens = sat32(p.tokens)
	out.TokenSource = p.source
	out.IndexSeq = p.seq
	hv := s.healthOf()
	out.Pods = growPods(out.Pods, len(res.Pods))
	for i := range res.Pods {
		m := &res.Pods[i]
		pm := out.Pods[i]
		pm.Pod = m.Engine.Pod
		pm.DpRank = uint32(m.Engine.DPRank)
		pm.MatchedBlocks = sat32(m.MatchedBlocks)
		pm.MatchedTokens = sat32(m.MatchedTokens)
		pm.HashCheck = hashCheck(m.HashCheck)
		pm.Health = withEviction(hv.health[m.Engine], m.Evicted)
		clear(pm.Tiers)
		for _, t := range m.Tiers {
			if t.Blocks <= 0 {
				continue
			}
			if pm.Tiers == nil {
				pm.Tiers = make(map[string]uint32, len(m.Tiers))
			}
			pm.Tiers[t.Medium] = sat32(t.Blocks)
		}
	}
	return out
}

// Lookup implements kvindex.v1.IndexService.
func (s *Server) Lookup(ctx context.Context, req *kvindexv1.LookupRequest) (*kvindexv1.LookupResponse, error) {
	defer releaseRequestTokens(req.GetPrompt())
	st := getQueryState()
	defer putQueryState(st)
	model, err := s.model(req.GetModel())
	if err != nil {
		return nil, err
	}
	if err := s.checkModel(model, s.healthOf()); err != nil {
		return nil, err
	}
	if err := s.checkTenant(ctx, req.GetPrompt()); err != nil {
		return nil, err
	}
	release, err := s.admit(req.GetPrompt())
	if err != nil {
		return nil, err
	}
	defer release()
	p, err := s.resolvePrompt(ctx, req.GetPrompt(), model, &st.q, &st.x)
	if err != nil {
		return nil, err
	}
	st.q.Model = model
	blocks, err := s.index.Lookup(&st.q)
	if err != nil {
		return nil, indexStatus(err)
	}
	out := &kvindexv1.LookupResponse{
		BlockSize:    uint32(s.cfg.BlockSize),
		Blocks:       make([]*kvindexv1.BlockInfo, len(blocks)),
		PromptTokens: sat32(p.tokens),
		TokenSource:  p.source,
	}
	for i, b := range blocks {
		bi := &kvindexv1.BlockInfo{Index: sat32(b.Index), Hash: b.Key, Holders: make([]*kvindexv1.Holder, len(b.Holders))}
		for j, h := range b.Holders {
			bi.Holders[j] = &kvindexv1.Holder{
				Pod: h.Engine.Pod, DpRank: uint32(h.Engine.DPRank), Medium: h.Medium,
				GroupIdx: sat32(h.GroupIdx), Refs: sat32(h.Refs),
			}
		}
		out.Blocks[i] = bi
	}
	return out, nil
}

// GetHashConfig implements kvindex.v1.IndexService: the hashing of
// Config.Hasher.
func (s *Server) GetHashConfig(context.Context, *kvindexv1.GetHashConfigRequest) (*kvindexv1.HashConfig, error) {
	if s.hashing == nil {
		return nil, status.Error(codes.Unimplemented, "this kvindex does not say how it hashes: send token ids")
	}
	return proto.Clone(s.hashing).(*kvindexv1.HashConfig), nil
}

// ListPods implements kvindex.v1.IndexService: the engines known to the
// subscriber or the index, sorted by pod and rank.
func (s *Server) ListPods(_ context.Context, req *kvindexv1.ListPodsRequest) (*kvindexv1.ListPodsResponse, error) {
	seq := s.indexSeq() // before the index is read, as for LongestPrefix
	byEngine := make(map[kvevents.EngineID]*kvindexv1.PodInfo)
	get := func(e kvevents.EngineID) *kvindexv1.PodInfo {
		p := byEngine[e]
		if p == nil {
			p = &kvindexv1.PodInfo{Pod: e.Pod, DpRank: uint32(e.DPRank), Model: e.Model}
			byEngine[e] = p
		}
		return p
	}
	want := func(e kvevents.EngineID) bool { return req.GetModel() == "" || e.Model == req.GetModel() }
	if s.cfg.Streams != nil {
		for _, st := range s.cfg.Streams.Streams() {
			if !want(st.Engine) {
				continue
			}
			p := get(st.Engine)
			p.Endpoint = st.Endpoint
			p.Connected = st.Connected
			p.Health = streamHealth(&st)
			p.LastSeq = st.LastSeq
			p.Batches = st.Batches
			p.Events = st.Events
			p.Gaps = st.Gaps
			p.ReplaysOk = st.ReplaysOK
			p.ReplaysFailed = st.ReplaysFailed
			p.Resets = st.Resets
			p.DecodeErrors = st.DecodeErrors
			p.UnknownEvents = st.UnknownEvents
			if st.LastEventUnixNano > 0 {
				p.LastEventUnixMs = st.LastEventUnixNano / int64(time.Millisecond)
			}
			if st.LastBatchStampUnixNano != 0 {
				p.LastBatchLagSeconds = proto.Float64(st.LastBatchLag.Seconds())
			}
		}
	}
	for _, e := range s.index.Engines() {
		if !want(e.Engine) {
			continue
		}
		p := get(e.Engine)
		p.Blocks = uint64(max(e.HolderBlocks, 0))
		if len(e.Tiers) > 0 {
			p.BlocksByMedium = make(map[string]uint64, len(e.Tiers))
			for _, t := range e.Tiers {
				if t.Blocks > 0 {
					p.BlocksByMedium[t.Medium] = uint64(t.Blocks)
				}
			}
		}
		p.HashCheck = hashCheck(e.HashCheck)
		p.Health = withEviction(p.Health, e.Evicted != 0)
		p.Message = e.Message
	}
	out := &kvindexv1.ListPodsResponse{Pods: make([]*kvindexv1.PodInfo, 0, len(byEngine)), IndexSeq: seq}
	for _, p := range byEngine {
		out.Pods = append(out.Pods, p)
	}
	slices.SortFunc(out.Pods, func(a, b *kvindexv1.PodInfo) int {
		return cmp.Or(cmp.Compare(a.Pod, b.Pod), cmp.Compare(a.DpRank, b.DpRank), cmp.Compare(a.Model, b.Model))
	})
	fleetCache(out, s.cfg.Fleet, req.GetModel())
	if s.cfg.TokenizerChecks != nil {
		for _, c := range s.cfg.TokenizerChecks() {
			out.TokenizerChecks = append(out.TokenizerChecks, &kvindexv1.TokenizerCheck{Form: c.Form, Verdict: c.Verdict, Disagrees: c.Disagrees, Detail: c.Detail})
		}
	}
	return out, nil
}

// Watch implements kvindex.v1.IndexService: it streams applied events
// until the client leaves or the server shuts down.
func (s *Server) Watch(req *kvindexv1.WatchRequest, stream kvindexv1.IndexService_WatchServer) error {
	if s.cfg.Hub == nil {
		return status.Error(codes.Unavailable, "this kvindex has no event stream to watch")
	}
	for i, p := range req.GetPods() {
		if p == "" {
			return status.Errorf(codes.InvalidArgument, "pods[%d] is empty", i)
		}
	}
	loras, err := s.watchTenant(stream.Context())
	if err != nil {
		return err
	}
	w, err := s.cfg.Hub.SubscribeLoRAs(req.GetPods(), loras)
	switch {
	case errors.Is(err, watchhub.ErrTooManyWatchers):
		s.log.Warn("watch refused", "limit", s.cfg.Hub.MaxWatchers())
		return status.Errorf(codes.ResourceExhausted, "kvindex serves at most %d Watch streams at once; try again later", s.cfg.Hub.MaxWatchers())
	case err != nil:
		return status.Error(codes.Unavailable, "kvindex is shutting down")
	}
	defer w.Close()
	ctx := stream.Context()
	for {
		m, err := w.Next(ctx)
		var behind *watchhub.BehindError
		var limit *watchhub.WatchLimitError
		switch {
		case errors.As(err, &behind):
			s.log.Info("watcher fell behind; closed", "lost_events", behind.Events, "fan_out_queue", behind.Hub)
			return status.Error(codes.ResourceExhausted, behind.Error())
		case errors.As(err, &limit):
			s.log.Info("restricted watcher closed", "reason", limit.Error())
			return status.Error(codes.ResourceExhausted, limit.Error())
		case errors.Is(err, watchhub.ErrClosed):
			return nil // the server is shutting down
		case err != nil:
			return status.FromContextError(err).Err()
		}
		if err := stream.Send(m); err != nil {
			return err
		}
	}
}

// GetPodScores implements llm-d's indexer.v1.IndexerService: the prompt
// is tokenized (completion form) and resolved as LongestPrefix resolves a
// text prompt (resolveLongestPrefix), and each pod scores the number of
// leading blocks it holds (its best data-parallel rank). Every pod of the
// answer's scope (completeScope: every pod asked about, or every pod of
// the model) is listed, zeros included, the best first. An unknown model
// is NotFound, as in LongestPrefix: llm-d's scorers log a failed call and
// score no pod, as they would for an empty answer.
func (s *Server) GetPodScores(ctx context.Context, req *indexerv1.GetPodScoresRequest) (*indexerv1.GetPodScoresResponse, error) {
	st := getQueryState()
	defer putQueryState(st)
	_, err := s.resolveLongestPrefix(ctx, st, prefixQuestion{
		model:           req.GetModelName(),
		prompt:          &kvindexv1.Prompt{Input: &kvindexv1.Prompt_Text{Text: req.GetPrompt()}},
		candidates:      req.GetPodIdentifiers(),
		candidatesField: "pod_identifiers",
	})
	if err != nil {
		return nil, err
	}
	return podScores(&st.res), nil
}

// podScores folds ranks into pods: a pod scores its best rank.
func podScores(res *indexer.Result) *indexerv1.GetPodScoresResponse {
	out := &indexerv1.GetPodScoresResponse{}
	seen := make(map[string]*indexerv1.PodScore, len(res.Pods))
	add := func(pod string) *indexerv1.PodScore {
		ps := seen[pod]
		if ps == nil {
			ps = &indexerv1.PodScore{Pod: pod}
			seen[pod] = ps
			out.Scores = append(out.Scores, ps)
		}
		return ps
	}
	for i := range res.Pods {
		m := &res.Pods[i]
		ps := add(m.Engine.Pod)
		ps.Score = max(ps.Score, float64(m.MatchedBlocks))
	}
	slices.SortStableFunc(out.Scores, func(a, b *indexerv1.PodScore) int {
		return cmp.Or(cmp.Compare(b.Score, a.Score), cmp.Compare(a.Pod, b.Pod))
	})
	return out
}

func hashCheck(c indexer.HashCheck) kvindexv1.HashCheck {
	switch c {
	case indexer.HashVerified:
		return kvindexv1.HashCheck_HASH_CHECK_VERIFIED
	case indexer.HashMismatch:
		return kvindexv1.HashCheck_HASH_CHECK_MISMATCH
	}
	return kvindexv1.HashCheck_HASH_CHECK_UNSPECIFIED
}

// indexStatus maps an index error. The index validates what the request
// validation cannot know (block sizes, extra keys against the prompt), so
// its errors are the caller's unless they say otherwise.
func indexStatus(err error) error {
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	return status.Error(codes.Internal, "index: "+err.Error())
}

// TokenizerCheck is the verdict of comparing the local tokenizer with the
// engine's /tokenize on one prompt form (ListPodsResponse.tokenizer_checks).
type TokenizerCheck struct {
	Form, Verdict, Detail string
	Disagrees             bool
}

// hashSampler is an Index that keeps the BlockStored events of engines
// flagged mismatch (indexer.Index.HashSamples).
type hashSampler interface {
	HashSamples(model string) []indexer.EngineSamples
}

// HashSamples implements kvindex.v1.IndexService: the events kept of each
// engine flagged mismatch, for kvindex doctor's search.
func (s *Server) HashSamples(_ context.Context, req *kvindexv1.HashSamplesRequest) (*kvindexv1.HashSamplesResponse, error) {
	hs, ok := s.index.(hashSampler)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "this kvindex keeps no hash samples")
	}
	for i, p := range req.GetPods() {
		if p == "" {
			return nil, status.Errorf(codes.InvalidArgument, "pods[%d] is empty", i)
		}
	}
	out := &kvindexv1.HashSamplesResponse{}
	for _, es := range hs.HashSamples(req.GetModel()) {
		if len(req.GetPods()) > 0 && !slices.Contains(req.GetPods(), es.Engine.Pod) {
			continue
		}
		e := &kvindexv1.EngineHashSamples{Pod: es.Engine.Pod, DpRank: uint32(es.Engine.DPRank), Model: es.Engine.Model}
		for i := range es.Events {
			e.Samples = append(e.Samples, StoredSample(&es.Events[i]))
		}
		out.Engines = append(out.Engines, e)
	}
	return out, nil
}

// StoredSample is the wire form of one kept BlockStored event, as
// HashSamples sends it (internal/doctor's Decode reads it back).
func StoredSample(ev *kvevents.Event) *kvindexv1.StoredSample {
	s := &kvindexv1.StoredSample{
		BlockHashes: ev.Hashes, BlockDigests: ev.Digests, HasParent: ev.HasParent, ParentHash: ev.Parent,
		ParentDigest: ev.ParentDigest, TokenIds: ev.TokenIDs, BlockSize: uint32(ev.BlockSize), LoraName: ev.LoRAName,
		HasExtraKeys: ev.ExtraKeys != nil,
	}
	for _, x := range ev.ExtraKeys {
		s.ExtraKeys = append(s.ExtraKeys, &kvindexv1.BlockExtraKeys{None: x == nil, Values: extraValues(x)})
	}
	return s
}

func extraValues(x blockhash.BlockExtra) []*kvindexv1.ExtraKeyValue {
	out := make([]*kvindexv1.ExtraKeyValue, len(x))
	for i, v := range x {
		switch v.Kind {
		case blockhash.KindStr:
			out[i] = &kvindexv1.ExtraKeyValue{Value: &kvindexv1.ExtraKeyValue_Str{Str: v.Str}}
		case blockhash.KindInt:
			out[i] = &kvindexv1.ExtraKeyValue{Value: &kvindexv1.ExtraKeyValue_Int{Int: v.Int}}
		case blockhash.KindBytes:
			out[i] = &kvindexv1.ExtraKeyValue{Value: &kvindexv1.ExtraKeyValue_Bytes{Bytes: v.Bytes}}
		default:
			out[i] = &kvindexv1.ExtraKeyValue{Value: &kvindexv1.ExtraKeyValue_Tuple{Tuple: &kvindexv1.ExtraKeyTuple{Values: extraValues(v.Tuple)}}}
		}
	}
	return out
}
