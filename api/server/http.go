package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"
	"reflect"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/api/server/security"
	"github.com/kvindex/kvindex/internal/inflight"
	"github.com/kvindex/kvindex/tokenizer"
)

// HTTPOptions configures Handler. It has no options today: Go profiles,
// which it once served, are on the admin listener (AdminHandler).
type HTTPOptions struct{}

// Handler returns the HTTP/JSON API:
//
//	POST /v1/longest-prefix  LongestPrefix
//	POST /v1/lookup          Lookup
//	GET  /v1/pods            ListPods (?model=M)
//	GET  /metrics            Prometheus metrics
//	GET  /healthz            200 while the process runs
//	GET  /readyz             200 once ready, else 503
//	GET  /openapi.json       the OpenAPI document of these endpoints
//	GET  /                   the service's name and where that document is
//
// Errors are JSON objects {"error": "..."} with a 4xx status for client
// mistakes.
func (s *Server) Handler(HTTPOptions) http.Handler {
	mux := http.NewServeMux()
	routes := append(s.apiRoutes(), s.commonRoutes()...)
	for _, r := range routes {
		mux.Handle(r.pattern, r.h)
	}
	mux.Handle("GET /{$}", indexHandler(routes))
	s.handleNotFound(mux)
	return mux
}

// route is one endpoint: its method (empty: any, for probes and
// scrapers) and path, and its handler. openapi.json documents each route
// of the API listener, and GET / (TestOpenAPI).
type route struct {
	method, path string
	pattern      string // the ServeMux pattern
	h            http.Handler
}

// apiRoutes are the endpoints only the API listener serves.
func (s *Server) apiRoutes() []route {
	api := func(method, path string, scope security.Scope, h httpFunc) route {
		return route{method: method, path: path, pattern: path, h: s.guard(scope, path, s.method(method, h))}
	}
	return []route{
		api(http.MethodPost, "/v1/longest-prefix", security.ScopeQuery, s.httpLongestPrefix),
		api(http.MethodPost, "/v1/lookup", security.ScopeQuery, s.httpLookup),
		api(http.MethodGet, "/v1/pods", security.ScopeQuery, s.httpPods),
		{method: http.MethodGet, path: openAPIPath, pattern: "GET " + openAPIPath, h: http.HandlerFunc(openAPIHandler)},
	}
}

// commonRoutes are the endpoints both HTTP listeners serve: metrics,
// liveness and readiness.
func (s *Server) commonRoutes() []route {
	ready := ReadyzHandler(func() (bool, string) {
		if s.Ready() {
			return true, ""
		}
		return false, s.notReadyReason()
	})
	return []route{
		{path: "/metrics", pattern: "/metrics", h: s.guard(security.ScopeMetrics, "/metrics", promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{Registry: s.cfg.Registry}))},
		{path: "/healthz", pattern: "/healthz", h: http.HandlerFunc(HealthzHandler)},
		{path: "/readyz", pattern: "/readyz", h: ready},
	}
}

// AdminHandler returns the admin listener's endpoints: what only
// operators need, kept off the API port.
//
//	/debug/pprof/  Go profiles (net/http/pprof)
//	GET /metrics   Prometheus metrics, as on the API port
//	GET /healthz   as on the API port
//	GET /readyz    as on the API port
func (s *Server) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	prof := func(path string, h http.HandlerFunc) {
		mux.Handle(path, s.guard(security.ScopeAdmin, "/debug/pprof/", h))
	}
	prof("/debug/pprof/", pprof.Index)
	prof("/debug/pprof/cmdline", pprof.Cmdline)
	prof("/debug/pprof/profile", pprof.Profile)
	prof("/debug/pprof/symbol", pprof.Symbol)
	prof("/debug/pprof/trace", pprof.Trace)
	for _, r := range s.commonRoutes() {
		mux.Handle(r.pattern, r.h)
	}
	s.handleNotFound(mux)
	return mux
}

