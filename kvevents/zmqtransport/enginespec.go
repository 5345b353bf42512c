package zmqtransport

import (
	"errors"
	"strconv"
	"strings"

	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/kvevents"
)

// The settings an engine spec's errors name: the engine list and, in
// hints, the default model and bind mode's listen endpoint (the
// SubscriberConfig fields).
const (
	fieldEngines configerr.Field = "Engines"
	fieldModel   configerr.Field = "Model"
	fieldListen  configerr.Field = "Listen"
)

// TCPEndpoint adds tcp:// to a bare host:port; other endpoints are
// returned as they are.
func TCPEndpoint(s string) string {
	if s == "" || strings.Contains(s, "://") {
		return s
	}
	return "tcp://" + s
}

// ParseEngines parses engine specs (see ParseEngine): each valid, no
// name twice, and ports that do not overlap (CheckLayout). Errors are
// *configerr.Error of the field Engines, quoting the spec at fault.
func ParseEngines(specs []string, defaultModel string) ([]EngineConfig, error) {
	var out []EngineConfig
	seen := map[string]bool{}
	for _, s := range specs {
		ec, err := ParseEngine(s, defaultModel)
		if err != nil {
			return nil, err
		}
		if seen[ec.Name] {
			return nil, configerr.New(fieldEngines, "%v %q: the name %q is used twice", fieldEngines, s, ec.Name)
		}
		seen[ec.Name] = true
		out = append(out, ec)
	}
	var le *LayoutError
	if err := CheckLayout(out); errors.As(err, &le) {
		return nil, configerr.New(fieldEngines, "%v %q: %s", fieldEngines, specs[le.Index], le.Detail)
	}
	return out, nil
}

// ParseEngine parses an engine spec,
// NAME=ENDPOINT[,replay=ENDPOINT][,ranks=N][,model=M][,topic=PREFIX]: an
// engine to connect to. An endpoint without a scheme is taken as tcp://;
// the model defaults to defaultModel.
func ParseEngine(s, defaultModel string) (EngineConfig, error) {
	var ec EngineConfig
	bad := func(format string, args ...any) error {
		return configerr.New(fieldEngines, "%v %q: "+format, append([]any{fieldEngines, s}, args...)...)
	}
	name, rest, ok := strings.Cut(s, "=")
	if !ok || rest == "" {
		return ec, bad(`missing "=ENDPOINT" (want NAME=ENDPOINT[,replay=ENDPOINT][,ranks=N][,model=M])`)
	}
	if name == "" || strings.ContainsAny(name, ", \t") {
		return ec, bad("the name must be non-empty, without commas or spaces")
	}
	parts := strings.Split(rest, ",")
	ec.Name, ec.Endpoint, ec.Model, ec.Ranks = name, TCPEndpoint(parts[0]), defaultModel, 1
	if parts[0] == "" {
		return ec, bad("empty endpoint")
	}
	for _, opt := range parts[1:] {
		k, v, ok := strings.Cut(opt, "=")
		if !ok || v == "" {
			return ec, bad("option %q: want KEY=VALUE (replay, ranks, model or topic)", opt)
		}
		switch k {
		case "replay":
			ec.ReplayEndpoint = TCPEndpoint(v)
		case "ranks":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > kvevents.MaxDPRank {
				return ec, bad("ranks=%s: want an integer in 1..%d", v, kvevents.MaxDPRank)
			}
			ec.Ranks = n
		case "model":
			ec.Model = v
		case "topic":
			ec.Topic = v
		default:
			return ec, bad("unknown option %q (want replay, ranks, model or topic)", k)
		}
	}
	if ec.Model == "" {
		return ec, bad("no model: add ,model=M or set %v", fieldModel)
	}
	if err := CheckConnectEndpoint(ec.Endpoint, ec.Ranks); err != nil {
		return ec, engineEndpointError(bad, ec, false, err)
	}
	if ec.ReplayEndpoint != "" {
		if err := CheckConnectEndpoint(ec.ReplayEndpoint, ec.Ranks); err != nil {
			return ec, engineEndpointError(bad, ec, true, err)
		}
	}
	var le *LayoutError
	if err := CheckLayout([]EngineConfig{ec}); errors.As(err, &le) {
		return ec, bad("%s", le.Detail)
	}
	return ec, nil
}

// engineEndpointError explains why an engine's event (or replay)
// endpoint cannot be connected to. A "*" host is what the engine's own
// configuration says where it binds; kvindex needs the engine's address,
// or bind mode.
func engineEndpointError(bad func(string, ...any) error, ec EngineConfig, replay bool, err error) error {
	var ee *EndpointError
	if !errors.As(err, &ee) {
		return bad("%v", err)
	}
	which := ""
	if replay {
		which = "replay "
	}
	if !ee.Wildcard {
		return bad("%s%v", which, ee)
	}
	port := ee.Endpoint[strings.LastIndexByte(ee.Endpoint, ':')+1:]
	if !replay {
		return bad("a connect-mode endpoint needs the engine's host, e.g. tcp://10.0.0.5:%s; %q binds — for engines that connect to kvindex, use %v 'tcp://*:%s' (bind mode)",
			port, hostOf(ee.Endpoint), fieldListen, port)
	}
	example := "tcp://10.0.0.5:" + port
	if CheckConnectEndpoint(ec.Endpoint, 1) == nil && strings.HasPrefix(ec.Endpoint, "tcp://") {
		example = "tcp://" + hostOf(ec.Endpoint) + ":" + port
	}
	return bad("the replay endpoint needs the engine's host, e.g. replay=%s (%q is where the engine binds it)", example, hostOf(ee.Endpoint))
}

// hostOf returns the host of a tcp://HOST:PORT endpoint.
func hostOf(ep string) string {
	rest := strings.TrimPrefix(ep, "tcp://")
	if i := strings.LastIndexByte(rest, ':'); i >= 0 {
		return rest[:i]
	}
	return rest
}
