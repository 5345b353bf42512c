package zmqtransport

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// LLMDTopicPattern is llm-d's topic convention, kv@<pod>@<model>, in the
// template syntax of TopicPattern. It is the default pattern of a listen
// socket. The pod ends at the first '@' after "kv@"; everything after it is
// the model, which may itself contain '@' (pods are IPs or DNS labels and
// cannot).
const LLMDTopicPattern = "kv@{pod}@{model}"

// TopicPattern extracts an engine's identity (pod and model) from the topic
// it publishes on. It is written either as
//
//   - a template: literal text with the placeholders {pod} and {model}
//     (e.g. "kv@{pod}@{model}" or "events.{model}.{pod}"). A placeholder
//     matches at least one character, as few as possible, except the last
//     one, which takes the rest of the topic; or
//   - a Go regular expression (anything containing "(?P<"), matched
//     against the whole topic, with the named groups "pod" (required) and
//     "model" (optional).
//
// When the pattern has no model, the listener's configured model is used.
type topicPattern struct {
	src        string
	llmd       bool // the fast path for LLMDTopicPattern
	re         *regexp.Regexp
	pod, model int // submatch indexes; model < 0 when absent
}

func compileTopicPattern(p string) (*topicPattern, error) {
	if p == "" || p == LLMDTopicPattern {
		return &topicPattern{src: LLMDTopicPattern, llmd: true}, nil
	}
	var expr string
	if strings.Contains(p, "(?P<") {
		expr = p
		if !strings.HasPrefix(expr, "^") {
			expr = "^(?:" + expr + ")$"
		}
	} else {
		var err error
		if expr, err = templateRegexp(p); err != nil {
			return nil, err
		}
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		return nil, fmt.Errorf("topic pattern %q: %w", p, err)
	}
	tp := &topicPattern{src: p, re: re, pod: re.SubexpIndex("pod"), model: re.SubexpIndex("model")}
	if tp.pod < 0 {
		return nil, fmt.Errorf("topic pattern %q has no pod", p)
	}
	return tp, nil
}

// templateRegexp turns a {pod}/{model} template into an anchored regexp.
func templateRegexp(t string) (string, error) {
	var b strings.Builder
	b.WriteString("^")
	rest := t
	seen := map[string]bool{}
	for rest != "" {
		literal, after, ok := strings.Cut(rest, "{")
		if !ok {
			b.WriteString(regexp.QuoteMeta(rest))
			break
		}
		b.WriteString(regexp.QuoteMeta(literal))
		name, after, ok := strings.Cut(after, "}")
		if !ok {
			return "", fmt.Errorf("topic template %q: unclosed '{'", t)
		}
		if name != "pod" && name != "model" {
			return "", fmt.Errorf("topic template %q: unknown placeholder {%s} (want {pod} or {model})", t, name)
		}
		if seen[name] {
			return "", fmt.Errorf("topic template %q: {%s} appears twice", t, name)
		}
		seen[name] = true
		rest = after
		if rest == "" {
			b.WriteString("(?P<" + name + ">.+)")
		} else {
			b.WriteString("(?P<" + name + ">.+?)")
		}
	}
	if !seen["pod"] {
		return "", fmt.Errorf("topic template %q has no {pod}", t)
	}
	b.WriteString("$")
	return b.String(), nil
}

// errTopic is returned for topics a pattern does not match.
var errTopic = errors.New("topic does not match the pattern")

// parse returns the pod and model a topic names; model is "" when the
// pattern has none.
func (tp *topicPattern) parse(topic string) (pod, model string, err error) {
	if tp.llmd {
		rest, ok := strings.CutPrefix(topic, "kv@")
		if !ok {
			return "", "", errTopic
		}
		pod, model, ok = strings.Cut(rest, "@")
		if !ok || pod == "" || model == "" {
			return "", "", errTopic
		}
		return pod, model, nil
	}
	m := tp.re.FindStringSubmatch(topic)
	if m == nil || m[tp.pod] == "" {
		return "", "", errTopic
	}
	if tp.model >= 0 {
		model = m[tp.model]
	}
	return m[tp.pod], model, nil
}

// CheckReplayTemplate reports whether tmpl is a usable bind-mode replay
// template (SubscriberConfig.ReplayTemplate) for engines of up to ranks
// data-parallel ranks: it names {addr} or {pod} (without either every
// engine would ask one socket for its gaps) and is an endpoint to connect
// to, the placeholders standing in for the host. A template ending in a
// placeholder may take its port from it and is not checked further. The
// error is an *EndpointError.
func CheckReplayTemplate(tmpl string, ranks int) error {
	if !strings.Contains(tmpl, "{pod}") && !strings.Contains(tmpl, "{addr}") {
		return &EndpointError{Endpoint: tmpl, Reason: "no {addr} or {pod}: every engine would ask one socket for its gaps (want e.g. tcp://{addr}:5567)"}
	}
	if strings.HasSuffix(tmpl, "}") {
		return nil
	}
	return CheckConnectEndpoint(tmpl, ranks)
}

// CheckSourceReplayTemplate reports whether tmpl dials only the address
// an engine's events come from: tcp://{addr}:PORT, the one form allowed
// with engine allow rules, so that no topic can choose a host for kvindex
// to connect to. The error is an *EndpointError.
func CheckSourceReplayTemplate(tmpl string) error {
	port, ok := strings.CutPrefix(tmpl, "tcp://{addr}:")
	if !ok || strings.ContainsAny(port, "{}") {
		return &EndpointError{Endpoint: tmpl, Reason: "with engine allow rules the replay host must be the engine's source address: want tcp://{addr}:PORT, e.g. tcp://{addr}:5567 (a host taken from the topic would let any peer choose where kvindex connects)"}
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return &EndpointError{Endpoint: tmpl, Reason: fmt.Sprintf("port %q is not in 1..65535", port)}
	}
	return nil
}

// expandReplayTemplate fills a bind-mode replay template such as
// "tcp://{addr}:5567" for one engine's rank: {addr} is the engine's source
// address (an IPv6 one in brackets), {pod} and {model} its topic's. It
// fails for {addr} while the source is unknown ("").
func expandReplayTemplate(tmpl, pod, model, addr string, rank int) (string, error) {
	if strings.Contains(tmpl, "{addr}") {
		if addr == "" {
			return "", errors.New("the engine's source address is not known yet")
		}
		if strings.Contains(addr, ":") {
			addr = "[" + addr + "]"
		}
		tmpl = strings.ReplaceAll(tmpl, "{addr}", addr)
	}
	ep := strings.ReplaceAll(tmpl, "{pod}", pod)
	ep = strings.ReplaceAll(ep, "{model}", model)
	if err := CheckConnectEndpoint(ep, rank+1); err != nil {
		return "", err
	}
	return offsetEndpoint(ep, rank)
}
