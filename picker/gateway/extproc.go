package gateway

import (
	"errors"
	"io"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvindex/kvindex/internal/inflight"
)

// ExtProc is the Envoy ext_proc server of the Endpoint Picker Protocol.
type ExtProc struct {
	extprocv3.UnimplementedExternalProcessorServer
	s *Service
}

// ExtProc returns the Service's ext_proc front.
func (s *Service) ExtProc() *ExtProc { return &ExtProc{s: s} }

// The ext_proc server's HTTP/2 flow-control windows (ServerOptions):
// fixed, where gRPC's default grows them with the measured
// bandwidth-delay product up to 16 MiB per connection, which a client
// streaming bodies without end makes the picker buffer beyond its bound
// on the bodies (the fault row picker-body-flood measured its peak RSS
// 20 MiB lower with these). A stream may have 256 KiB in flight, which
// keeps an 8 MiB body flowing at hundreds of MB/s within a data centre,
// a connection 1 MiB.
const (
	extProcWindow     = 256 << 10
	extProcConnWindow = 1 << 20
)

// ServerOptions are the settings of a gRPC server that serves the ext_proc
// service: a message bound of the body bound plus room for the message's
// other fields, and fixed flow-control windows.
func (x *ExtProc) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(x.s.MaxBody() + 1<<20),
		grpc.InitialWindowSize(extProcWindow),
		grpc.InitialConnWindowSize(extProcConnWindow),
	}
}

