package telemetry

import (
	"net/http"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// Flags win over variables; tracing is on when either names an endpoint;
// the sampler and the service name come from the flags, the variables,
// or the defaults; bad values are refused naming the flag or variable.
func TestConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		// want: the endpoint, service and sampler description; or the
		// error's text.
		endpoint, service, sampler, err string
	}{
		{name: "off by default", service: "kvindex-serve"},
		{name: "flag", args: []string{"--otlp-endpoint", "http://otel:4317"},
			endpoint: "http://otel:4317", service: "kvindex-serve", sampler: "ParentBased{root:AlwaysOnSampler"},
		{name: "generic variable", env: map[string]string{EnvEndpoint: "https://otel:4317"},
			endpoint: "https://otel:4317", service: "kvindex-serve", sampler: "ParentBased{root:AlwaysOnSampler"},
		{name: "traces variable over the generic one", env: map[string]string{EnvEndpoint: "http://a:4317", EnvTracesEndpoint: "http://b:4317"},
			endpoint: "http://b:4317", service: "kvindex-serve", sampler: "ParentBased"},
		{name: "flag over variables", args: []string{"--otlp-endpoint", "http://flag:4317"}, env: map[string]string{EnvTracesEndpoint: "http://b:4317"},
			endpoint: "http://flag:4317", service: "kvindex-serve", sampler: "ParentBased"},
		{name: "SDK disabled turns the variables off", env: map[string]string{EnvEndpoint: "http://a:4317", EnvSDKDisabled: "true"}, service: "kvindex-serve"},
		{name: "a flag still turns it on", args: []string{"--otlp-endpoint", "http://flag:4317"}, env: map[string]string{EnvSDKDisabled: "true"},
			endpoint: "http://flag:4317", service: "kvindex-serve", sampler: "ParentBased"},
		{name: "service name variable", env: map[string]string{EnvEndpoint: "http://a:4317", EnvServiceName: "router-7"},
			endpoint: "http://a:4317", service: "router-7", sampler: "ParentBased"},
		{name: "ratio flag", args: []string{"--otlp-endpoint", "http://a:4317", "--trace-sample-ratio", "0.25"},
			endpoint: "http://a:4317", service: "kvindex-serve", sampler: "ParentBased{root:TraceIDRatioBased{0.25}"},
		{name: "ratio flag over the sampler variables", args: []string{"--otlp-endpoint", "http://a:4317", "--trace-sample-ratio", "0.5"},
			env:      map[string]string{EnvSampler: "always_off"},
			endpoint: "http://a:4317", service: "kvindex-serve", sampler: "ParentBased{root:TraceIDRatioBased{0.5}"},
		{name: "sampler variables", env: map[string]string{EnvEndpoint: "http://a:4317", EnvSampler: "traceidratio", EnvSamplerArg: "0.1"},
			endpoint: "http://a:4317", service: "kvindex-serve", sampler: "TraceIDRatioBased{0.1}"},
		{name: "always_off", env: map[string]string{EnvEndpoint: "http://a:4317", EnvSampler: "always_off"},
			endpoint: "http://a:4317", service: "kvindex-serve", sampler: "AlwaysOffSampler"},
		{name: "no scheme", args: []string{"--otlp-endpoint", "otel:4317"}, err: `--otlp-endpoint "otel:4317": want http://HOST:PORT`},
		{name: "no port", env: map[string]string{EnvEndpoint: "http://otel"}, err: EnvEndpoint + ` "http://otel": want a port`},
		{name: "a path", env: map[string]string{EnvTracesEndpoint: "http://otel:4318/v1/traces"}, err: `OTLP/gRPC takes no path`},
		{name: "unknown sampler", env: map[string]string{EnvEndpoint: "http://a:4317", EnvSampler: "sometimes"}, err: EnvSampler + ` "sometimes"`},
		{name: "bad sampler argument", env: map[string]string{EnvEndpoint: "http://a:4317", EnvSampler: "traceidratio", EnvSamplerArg: "2"}, err: EnvSamplerArg + ` "2": want a number in 0..1`},
		{name: "bad ratio flag", args: []string{"--trace-sample-ratio", "-1"}, err: `"-1": want a number in 0..1`},
		{name: "empty ratio flag: none given", args: []string{"--otlp-endpoint", "http://a:4317", "--trace-sample-ratio", ""},
			env:      map[string]string{EnvSampler: "always_off"},
			endpoint: "http://a:4317", service: "kvindex-serve", sampler: "AlwaysOffSampler"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f Flags
			fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
			f.Register(fs, "kvindex-serve")
			err := fs.Parse(tc.args)
			var c Config
			if err == nil {
				c, err = f.Config(func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			}
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Endpoint != tc.endpoint || c.ServiceName != tc.service || c.Enabled() != (tc.endpoint != "") {
				t.Errorf("endpoint %q service %q (enabled %v), want %q and %q", c.Endpoint, c.ServiceName, c.Enabled(), tc.endpoint, tc.service)
			}
			if tc.sampler == "" {
				if c.Sampler != nil {
					t.Errorf("tracing off has a sampler: %s", c.Sampler.Description())
				}
			} else if c.Sampler == nil || !strings.HasPrefix(c.Sampler.Description(), tc.sampler) {
				t.Errorf("sampler %v, want %s...", c.Sampler, tc.sampler)
			}
		})
	}
}

// Off, New builds nothing and every method installs nothing; on, it
// installs a stats handler on servers and clients and wraps the HTTP
// handler, without dialling the collector.
func TestNew(t *testing.T) {
	off, err := New(Config{})
	if err != nil || off != nil {
		t.Fatalf("New(off) = %v, %v; want nil, nil", off, err)
	}
	var h http.Handler = http.NewServeMux()
	if off.Enabled() || off.Tracer() != nil || off.Provider() != nil || off.ServerOptions() != nil || off.DialOptions() != nil {
		t.Error("tracing off installs something")
	}
	if got := off.Handler(h); got != h {
		t.Errorf("tracing off wraps the handler: %T", got)
	}
	if err := off.Shutdown(t.Context()); err != nil {
		t.Error(err)
	}

	var f Flags
	f.ServiceName = "kvindex-picker"
	f.Endpoint = "http://127.0.0.1:1" // never dialled: nothing is exported
	c, err := f.Config(func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	on, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	if !on.Enabled() || on.Tracer() == nil || len(on.ServerOptions()) != 1 || len(on.DialOptions()) != 1 {
		t.Error("tracing on installs no tracer or stats handler")
	}
	if on.Handler(h) == h {
		t.Error("tracing on does not wrap the handler")
	}
	if err := on.Shutdown(t.Context()); err != nil {
		t.Errorf("shutdown with nothing to flush: %v", err)
	}
}
