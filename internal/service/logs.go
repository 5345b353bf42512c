package service

import (
	"log/slog"
	"net"

	"github.com/kvindex/kvindex/api/server"
	"github.com/kvindex/kvindex/api/server/security"
	"github.com/kvindex/kvindex/internal/bytesize"
)

// logLimits logs the bounds the service runs with.
func logLimits(log *slog.Logger, l server.Limits) {
	log.Info("limits",
		"http_timeouts", l.HTTPReadHeaderTimeout.String()+"/"+l.HTTPReadTimeout.String()+"/"+l.HTTPWriteTimeout.String()+"/"+l.HTTPIdleTimeout.String(),
		"http_max_conns", l.HTTPMaxConns, "grpc_max_streams", l.GRPCMaxStreams, "grpc_max_conn_idle", l.GRPCMaxConnIdle.String(),
		"max_tokens_in_flight", l.MaxTokensInFlight, "body_bytes_in_flight", bytesize.Format(l.MaxBodyBytesInFlight), "max_watchers", l.MaxWatchers,
		"watch_queue", bytesize.Format(l.WatchQueueBytes), "watch_queue_events", l.WatchQueueEvents)
}

// logSecurity logs how the service authenticates callers, and warns when
// a listener reachable from other hosts has no authentication.
func logSecurity(log *slog.Logger, sec security.Config, addrs ...string) {
	mode := "none"
	switch {
	case sec.ClientCAFile != "":
		mode = "mutual TLS"
	case sec.TLS():
		mode = "TLS"
	}
	auth := "none"
	switch {
	case sec.AuthFile != "":
		auth = "auth file " + sec.AuthFile
	case sec.ClientCAFile != "":
		auth = "any certificate of --tls-client-ca"
	}
	log.Info("security", "tls", mode, "auth", auth)
	if sec.AuthFile != "" && !sec.TLS() {
		log.Warn("bearer tokens without TLS cross the network in the clear: give --tls-cert and --tls-key (kvindex's own client sends tokens over TLS only)")
	}
	if sec.AuthFile != "" || sec.ClientCAFile != "" {
		return
	}
	logBeyondLoopback(log, "may query, watch every tenant's block hashes and read metrics; see --auth-tokens and --tls-client-ca", addrs...)
}

// logBeyondLoopback warns once per listener that other hosts can reach
// and nothing authenticates: what such a host may do, and how to close
// it.
func logBeyondLoopback(log *slog.Logger, exposure string, addrs ...string) {
	for _, a := range addrs {
		if a != "" && !loopback(a) {
			log.Warn("listening beyond loopback without authentication: any host that reaches this address "+exposure, "addr", a)
		}
	}
}

// loopback reports whether a listen address only accepts local
// connections.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