// Register registers the ext_proc service and the gRPC health service
// on gs. "liveness" and the ext_proc service name (which the protocol
// asks for) are SERVING: the picker routes, by load and session, even
// without its index. "readiness" and "" (the whole server, what a probe
// asks by default) follow the index (Service.IndexReady): NOT_SERVING
// while a remote index has not answered or is unreachable.
func (x *ExtProc) Register(gs *grpc.Server) {
	extprocv3.RegisterExternalProcessorServer(gs, x)
	hs := health.NewServer()
	for _, name := range []string{"liveness", extprocv3.ExternalProcessor_ServiceDesc.ServiceName} {
		hs.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	x.s.OnIndexReady(func(ready bool) {
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if ready {
			st = healthpb.HealthCheckResponse_SERVING
		}
		for _, name := range []string{"", "readiness"} {
			hs.SetServingStatus(name, st)
		}
	})
	healthpb.RegisterHealthServer(gs, hs)
}

// Process serves one HTTP request's stream, as the protocol's reference
// picker sequences it: request headers are kept and not answered; body
// frames are buffered until end of stream (at most Config.MaxBody); then
// the picker answers the request headers with the destination (header
// and envoy.lb dynamic metadata) and the body with the unchanged body
// streamed back. A request without a body is routed at its headers.
// Response frames are passed through unchanged. The pick counts as in
// flight until the response body ends or the stream does.
func (x *ExtProc) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	s := x.s
	var (
		hdr       map[string]string
		subset    []string
		body      []byte
		held      inflight.Hold // body bytes taken from s.bodies
		heldBytes int64         // what held holds
		fl        *flight       // once routed
		slot      = s.newBodySlot()
	)
	defer slot.give()
	defer s.bodies.Give(&held)
	defer func() {
		if fl != nil {
			fl.done()
		}
		if body != nil {
			putBody(body)
		}
	}()
	for {
		stopWaiting := slot.waiting()
		req, err := stream.Recv()
		stopWaiting()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if status.Code(err) == codes.Canceled {
				return nil
			}
			return err
		}
		var resp []*extprocv3.ProcessingResponse
		switch v := req.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			hdr = headerMap(v.RequestHeaders.GetHeaders())
			subset = subsetHint(req.GetMetadataContext())
			if v.RequestHeaders.GetEndOfStream() {
				resp, fl = x.route(stream, hdr, subset, nil)
			}
		case *extprocv3.ProcessingRequest_RequestBody:
			if fl != nil {
				return status.Error(codes.FailedPrecondition, "request body after the request was routed")
			}
			if len(body)+len(v.RequestBody.GetBody()) > s.cfg.MaxBody {
				s.m.bad.WithLabelValues("too_large").Inc()
				return stream.Send(immediate(typev3.StatusCode_PayloadTooLarge, "request body over "+strconv.Itoa(s.cfg.MaxBody)+" bytes"))
			}
			if !slot.take(stream.Context()) {
				return nil // the stream ended
			}
			frame := v.RequestBody.GetBody()
			switch {
			case body == nil && v.RequestBody.GetEndOfStream():
				// The whole body in one frame: the frame is the body (the
				// message was decoded into memory of its own), and its
				// size is known.
				body = frame
				held.Size = int64(cap(body))
			case body == nil:
				body = getBody(bodyPresize(hdr["content-length"], len(frame), s.cfg.MaxBody), s.cfg.MaxBody)
				fallthrough
			default:
				body = appendBody(body, frame, s.cfg.MaxBody)
			}
			// The buffer's capacity is what it holds in memory.
			if grown := int64(cap(body)) - heldBytes; grown > 0 {
				if !s.bodies.Take(&held, grown) {
					s.m.bad.WithLabelValues("busy").Inc()
					return stream.Send(immediate(typev3.StatusCode_TooManyRequests, s.busyMessage()))
				}
				heldBytes += grown
			}
			if v.RequestBody.GetEndOfStream() {
				resp, fl = x.route(stream, hdr, subset, body)
				if resp == nil {
					return nil // answered with an immediate response
				}
				// Routed: the body goes back to Envoy now and is not
				// kept (Send encodes it before returning, and nothing on
				// the picker's gRPC servers keeps a sent message), so its
				// buffer and bytes are free for other requests while the
				// response streams through.
				for _, r := range resp {
					if err := stream.Send(r); err != nil {
						return err
					}
				}
				resp = nil
				putBody(body)
				body = nil
				s.bodies.Give(&held)
				heldBytes = 0
				slot.give()
			}
		case *extprocv3.ProcessingRequest_RequestTrailers:
			resp = []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			hr := &extprocv3.HeadersResponse{}
			if fl != nil && fl.fallback != "" {
				// The client and the gateway's access log see it too.
				hr.Response = &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
					{Header: &corev3.HeaderValue{Key: HeaderFallback, RawValue: []byte(fl.fallback)}}}}}
			}
			resp = []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: hr}}}
		case *extprocv3.ProcessingRequest_ResponseBody:
			// Full-duplex streaming: each frame goes back as it came.
			eos := v.ResponseBody.GetEndOfStream()
			resp = []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{
				Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
					StreamedResponse: &extprocv3.StreamedBodyResponse{Body: v.ResponseBody.GetBody(), EndOfStream: eos}}}},
			}}}}
			if fl != nil {
				fl.response(v.ResponseBody.GetBody(), eos, &s.cfg)
			}
		case *extprocv3.ProcessingRequest_ResponseTrailers:
			resp = []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}}
		default:
			s.m.bad.WithLabelValues("protocol").Inc()
			return status.Errorf(codes.InvalidArgument, "unexpected ext_proc message %T", req.Request)
		}
		for _, r := range resp {
			if err := stream.Send(r); err != nil {
				return err
			}
		}
	}
}

