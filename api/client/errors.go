package client

import (
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo details kvindex
// attaches to some errors.
const ErrorDomain = "kvindex.v1"

// ReasonTokenizerUnavailable is the ErrorInfo reason of an Unavailable
// answer caused by the server's tokenizer backend (the engine's
// /tokenize), not by the server itself: the server is up, but could not
// turn a text or chat prompt into token ids. Its metadata "problem" says
// why, naming the backend's URL.
const ReasonTokenizerUnavailable = "TOKENIZER_UNAVAILABLE"

// ReasonTokenizeFailed is the ErrorInfo reason of the other answers
// that say the server could not tokenize a text or chat prompt: it has
// no tokenizer that can (FailedPrecondition), or its tokenizer refused
// the prompt (InvalidArgument). Its metadata "problem" says why.
const ReasonTokenizeFailed = "TOKENIZE_FAILED"

// TokenizeFailed reports whether err is any of the server's answers that
// it could not tokenize the prompt (ReasonTokenizerUnavailable or
// ReasonTokenizeFailed), and what the problem was: the query might
// succeed with token ids.
func TokenizeFailed(err error) (problem string, ok bool) {
	st, isStatus := status.FromError(err)
	if !isStatus {
		return "", false
	}
	for _, d := range st.Details() {
		if info, isInfo := d.(*errdetails.ErrorInfo); isInfo && info.GetDomain() == ErrorDomain &&
			(info.GetReason() == ReasonTokenizerUnavailable || info.GetReason() == ReasonTokenizeFailed) {
			return info.GetMetadata()["problem"], true
		}
	}
	return "", false
}

// TokenizerUnavailable reports whether err is the server's answer that
// its tokenizer backend could not tokenize the prompt (unreachable,
// timing out or failing), and what the problem was. A router can then
// retry with token ids; an Unavailable error without it means that
// kvindex itself could not be reached.
func TokenizerUnavailable(err error) (problem string, ok bool) {
	st, isStatus := status.FromError(err)
	if !isStatus || st.Code() != codes.Unavailable {
		return "", false
	}
	for _, d := range st.Details() {
		if info, isInfo := d.(*errdetails.ErrorInfo); isInfo &&
			info.GetDomain() == ErrorDomain && info.GetReason() == ReasonTokenizerUnavailable {
			return info.GetMetadata()["problem"], true
		}
	}
	return "", false
}
