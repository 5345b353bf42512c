package server

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/tokenizer"
)

// maxListedModels bounds the models an unknown-model error names.
const maxListedModels = 10

// unknownModel is the NotFound answer to a query for a model kvindex does
// not know, naming the ones it knows (known, sorted), so that a typo or a
// LoRA adapter asked as a model is plain to see.
func unknownModel(model string, known []string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "unknown model %q: ", model)
	if len(known) == 0 {
		b.WriteString("kvindex follows no model yet (it has no default model, no engine configured with a model, and no engine has sent events)")
		return status.Error(codes.NotFound, b.String())
	}
	b.WriteString("kvindex follows ")
	for i, m := range known[:min(len(known), maxListedModels)] {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Quote(m))
	}
	if n := len(known) - maxListedModels; n > 0 {
		fmt.Fprintf(&b, " and %d more", n)
	}
	return status.Error(codes.NotFound, b.String())
}

// tokenizeProblem says what went wrong with one tokenizer backend. For
// the engine's /tokenize it names the server root (--tokenize-url), and
// says "unreachable" when no HTTP exchange took place.
func tokenizeProblem(t NamedTokenizer, err error) string {
	u, ok := t.Tokenizer.(interface{ URL() string })
	if !ok {
		return t.Source + " tokenizer: " + err.Error()
	}
	where := fmt.Sprintf("the %s's /tokenize at %s", t.Source, strings.TrimSuffix(u.URL(), "/tokenize"))
	var ue *url.Error
	var se *tokenizer.StatusError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("%s answered HTTP %d: %s", where, se.StatusCode, se.Message)
	case errors.As(err, &ue) && !ue.Timeout():
		return where + " is unreachable: " + ue.Err.Error()
	}
	msg := err.Error()
	if _, after, ok := strings.Cut(msg, u.URL()+": "); ok {
		msg = after // the URL is said already
	}
	return where + ": " + msg
}

// tokenizeError is the answer when no tokenizer backend could tokenize a
// prompt; problems are tokenizeProblem's, one per backend. It carries an
// ErrorInfo whose "problem" is the same text: ReasonTokenizerUnavailable
// on an Unavailable answer, so that a caller can tell "kvindex could not
// tokenize" from "kvindex could not be reached" (client.TokenizerUnavailable),
// else ReasonTokenizeFailed (client.TokenizeFailed sees both).
func tokenizeError(code codes.Code, problems []string) error {
	problem := strings.Join(problems, "; ")
	st := status.New(code, "cannot tokenize the prompt: "+problem)
	reason := client.ReasonTokenizeFailed
	if code == codes.Unavailable {
		reason = client.ReasonTokenizerUnavailable
	}
	withInfo, err := st.WithDetails(&errdetails.ErrorInfo{
		Reason:   reason,
		Domain:   client.ErrorDomain,
		Metadata: map[string]string{"problem": problem},
	})
	if err != nil {
		return st.Err() // only a bug makes a detail unencodable; the message says it all
	}
	return withInfo.Err()
}