// route picks for a complete request and returns the responses to send:
// the request headers' (destination) and, with a body, the body's. When
// the request cannot be routed it sends the immediate response itself
// and returns nil.
func (x *ExtProc) route(stream extprocv3.ExternalProcessor_ProcessServer, hdr map[string]string, subset []string, body []byte) ([]*extprocv3.ProcessingResponse, *flight) {
	s := x.s
	get := func(k string) string { return hdr[k] }
	var r *Request
	if len(body) > 0 {
		cpu := s.enterCPU(stream.Context())
		if cpu == nil {
			return nil, nil // the stream ended
		}
		var err error
		if r, err = ParseRequest(body, get); err != nil {
			cpu.leave()
			s.m.bad.WithLabelValues("body").Inc()
			_ = stream.Send(immediate(typev3.StatusCode_BadRequest, err.Error()))
			return nil, nil
		}
		r.cpu = cpu // given back before the index query (pick)
		defer s.release(r)
	}
	d, done, err := s.Pick(s.requestContext(stream.Context(), hdr), r, subset)
	if err != nil {
		code := typev3.StatusCode_InternalServerError
		switch {
		case errors.Is(err, ErrNoEndpoint):
			code = typev3.StatusCode_ServiceUnavailable
		case errors.Is(err, ErrUnknownModel):
			code = typev3.StatusCode_NotFound
		}
		_ = stream.Send(immediate(code, err.Error()))
		return nil, nil
	}
	fl := &flight{done: done, fallback: string(d.Fallback)}
	if o := s.cfg.Outcomes; o != nil && r != nil {
		for _, sc := range d.Scores {
			if sc.Pod == d.Pod {
				o.Predicted(r.Model, sc.MatchedTokens)
				fl.model, fl.observe = r.Model, true
				break
			}
		}
	}
	set := []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: HeaderDestination, RawValue: []byte(d.Endpoint)}}}
	if body != nil {
		set = append(set, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "content-length", RawValue: []byte(strconv.Itoa(len(body)))}})
	}
	pick := map[string]*structpb.Value{IndexSeqKey: structpb.NewStringValue(strconv.FormatUint(d.IndexSeq, 10))}
	if d.Fallback != "" {
		set = append(set, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: HeaderFallback, RawValue: []byte(d.Fallback)}})
		pick[FallbackKey] = structpb.NewStringValue(string(d.Fallback))
	}
	md := &structpb.Struct{Fields: map[string]*structpb.Value{
		MetadataNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			HeaderDestination: structpb.NewStringValue(d.Endpoint),
		}}),
		PickNamespace: structpb.NewStructValue(&structpb.Struct{Fields: pick}),
	}}
	out := []*extprocv3.ProcessingResponse{{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
			ClearRouteCache: true,
			HeaderMutation:  &extprocv3.HeaderMutation{SetHeaders: set},
		}}},
		DynamicMetadata: md,
	}}
	if body != nil {
		out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
			Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
				StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body, EndOfStream: true}}}},
		}}})
	}
	return out, fl
}

// flight is one routed request until its response has passed.
type flight struct {
	done     func() // ends the pick's in-flight count; idempotent
	fallback string // the pick's picker.Fallback, set on the response too
	model    string
	observe  bool   // the response goes to Config.Outcomes
	resp     []byte // the response body so far, while observed
}

// response takes one response body frame; the last one ends the flight.
func (fl *flight) response(frame []byte, eos bool, cfg *Config) {
	if fl.observe {
		if len(fl.resp)+len(frame) > cfg.MaxBody {
			fl.observe, fl.resp = false, nil // too large to keep: not reported
		} else {
			fl.resp = append(fl.resp, frame...)
		}
	}
	if !eos {
		return
	}
	fl.done()
	if fl.observe {
		cfg.Outcomes.Responded(fl.model, fl.resp)
		fl.observe, fl.resp = false, nil
	}
}

func immediate(code typev3.StatusCode, msg string) *extprocv3.ProcessingResponse {
	b, _ := jsonError(msg)
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: code},
		Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/json")}}}},
		Body:    b,
		Details: "kvindex-picker",
	}}}
}

// headerMap returns the request headers by lower-case name (Envoy sends
// values in RawValue; Value is read too).
func headerMap(h *corev3.HeaderMap) map[string]string {
	out := make(map[string]string, len(h.GetHeaders()))
	for _, hv := range h.GetHeaders() {
		v := string(hv.GetRawValue())
		if v == "" {
			v = hv.GetValue()
		}
		out[strings.ToLower(hv.GetKey())] = v
	}
	return out
}

// subsetHint returns the gateway's candidate subset: nil when the hint is
// absent (every endpoint may serve), else the listed addresses (possibly
// none: then none may).
func subsetHint(md *corev3.Metadata) []string {
	ns, ok := md.GetFilterMetadata()[SubsetNamespace]
	if !ok {
		return nil
	}
	v, ok := ns.GetFields()[SubsetKey]
	if !ok {
		return nil
	}
	out := []string{}
	switch k := v.GetKind().(type) {
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			if s := e.GetStringValue(); s != "" {
				out = append(out, s)
			}
		}
	case *structpb.Value_StringValue:
		for _, e := range strings.Split(k.StringValue, ",") {
			if e = strings.TrimSpace(e); e != "" {
				out = append(out, e)
			}
		}
	}
	return out
}
