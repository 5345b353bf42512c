package gateway

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/kvindex/kvindex/internal/inflight"
)

func jsonError(msg string) ([]byte, error) {
	return json.Marshal(struct {
		Error string `json:"error"`
	}{msg})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(`{"error":"encoding the answer failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, code int, msg string) {
	b, _ := jsonError(msg)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}

// Handler serves POST /v1/pick: the body is the OpenAI request as the
// client sent it, headers included (x-session-id, x-request-priority,
// and x-gateway-destination-endpoint-subset as a comma-separated list);
// the answer is the decision as JSON (picker.Decision) and the
// x-gateway-destination-endpoint header, and on a fallback its reason in
// the JSON's "fallback" and the x-kvindex-fallback header. 400 for a body
// the picker cannot read, 404 for a model the index does not know (the
// error names it), 413 past the body bound, 503 when no endpoint may
// serve. The decision counts as in flight on its pod for Config.PickHold.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/pick", s.servePick)
	return mux
}

func (s *Service) servePick(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength > int64(s.cfg.MaxBody) {
		s.m.bad.WithLabelValues("too_large").Inc()
		writeError(w, http.StatusRequestEntityTooLarge, "request body over "+strconv.Itoa(s.cfg.MaxBody)+" bytes")
		return
	}
	// The body is read in a body turn, held until the answer is written,
	// as ext_proc requests take theirs (bodySlots).
	slot := s.newBodySlot()
	defer slot.give()
	in := &inflight.Reader{R: http.MaxBytesReader(w, r.Body, int64(s.cfg.MaxBody)), G: &s.bodies, Size: r.ContentLength}
	defer in.Release()
	body, err := io.ReadAll(&slotReader{ctx: r.Context(), slot: slot, r: in})
	if err != nil {
		if errors.Is(err, inflight.ErrBusy) {
			s.m.bad.WithLabelValues("busy").Inc()
			writeError(w, http.StatusTooManyRequests, s.busyMessage())
			return
		}
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			s.m.bad.WithLabelValues("too_large").Inc()
			writeError(w, http.StatusRequestEntityTooLarge, "request body over "+strconv.Itoa(s.cfg.MaxBody)+" bytes")
			return
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// The client is too slow for the server's read deadline; its
			// connection is closed, so nobody reads this answer.
			s.m.bad.WithLabelValues("read_timeout").Inc()
			writeError(w, http.StatusRequestTimeout, "reading the body: "+err.Error())
			return
		}
		writeError(w, http.StatusBadRequest, "reading the body: "+err.Error())
		return
	}
	cpu := s.enterCPU(r.Context())
	if cpu == nil {
		return // the client left
	}
	req, err := ParseRequest(body, func(k string) string { return r.Header.Get(k) })
	if err != nil {
		cpu.leave()
		s.m.bad.WithLabelValues("body").Inc()
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	req.cpu = cpu // given back before the index query (pick)
	defer s.release(req)
	var subset []string
	if vs, ok := r.Header[http.CanonicalHeaderKey(SubsetKey)]; ok {
		subset = []string{}
		for _, v := range vs {
			for _, e := range strings.Split(v, ",") {
				if e = strings.TrimSpace(e); e != "" {
					subset = append(subset, e)
				}
			}
		}
	}
	d, done, err := s.pick(r.Context(), req, subset, true)
	if err != nil {
		code := http.StatusInternalServerError
		switch {
		case errors.Is(err, ErrNoEndpoint):
			code = http.StatusServiceUnavailable
		case errors.Is(err, ErrUnknownModel):
			code = http.StatusNotFound
		}
		writeError(w, code, err.Error())
		return
	}
	s.hold(done)
	w.Header().Set(HeaderDestination, d.Endpoint)
	if d.Fallback != "" {
		w.Header().Set(HeaderFallback, string(d.Fallback))
	}
	writeJSON(w, http.StatusOK, d)
}
