package server

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

// Security configures TLS and caller authorization. The zero value is
// plaintext without authorization (kvindex's behaviour without the
// flags); api/README.md's Security section describes the model.
type Security struct {
	// CertFile and KeyFile are the server's certificate chain and private
	// key (PEM); both or neither. With them every listener speaks TLS.
	CertFile, KeyFile string
	// ClientCAFile (PEM, one or more CA certificates) makes the gRPC and
	// HTTP listeners require client certificates signed by these CAs. The
	// admin listener asks for one but does not require it (see
	// AdminTLSConfig). Needs CertFile.
	ClientCAFile string
	// AuthFile lists bearer tokens and certificate identities with their
	// scopes (api/README.md's Security section documents the format). Empty: with
	// ClientCAFile every verified certificate may do everything; without
	// it nobody is asked.
	AuthFile string
	// ReloadCheck is how often, at most, the files are checked for
	// changes; DefaultReloadCheck if 0.
	ReloadCheck time.Duration
}

// TLS reports whether the listeners speak TLS.
func (s Security) TLS() bool { return s.CertFile != "" }

// Check validates the combination of files (not their contents, which New
// reads); its messages name kvindex serve's flags.
func (s Security) Check() error {
	switch {
	case (s.CertFile == "") != (s.KeyFile == ""):
		return errors.New("--tls-cert and --tls-key go together: give both or neither")
	case s.ClientCAFile != "" && s.CertFile == "":
		return errors.New("--tls-client-ca needs --tls-cert and --tls-key: client certificates are asked for in a TLS handshake")
	}
	return nil
}

// certs is one loaded version of the certificate files, with the TLS
// configurations built from it for each listener.
type certs struct {
	cert     *tls.Certificate
	grpc     *tls.Config // h2 only; client certificates required with a CA
	http     *tls.Config // HTTP/1.1; client certificates required with a CA
	admin    *tls.Config // HTTP/1.1; client certificates verified if given
	notAfter time.Time
}

// loadCerts reads the certificate, key and client CA files.
func loadCerts(sec Security) (*certs, error) {
	cert, err := tls.LoadX509KeyPair(sec.CertFile, sec.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert %s / --tls-key %s: %w", sec.CertFile, sec.KeyFile, err)
	}
	leaf := cert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("--tls-cert %s: %w", sec.CertFile, err)
		}
	}
	var pool *x509.CertPool
	if sec.ClientCAFile != "" {
		pem, err := os.ReadFile(sec.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("--tls-client-ca: %w", err)
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-client-ca %s: no PEM certificate in it", sec.ClientCAFile)
		}
	}
	base := func(protos []string, auth tls.ClientAuthType) *tls.Config {
		if pool == nil {
			auth = tls.NoClientCert
		}
		return &tls.Config{
			Certificates: []tls.Certificate{cert},
			MinVersion:   tls.VersionTLS12,
			NextProtos:   protos,
			ClientAuth:   auth,
			ClientCAs:    pool,
		}
	}
	return &certs{
		cert:     &cert,
		grpc:     base([]string{"h2"}, tls.RequireAndVerifyClientCert),
		http:     base([]string{"http/1.1"}, tls.RequireAndVerifyClientCert),
		admin:    base([]string{"http/1.1"}, tls.VerifyClientCertIfGiven),
		notAfter: leaf.NotAfter,
	}, nil
}

// newCertReloader loads the certificate files, or returns nil without TLS.
func (s *Server) newCertReloader(sec Security) (*reloader[certs], error) {
	if !sec.TLS() {
		return nil, nil
	}
	paths := []string{sec.CertFile, sec.KeyFile}
	if sec.ClientCAFile != "" {
		paths = append(paths, sec.ClientCAFile)
	}
	r, err := newReloader("tls", paths, sec.ReloadCheck, s.now, s.log, s.sec.reloaded("tls"), func() (*certs, error) {
		c, err := loadCerts(sec)
		if err == nil {
			s.log.Info("TLS certificate loaded", "file", sec.CertFile, "not_after", c.notAfter.UTC().Format(time.RFC3339),
				"client_ca", cmp.Or(sec.ClientCAFile, "none"))
		}
		return c, err
	})
	return r, err
}

// tlsConfig is a configuration whose handshakes use the current version
// of the certificate files (pick chooses the listener's).
func (s *Server) tlsConfig(pick func(*certs) *tls.Config) *tls.Config {
	if s.certs == nil {
		return nil
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return pick(s.certs.get()), nil
		},
	}
}

// GRPCTLSConfig is the gRPC listener's TLS configuration, nil without TLS.
// NewGRPCServer uses it.
func (s *Server) GRPCTLSConfig() *tls.Config {
	return s.tlsConfig(func(c *certs) *tls.Config { return c.grpc })
}

// HTTPTLSConfig is the HTTP listener's TLS configuration, nil without TLS.
// LimitListener uses it.
func (s *Server) HTTPTLSConfig() *tls.Config {
	return s.tlsConfig(func(c *certs) *tls.Config { return c.http })
}

// AdminTLSConfig is the admin listener's TLS configuration, nil without
// TLS. It verifies a client certificate if one is given but does not
// require one, so that the kubelet's probes (which present none) reach
// /healthz and /readyz; its debug endpoints still need the admin scope.
func (s *Server) AdminTLSConfig() *tls.Config {
	return s.tlsConfig(func(c *certs) *tls.Config { return c.admin })
}

// tlsListener wraps lis in TLS with cfg, or returns it unchanged for nil.
func tlsListener(lis net.Listener, cfg *tls.Config) net.Listener {
	if cfg == nil {
		return lis
	}
	return tls.NewListener(lis, cfg)
}
