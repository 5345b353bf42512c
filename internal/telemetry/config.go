// Package telemetry is kvindex's OpenTelemetry tracing: the flags serve,
// picker and relay share, their resolution against the standard OTEL_*
// variables, and the tracer provider that exports spans over OTLP/gRPC.
//
// Tracing is off unless a collector is named (--otlp-endpoint, or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT). Off,
// New returns a nil *Tracing, whose methods install nothing: no gRPC stats
// handler, no HTTP middleware, and a nil trace.Tracer, which the
// instrumented packages (api/server, picker/gateway) test before starting
// a span, so the hot paths pay one nil check.
package telemetry

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// The standard variables read besides the flags (the exporter reads its
// own others, such as OTEL_EXPORTER_OTLP_HEADERS, and the batch
// processor OTEL_BSP_*).
const (
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvSampler        = "OTEL_TRACES_SAMPLER"
	EnvSamplerArg     = "OTEL_TRACES_SAMPLER_ARG"
	EnvServiceName    = "OTEL_SERVICE_NAME"
	EnvSDKDisabled    = "OTEL_SDK_DISABLED"
)

// Flag names.
const (
	FlagEndpoint    = "otlp-endpoint"
	FlagSampleRatio = "trace-sample-ratio"
)

// Flags are the tracing flags of kvindex serve, picker and relay.
type Flags struct {
	Endpoint string
	Ratio    RatioValue
	// ServiceName is the name traces carry unless OTEL_SERVICE_NAME
	// gives one: the command's (kvindex-serve, kvindex-picker,
	// kvindex-relay).
	ServiceName string
}

// Register adds the flags to fs; service is the default service name.
func (f *Flags) Register(fs *pflag.FlagSet, service string) {
	f.ServiceName = service
	fs.StringVar(&f.Endpoint, FlagEndpoint, "", "export traces over OTLP/gRPC to this collector: http://HOST:PORT (plaintext) or https://HOST:PORT (TLS); default "+EnvTracesEndpoint+" or "+EnvEndpoint+"; none: tracing off")
	fs.Var(&f.Ratio, FlagSampleRatio, "with tracing on, the fraction of new traces sampled, 0..1; a request's traceparent decides for its own trace (default "+EnvSampler+" and "+EnvSamplerArg+", else 1)")
}

// RatioValue is a sampling ratio flag that knows whether it was given:
// without it the sampler comes from the variables.
type RatioValue struct {
	ratio float64
	set   bool
}

func (r *RatioValue) String() string {
	if !r.set {
		return ""
	}
	return strconv.FormatFloat(r.ratio, 'g', -1, 64)
}

// Set parses a ratio; "" (an empty variable or file value) is none
// given.
func (r *RatioValue) Set(s string) error {
	if strings.TrimSpace(s) == "" {
		*r = RatioValue{}
		return nil
	}
	v, err := parseRatio(s)
	if err != nil {
		return err
	}
	r.ratio, r.set = v, true
	return nil
}

func (r *RatioValue) Type() string { return "ratio" }

func parseRatio(s string) (float64, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || !(v >= 0 && v <= 1) {
		return 0, fmt.Errorf("%q: want a number in 0..1", s)
	}
	return v, nil
}

// Config is tracing as resolved from flags and variables.
type Config struct {
	// Endpoint is the collector's URL (http:// plaintext, https://
	// TLS); "": tracing is off.
	Endpoint string
	// Sampler decides which new traces are recorded; nil when off.
	Sampler sdktrace.Sampler
	// ServiceName is the service.name resource attribute.
	ServiceName string
}

// Enabled reports whether c turns tracing on.
func (c Config) Enabled() bool { return c.Endpoint != "" }

// Config resolves the flags against the environment (os.LookupEnv
// outside tests): a flag wins over its variable. Tracing is on when an
// endpoint is given by either, unless OTEL_SDK_DISABLED=true and no flag
// gives it.
func (f *Flags) Config(lookupEnv func(string) (string, bool)) (Config, error) {
	env := func(k string) string { v, _ := lookupEnv(k); return strings.TrimSpace(v) }
	c := Config{ServiceName: f.ServiceName}
	if v := env(EnvServiceName); v != "" {
		c.ServiceName = v
	}
	from := "--" + FlagEndpoint
	c.Endpoint = f.Endpoint
	if c.Endpoint == "" {
		if strings.EqualFold(env(EnvSDKDisabled), "true") {
			return Config{ServiceName: c.ServiceName}, nil
		}
		from = EnvTracesEndpoint
		if c.Endpoint = env(EnvTracesEndpoint); c.Endpoint == "" {
			from, c.Endpoint = EnvEndpoint, env(EnvEndpoint)
		}
	}
	if c.Endpoint == "" {
		return c, nil
	}
	if err := checkEndpoint(c.Endpoint); err != nil {
		return Config{}, fmt.Errorf("%s %q: %v", from, c.Endpoint, err)
	}
	var err error
	if c.Sampler, err = f.sampler(env); err != nil {
		return Config{}, err
	}
	return c, nil
}

// checkEndpoint accepts http(s)://HOST:PORT, with no path: the exporter
// speaks gRPC, which has none.
func checkEndpoint(s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return fmt.Errorf("want http://HOST:PORT (plaintext) or https://HOST:PORT (TLS)")
	case u.Path != "" && u.Path != "/":
		return fmt.Errorf("OTLP/gRPC takes no path (%q)", u.Path)
	case u.Port() == "":
		return fmt.Errorf("want a port (the collector's OTLP/gRPC port is 4317 by default)")
	}
	return nil
}

// sampler is the flag's ratio (parent-based: a sampled parent is
// followed), else OTEL_TRACES_SAMPLER's, else every trace (the
// specification's default, parentbased_always_on).
func (f *Flags) sampler(env func(string) string) (sdktrace.Sampler, error) {
	if f.Ratio.set {
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(f.Ratio.ratio)), nil
	}
	ratio := func() (float64, error) {
		arg := env(EnvSamplerArg)
		if arg == "" {
			return 1, nil
		}
		v, err := parseRatio(arg)
		if err != nil {
			return 0, fmt.Errorf("%s %v", EnvSamplerArg, err)
		}
		return v, nil
	}
	name := env(EnvSampler)
	switch name {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "traceidratio", "parentbased_traceidratio":
		r, err := ratio()
		if err != nil {
			return nil, err
		}
		if name == "traceidratio" {
			return sdktrace.TraceIDRatioBased(r), nil
		}
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(r)), nil
	}
	return nil, fmt.Errorf("%s %q: want always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio", EnvSampler, name)
}

// String says where c sends traces, for --check: "off" when off.
func (c Config) String() string {
	if !c.Enabled() {
		return "off"
	}
	return fmt.Sprintf("OTLP/gRPC to %s, service %s, sampler %s", c.Endpoint, c.ServiceName, c.Sampler.Description())
}