// handleNotFound answers every other path with a JSON 404.
func (s *Server) handleNotFound(mux *http.ServeMux) {
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.Path))
	})
}

// HealthzHandler answers /healthz: alive while the process answers HTTP.
// serve, picker and relay share it, so probes read one shape.
func HealthzHandler(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "alive"})
}

// ReadyzHandler answers /readyz from ready: 200 {"status":"ready"}, or 503
// {"status":"not ready","reason":...} with the reason ready gives. serve,
// picker and relay share it, so probes read one shape.
func ReadyzHandler(ready func() (ok bool, reason string)) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		if ok, why := ready(); !ok {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "reason": why})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	}
}

// notReadyReason explains /readyz's 503.
func (s *Server) notReadyReason() string {
	if s.cfg.ReadyWhen != nil {
		return "the event source has not caught up yet (NATS mode: connecting, restoring the snapshot or reading the stream's tail)"
	}
	if s.cfg.ExpectStreams <= 0 {
		return "no engine event applied yet (bind mode)"
	}
	connected := 0
	if s.cfg.Streams != nil {
		for _, st := range s.cfg.Streams.Streams() {
			if st.Connected && !st.Bind {
				connected++
			}
		}
	}
	return fmt.Sprintf("%d of %d engine streams connected", connected, s.cfg.ExpectStreams)
}

// httpFunc handles a request and reports the status it answered with.
type httpFunc func(w http.ResponseWriter, r *http.Request) error

// method restricts h to one HTTP method and records its latency.
func (s *Server) method(m string, h httpFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != m {
			w.Header().Set("Allow", m)
			writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s %s: use %s", r.Method, r.URL.Path, m))
			return
		}
		start := time.Now()
		err := h(w, r)
		s.metrics.observe("http", strings.TrimPrefix(r.URL.Path, "/v1/"), start, err)
	})
}

// maxBodyBytes bounds a request body: maxTokens ids of up to 20 digits
// and a separator, plus room for the other fields.
func maxBodyBytes(maxTokens int) int64 { return int64(min(maxTokens, MaxMaxTokens))*21 + 1<<20 }

// promptJSON is the prompt part of the HTTP requests. Its messages
// decode into tokenizer.Message, whose JSON form is the OpenAI message
// object the HTTP API documents, and the chat request's rendering fields
// (tools, chat_template_kwargs, ...) into tokenizer.ChatFields, at the top
// level as in a chat request; toProto turns them into the API's
// ChatMessages so that both APIs resolve one Prompt.
type promptJSON struct {
	Model       string              `json:"model"`
	Tokens      idList              `json:"tokens"`
	Prompt      *string             `json:"prompt"`
	Messages    []tokenizer.Message `json:"messages"`
	BlockHashes idList              `json:"block_hashes"`
	LoraName    string              `json:"lora_name"`
	CacheSalt   string              `json:"cache_salt"`
	MMItems     []mmItemJSON        `json:"mm_items"`
	tokenizer.ChatFields
}

type mmItemJSON struct {
	Identifier string `json:"identifier"`
	Offset     uint32 `json:"offset"`
	Length     uint32 `json:"length"`
}

type longestPrefixRequestJSON struct {
	promptJSON
	CandidatePods []string `json:"candidate_pods"`
}

