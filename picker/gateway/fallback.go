package gateway

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/picker"
)

// Response headers and metadata keys the picker sets.
const (
	// HeaderFallback is set on a request routed without the index's
	// answer, to its reason (picker.Fallback): over ext_proc it is added
	// to the request's headers and to its response's, so that the
	// engine, the client and the gateway's access log see it; /v1/pick
	// sets it on its answer.
	HeaderFallback = "x-kvindex-fallback"
	// FallbackKey is the PickNamespace metadata key of the same reason.
	FallbackKey = "fallback"
)

// FallbackLogEvery is how often, at most, a fallback is logged at WARN
// for each reason: a dead index makes every request fall back, and one
// line per interval (with the count since the last) says it as well.
const FallbackLogEvery = 10 * time.Second

// UnknownModel is what the ext_proc front does with a request whose model
// the index does not know.
type UnknownModel string

const (
	// UnknownModelRoute routes it by load and session, with the reason
	// picker.FallbackUnknownModel in HeaderFallback and the metadata:
	// the engine answers it (usually with its own 404).
	UnknownModelRoute UnknownModel = "route"
	// UnknownModelReject answers it 404 at once, naming the model.
	UnknownModelReject UnknownModel = "reject"
)

// ParseUnknownModel reads "route" or "reject" ("" is route).
func ParseUnknownModel(s string) (UnknownModel, error) {
	switch UnknownModel(s) {
	case "", UnknownModelRoute:
		return UnknownModelRoute, nil
	case UnknownModelReject:
		return UnknownModelReject, nil
	}
	return "", errors.New("want route or reject")
}

// ErrUnknownModel is matched (errors.Is) by Pick's error when the index
// does not know the request's model and the request is rejected for it
// (UnknownModelReject, and always on /v1/pick): answer 404.
var ErrUnknownModel = errors.New("unknown model")

// unknownModelError is ErrUnknownModel with the index's own words, which
// name the model and the ones it knows.
type unknownModelError struct{ msg string }

func (e unknownModelError) Error() string        { return e.msg }
func (e unknownModelError) Is(target error) bool { return target == ErrUnknownModel }

// fallbackOf is the reason an index query failed with err; ctx is the
// query's context.
func fallbackOf(ctx context.Context, err error) picker.Fallback {
	if _, ok := client.TokenizeFailed(err); ok {
		return picker.FallbackTokenizer
	}
	switch status.Code(err) {
	case codes.DeadlineExceeded:
		return picker.FallbackTimeout
	case codes.NotFound:
		return picker.FallbackUnknownModel
	case codes.FailedPrecondition: // the index has no tokenizer for a text prompt
		return picker.FallbackTokenizer
	case codes.ResourceExhausted:
		return picker.FallbackOverloaded
	case codes.Unavailable:
		return picker.FallbackIndexUnreachable
	}
	if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
		return picker.FallbackTimeout
	}
	return picker.FallbackError
}

// fallbackLog logs fallbacks at WARN, at most once per FallbackLogEvery
// for each reason, with how many went unlogged since. Its memory is one
// entry per reason, whatever the models asked.
type fallbackLog struct {
	log *slog.Logger
	now func() time.Time

	mu   sync.Mutex
	last map[picker.Fallback]time.Time
	held map[picker.Fallback]int
}

func newFallbackLog(log *slog.Logger, now func() time.Time) *fallbackLog {
	return &fallbackLog{log: log, now: now, last: map[picker.Fallback]time.Time{}, held: map[picker.Fallback]int{}}
}

// note logs one fallback, or counts it until the reason's next line;
// msg says what the picker did with the request.
func (l *fallbackLog) note(reason picker.Fallback, model, msg string, err error) {
	now := l.now()
	l.mu.Lock()
	if last, ok := l.last[reason]; ok && now.Sub(last) < FallbackLogEvery {
		l.held[reason]++
		l.mu.Unlock()
		return
	}
	unlogged := l.held[reason]
	l.last[reason], l.held[reason] = now, 0
	l.mu.Unlock()
	args := []any{"reason", string(reason), "model", model, "unlogged_since_last", unlogged}
	if err != nil {
		args = append(args, "err", status.Convert(err).Message())
	}
	l.log.Warn(msg, args...)
}
