package main

import (
	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/api/server"
	"github.com/kvindex/kvindex/internal/bytesize"
)

// limitFlags are serve's resource bounds: one flag per server.Limits
// field, each defaulting to server.DefaultLimits (their one home).
type limitFlags struct {
	l     server.Limits
	fs    *pflag.FlagSet
	names []string // the flags, for limits' check
}

func (f *limitFlags) register(fs *pflag.FlagSet) {
	d := server.DefaultLimits
	f.fs = fs
	before := map[string]bool{}
	fs.VisitAll(func(fl *pflag.Flag) { before[fl.Name] = true })

	fs.DurationVar(&f.l.HTTPReadHeaderTimeout, "http-read-header-timeout", d.HTTPReadHeaderTimeout, "HTTP: time a client has to send a request's headers")
	fs.DurationVar(&f.l.HTTPReadTimeout, "http-read-timeout", d.HTTPReadTimeout, "HTTP: time a client has to send a whole request, body included")
	fs.DurationVar(&f.l.HTTPWriteTimeout, "http-write-timeout", d.HTTPWriteTimeout, "HTTP: time to answer a request (also caps /debug/pprof/profile?seconds=)")
	fs.DurationVar(&f.l.HTTPIdleTimeout, "http-idle-timeout", d.HTTPIdleTimeout, "HTTP: keep-alive connections idle this long are closed")
	fs.IntVar(&f.l.HTTPMaxConns, "http-max-conns", d.HTTPMaxConns, "HTTP: open connections at most; more wait until one closes; one client address may hold a quarter of them (more are closed at once)")
	fs.Uint32Var(&f.l.GRPCMaxStreams, "grpc-max-streams", d.GRPCMaxStreams, "gRPC: concurrent calls per connection")
	fs.DurationVar(&f.l.GRPCMaxConnIdle, "grpc-max-conn-idle", d.GRPCMaxConnIdle, "gRPC: connections without calls this long are closed (clients reconnect transparently)")
	fs.DurationVar(&f.l.GRPCKeepaliveTime, "grpc-keepalive-time", d.GRPCKeepaliveTime, "gRPC: ping a quiet connection this often to find dead peers")
	fs.DurationVar(&f.l.GRPCKeepaliveTimeout, "grpc-keepalive-timeout", d.GRPCKeepaliveTimeout, "gRPC: close a connection whose ping is not answered within this")
	fs.DurationVar(&f.l.GRPCKeepaliveMinTime, "grpc-keepalive-min-time", d.GRPCKeepaliveMinTime, "gRPC: clients pinging more often than this are disconnected")
	fs.Int64Var(&f.l.MaxTokensInFlight, "max-tokens-in-flight", 0, "tokens of all queries answered at once (text prompts count bytes); beyond it queries get RESOURCE_EXHAUSTED / HTTP 429; 0: 4 x --max-query-tokens")
	fs.IntVar(&f.l.MetricsEngines, "metrics-engines", d.MetricsEngines, "engine ranks with /metrics series of their own at most: beyond it those not ok first (kvindex_engines counts them all, kvindex_metrics_engines_omitted the rest)")
	fs.IntVar(&f.l.MaxWatchers, "max-watchers", d.MaxWatchers, "concurrent Watch streams (kvindex tail) at most")
	fs.IntVar(&f.l.WatchQueueEvents, "watch-queue-events", d.WatchQueueEvents, "events a Watch stream may fall behind before it is closed (it reconnects)")
	fs.Var((*bytesize.Value)(&f.l.WatchQueueBytes), "watch-queue-bytes", "bytes of events a Watch stream may fall behind before it is closed")
	fs.IntVar(&f.l.HubQueueBatches, "watch-fanout-queue", d.HubQueueBatches, "batches waiting for the watch fan-out at most; beyond it every Watch stream is closed (ingest never waits)")
	fs.Var((*bytesize.Value)(&f.l.HubQueueBytes), "watch-fanout-bytes", "bytes of batches waiting for the watch fan-out at most")
	f.l.WatchQueueBytes, f.l.HubQueueBytes = d.WatchQueueBytes, d.HubQueueBytes
	fs.Lookup("watch-queue-bytes").DefValue = fs.Lookup("watch-queue-bytes").Value.String()
	fs.Lookup("watch-fanout-bytes").DefValue = fs.Lookup("watch-fanout-bytes").Value.String()

	fs.VisitAll(func(fl *pflag.Flag) {
		if !before[fl.Name] {
			f.names = append(f.names, fl.Name)
		}
	})
}

// limits checks the flags: every bound is positive (0 would read as "no
// limit", which none of them offers), except --max-tokens-in-flight,
// whose 0 sizes it from maxQueryTokens.
func (f *limitFlags) limits(maxQueryTokens int) (server.Limits, error) {
	for _, name := range f.names {
		v := f.fs.Lookup(name).Value.String()
		if name == "max-tokens-in-flight" && v == "0" {
			continue
		}
		if v == "0" || v == "0s" || v[0] == '-' {
			return f.l, usagef("--%s %s: want a positive value", name, v)
		}
	}
	l := f.l
	if l.MaxTokensInFlight == 0 {
		l.MaxTokensInFlight = server.TokensInFlightFactor * int64(maxQueryTokens)
	}
	if err := l.Check(maxQueryTokens); err != nil {
		return l, configUsage(err, serveFlagNames)
	}
	return l, nil
}