// toProto converts the prompt, checking that exactly one input is given.
func (p *promptJSON) toProto() (*kvindexv1.Prompt, error) {
	var given []string
	out := &kvindexv1.Prompt{LoraName: p.LoraName, CacheSalt: p.CacheSalt}
	if p.Tokens.set {
		given = append(given, "tokens")
		out.Input = &kvindexv1.Prompt_Tokens{Tokens: &kvindexv1.TokenIds{Ids: p.Tokens.ids}}
	}
	if p.Prompt != nil {
		given = append(given, "prompt")
		out.Input = &kvindexv1.Prompt_Text{Text: *p.Prompt}
	}
	if p.Messages != nil {
		given = append(given, "messages")
		msgs := make([]*kvindexv1.ChatMessage, len(p.Messages))
		for i, m := range p.Messages {
			if m.Raw != nil {
				msgs[i] = &kvindexv1.ChatMessage{MessageJson: string(m.Raw)}
			} else {
				msgs[i] = &kvindexv1.ChatMessage{Role: m.Role, Content: m.Content}
			}
		}
		// JSON cannot fail: the fields were decoded from valid JSON.
		params, _ := p.ChatFields.JSON()
		out.Input = &kvindexv1.Prompt_Messages{Messages: &kvindexv1.ChatMessages{Messages: msgs, ChatParamsJson: string(params)}}
	} else if set := p.ChatFields.Set(); len(set) > 0 {
		return nil, status.Errorf(codes.InvalidArgument, "%s apply to chat prompts only: send them with messages", strings.Join(set, ", "))
	}
	if p.BlockHashes.set {
		given = append(given, "block_hashes")
		out.Input = &kvindexv1.Prompt_BlockHashes{BlockHashes: &kvindexv1.BlockHashes{Hashes: p.BlockHashes.ids}}
	}
	switch len(given) {
	case 0:
		return nil, status.Error(codes.InvalidArgument, "the request needs one of tokens, prompt, messages or block_hashes")
	case 1:
	default:
		return nil, status.Errorf(codes.InvalidArgument, "give only one of tokens, prompt, messages or block_hashes (got %s)", strings.Join(given, " and "))
	}
	for _, m := range p.MMItems {
		out.MmItems = append(out.MmItems, &kvindexv1.MultimodalItem{Identifier: m.Identifier, Offset: m.Offset, Length: m.Length})
	}
	return out, nil
}

func (s *Server) httpLongestPrefix(w http.ResponseWriter, r *http.Request) error {
	t := tokenIDs.Get().(*kvindexv1.TokenIds) // a pooled buffer for the ids
	var body longestPrefixRequestJSON
	body.Tokens = idList{name: "tokens", ids: t.Ids[:0]}
	defer func() {
		t.Ids = body.Tokens.ids
		putTokenIDs(t)
	}()
	body.BlockHashes = idList{name: "block_hashes"}
	if err := s.decodeBody(w, r, &body); err != nil {
		return err
	}
	prompt, err := body.toProto()
	if err != nil {
		return writeStatus(w, err)
	}
	req := &kvindexv1.LongestPrefixRequest{Model: body.Model, Prompt: prompt, CandidatePods: body.CandidatePods}
	resp, err := s.longestPrefix(r.Context(), req)
	if err != nil {
		return writeStatus(w, err)
	}
	out := client.LongestPrefixJSONOf(resp)
	putPrefixResponse(resp)
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) httpLookup(w http.ResponseWriter, r *http.Request) error {
	var body promptJSON
	body.Tokens = idList{name: "tokens"}
	body.BlockHashes = idList{name: "block_hashes"}
	if err := s.decodeBody(w, r, &body); err != nil {
		return err
	}
	prompt, err := body.toProto()
	if err != nil {
		return writeStatus(w, err)
	}
	resp, err := s.Lookup(r.Context(), &kvindexv1.LookupRequest{Model: body.Model, Prompt: prompt})
	if err != nil {
		return writeStatus(w, err)
	}
	writeJSON(w, http.StatusOK, client.LookupJSONOf(resp))
	return nil
}

func (s *Server) httpPods(w http.ResponseWriter, r *http.Request) error {
	resp, err := s.ListPods(r.Context(), &kvindexv1.ListPodsRequest{Model: r.URL.Query().Get("model")})
	if err != nil {
		return writeStatus(w, err)
	}
	writeJSON(w, http.StatusOK, client.PodsJSONOf(resp, s.now()))
	return nil
}

