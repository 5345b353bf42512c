package server

import (
	"cmp"
	"crypto/tls"
	"net"
	"time"

	"github.com/kvindex/kvindex/api/server/security"
)

// newCertReloader loads the certificate files, or returns nil without TLS.
func (s *Server) newCertReloader(sec security.Config) (*security.Reloader[security.Certs], error) {
	if !sec.TLS() {
		return nil, nil
	}
	return security.NewReloader("tls", sec.Files(), sec.ReloadCheck, s.now, s.log, s.sec.reloaded("tls"), func() (*security.Certs, error) {
		c, err := security.LoadCerts(sec)
		if err == nil {
			s.log.Info("TLS certificate loaded", "file", sec.CertFile, "not_after", c.NotAfter.UTC().Format(time.RFC3339),
				"client_ca", cmp.Or(sec.ClientCAFile, "none"))
		}
		return c, err
	})
}

// tlsConfig is a configuration whose handshakes use the current version
// of the certificate files (pick chooses the listener's).
func (s *Server) tlsConfig(pick func(*security.Certs) *tls.Config) *tls.Config {
	if s.certs == nil {
		return nil
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return pick(s.certs.Get()), nil
		},
	}
}

// GRPCTLSConfig is the gRPC listener's TLS configuration, nil without TLS.
// NewGRPCServer uses it.
func (s *Server) GRPCTLSConfig() *tls.Config {
	return s.tlsConfig(func(c *security.Certs) *tls.Config { return c.GRPC })
}

// HTTPTLSConfig is the HTTP listener's TLS configuration, nil without TLS.
// LimitListener uses it.
func (s *Server) HTTPTLSConfig() *tls.Config {
	return s.tlsConfig(func(c *security.Certs) *tls.Config { return c.HTTP })
}

// AdminTLSConfig is the admin listener's TLS configuration, nil without
// TLS. It verifies a client certificate if one is given but does not
// require one, so that the kubelet's probes (which present none) reach
// /healthz and /readyz; its debug endpoints still need the admin scope.
func (s *Server) AdminTLSConfig() *tls.Config {
	return s.tlsConfig(func(c *security.Certs) *tls.Config { return c.Admin })
}

// tlsListener wraps lis in TLS with cfg, or returns it unchanged for nil.
func tlsListener(lis net.Listener, cfg *tls.Config) net.Listener {
	if cfg == nil {
		return lis
	}
	return tls.NewListener(lis, cfg)
}
