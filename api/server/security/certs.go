package security

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"time"

	"github.com/kvindex/kvindex/internal/configerr"
)

// Certs is one loaded version of the certificate files, with the TLS
// configuration of each listener built from it.
type Certs struct {
	// GRPC is the gRPC listener's: h2 only; client certificates required
	// with a client CA.
	GRPC *tls.Config
	// HTTP is the HTTP listener's: HTTP/1.1; client certificates required
	// with a client CA.
	HTTP *tls.Config
	// Admin is the admin listener's: HTTP/1.1; a client certificate is
	// verified if given but not required, so that the kubelet's probes
	// (which present none) reach /healthz and /readyz.
	Admin *tls.Config
	// NotAfter is when the certificate expires.
	NotAfter time.Time
}

// Files are the files c's certificates are loaded from: the ones a
// Reloader of LoadCerts watches.
func (c Config) Files() []string {
	paths := []string{c.CertFile, c.KeyFile}
	if c.ClientCAFile != "" {
		paths = append(paths, c.ClientCAFile)
	}
	return paths
}

// LoadCerts reads the certificate, key and client CA files of c. Its
// errors are configuration errors of the file at fault (*configerr.Error).
func LoadCerts(c Config) (*Certs, error) {
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, configerr.Failed(FieldCertFile, "%v %s / %v %s: %w", FieldCertFile, c.CertFile, FieldKeyFile, c.KeyFile, err)
	}
	leaf := cert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, configerr.Failed(FieldCertFile, "%v %s: %w", FieldCertFile, c.CertFile, err)
		}
	}
	var pool *x509.CertPool
	if c.ClientCAFile != "" {
		pem, err := os.ReadFile(c.ClientCAFile)
		if err != nil {
			return nil, configerr.Failed(FieldClientCAFile, "%v: %w", FieldClientCAFile, err)
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, configerr.Failed(FieldClientCAFile, "%v %s: no PEM certificate in it", FieldClientCAFile, c.ClientCAFile)
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
	return &Certs{
		GRPC:     base([]string{"h2"}, tls.RequireAndVerifyClientCert),
		HTTP:     base([]string{"http/1.1"}, tls.RequireAndVerifyClientCert),
		Admin:    base([]string{"http/1.1"}, tls.VerifyClientCertIfGiven),
		NotAfter: leaf.NotAfter,
	}, nil
}
