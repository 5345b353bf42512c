package main

import (
	"strings"
	"testing"
)

// serve, picker and relay take the tracing flags and the OTEL_*
// variables (the flag winning), say in --check where traces go, and
// refuse a collector address they cannot use, naming its source.
func TestTracingFlags(t *testing.T) {
	base := map[string][]string{
		"serve":  {"serve", "--check", "--model", "m", "--engine", "a=tcp://h:5557"},
		"picker": {"picker", "--check", "--index", "kvindex:50051", "--endpoint", "a=10.0.0.1:8000"},
		"relay":  {"relay", "--check", "--model", "m", "--nats", "nats://nats:4222", "--nats-insecure", "--engine", "a=tcp://h:5557"},
	}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		// want is in stdout (exit 0), or, with usage, stderr (exit 2).
		want  string
		usage bool
	}{
		{name: "flag", args: []string{"--otlp-endpoint", "http://otel:4317", "--trace-sample-ratio", "0.1"},
			want: "tracing: OTLP/gRPC to http://otel:4317, service kvindex-CMD, sampler ParentBased{root:TraceIDRatioBased{0.1}"},
		{name: "variables", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://otel:4317", "OTEL_SERVICE_NAME": "edge"},
			want: "tracing: OTLP/gRPC to https://otel:4317, service edge, sampler ParentBased{root:AlwaysOnSampler"},
		{name: "flag over variable", args: []string{"--otlp-endpoint", "http://flag:4317"}, env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://env:4317"},
			want: "tracing: OTLP/gRPC to http://flag:4317,"},
		{name: "bad flag", args: []string{"--otlp-endpoint", "otel:4317"}, usage: true,
			want: `kvindex: --otlp-endpoint "otel:4317": want http://HOST:PORT (plaintext) or https://HOST:PORT (TLS)`},
		{name: "bad variable", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel"}, usage: true,
			want: `kvindex: OTEL_EXPORTER_OTLP_ENDPOINT "http://otel": want a port`},
	} {
		for _, cmd := range []string{"serve", "picker", "relay"} {
			t.Run(tc.name+"/"+cmd, func(t *testing.T) {
				for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SERVICE_NAME", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_SDK_DISABLED"} {
					t.Setenv(k, tc.env[k])
				}
				stdout, stderr, code := runCLI(t, append(append([]string{}, base[cmd]...), tc.args...)...)
				want := strings.ReplaceAll(tc.want, "CMD", cmd)
				switch {
				case tc.usage && (code != exitUsage || !strings.HasPrefix(stderr, want)):
					t.Errorf("exit %d, stderr %q; want exit 2 and %q", code, stderr, want)
				case !tc.usage && (code != 0 || !strings.Contains(stdout, want)):
					t.Errorf("exit %d, stdout %q, stderr %q; want %q", code, stdout, stderr, want)
				}
			})
		}
	}
}