// decodeBody decodes one JSON object from the request body into v, with
// unknown fields rejected and the size bounded; on failure it writes the
// 4xx answer and returns its status error.
func (s *Server) decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	limit := maxBodyBytes(s.cfg.MaxTokens)
	if r.ContentLength > limit {
		// Refused before a byte is read.
		msg := fmt.Sprintf("request body exceeds the %d-byte limit (Content-Length %d)", limit, r.ContentLength)
		writeError(w, http.StatusRequestEntityTooLarge, msg)
		return status.Error(codes.InvalidArgument, msg)
	}
	body := &inflight.Reader{R: http.MaxBytesReader(w, r.Body, limit), G: &s.bodies, Size: r.ContentLength}
	defer body.Release()
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, extra := dec.Token(); extra != io.EOF {
			err = errors.New("unexpected data after the JSON object")
			var mbe *http.MaxBytesError
			if errors.As(extra, &mbe) {
				err = extra
			}
		}
	}
	if err == nil {
		return nil
	}
	code, msg := http.StatusBadRequest, bodyError(err, v)
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		code, msg = http.StatusRequestEntityTooLarge, fmt.Sprintf("request body exceeds the %d-byte limit", limit)
	case errors.Is(err, inflight.ErrBusy):
		code, msg = http.StatusTooManyRequests, fmt.Sprintf("kvindex is busy: request bodies being read exceed its limit of %d bytes in flight; retry shortly", s.bodies.Max)
		writeError(w, code, msg)
		return status.Error(codes.ResourceExhausted, msg)
	}
	writeError(w, code, msg)
	return status.Error(codes.InvalidArgument, msg)
}

// bodyError turns a JSON decoding error of a request body decoded into
// v into a message for the client.
func bodyError(err error, v any) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.Is(err, io.EOF):
		return "empty request body: want a JSON object"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "malformed JSON: unexpected end of the body"
	case errors.As(err, &se):
		return fmt.Sprintf("malformed JSON at byte %d: %v", se.Offset, se)
	case errors.As(err, &te):
		if te.Field == "" {
			return fmt.Sprintf("the body must be a JSON object, not %s", te.Value)
		}
		field := strings.TrimPrefix(te.Field, "promptJSON.") // the embedded struct
		return fmt.Sprintf("field %s: got %s, want %s", field, te.Value, jsonType(te.Type.Kind().String()))
	}
	msg := strings.TrimPrefix(err.Error(), "json: ")
	if strings.HasPrefix(msg, "unknown field") {
		return msg + " (known: " + strings.Join(jsonFields(reflect.TypeOf(v)), ", ") + ")"
	}
	return msg
}

// jsonFields lists the JSON keys a struct (or pointer to one) decodes, in
// declaration order, those of embedded structs in place: the keys a
// request of that type accepts, read from the type itself so that the
// list cannot disagree with it.
func jsonFields(t reflect.Type) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-":
		case f.Anonymous && name == "":
			out = append(out, jsonFields(f.Type)...)
		case !f.IsExported():
		case name != "":
			out = append(out, name)
		default:
			out = append(out, f.Name)
		}
	}
	return out
}

func jsonType(kind string) string {
	switch kind {
	case "string":
		return "a string"
	case "slice":
		return "an array"
	case "struct", "map":
		return "an object"
	case "bool":
		return "a boolean"
	}
	return "a number"
}

// httpStatus maps a gRPC status code to the HTTP status answering it.
func httpStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.NotFound:
		return http.StatusNotFound
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.Unavailable, codes.Canceled:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// writeStatus answers with err's status and returns err.
func writeStatus(w http.ResponseWriter, err error) error {
	st := status.Convert(err)
	writeError(w, httpStatus(st.Code()), st.Message())
	return err
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(v); err != nil {
		code = http.StatusInternalServerError
		buf.Reset()
		buf.WriteString(`{"error":"encoding the response failed"}` + "\n")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}
