package security

import (
	"time"

	"github.com/kvindex/kvindex/internal/configerr"
)

// Config configures TLS and caller authorization. The zero value is
// plaintext without authorization (kvindex's behaviour without the
// flags); api/README.md's Security section describes the model.
type Config struct {
	// CertFile and KeyFile are the server's certificate chain and private
	// key (PEM); both or neither. With them every listener speaks TLS.
	CertFile, KeyFile string
	// ClientCAFile (PEM, one or more CA certificates) makes the gRPC and
	// HTTP listeners require client certificates signed by these CAs. The
	// admin listener asks for one but does not require it (see
	// Certs.Admin). Needs CertFile.
	ClientCAFile string
	// AuthFile lists bearer tokens and certificate identities with their
	// scopes (LoadPolicy documents the format). Empty: with ClientCAFile
	// every verified certificate may do everything; without it nobody is
	// asked.
	AuthFile string
	// ReloadCheck is how often, at most, the files are checked for
	// changes; DefaultReloadCheck if 0.
	ReloadCheck time.Duration
}

// The settings of Config as its configuration errors name them
// (configerr.Field): a front end maps them to its own names.
const (
	FieldCertFile     configerr.Field = "CertFile"
	FieldKeyFile      configerr.Field = "KeyFile"
	FieldClientCAFile configerr.Field = "ClientCAFile"
	FieldAuthFile     configerr.Field = "AuthFile"
)

// TLS reports whether the listeners speak TLS.
func (c Config) TLS() bool { return c.CertFile != "" }

// Check validates the combination of files (not their contents, which
// LoadCerts and LoadPolicy read); its errors are *configerr.Error.
func (c Config) Check() error {
	switch {
	case (c.CertFile == "") != (c.KeyFile == ""):
		return configerr.New(FieldCertFile, "%v and %v go together: give both or neither", FieldCertFile, FieldKeyFile)
	case c.ClientCAFile != "" && c.CertFile == "":
		return configerr.New(FieldClientCAFile, "%v needs %v and %v: client certificates are asked for in a TLS handshake", FieldClientCAFile, FieldCertFile, FieldKeyFile)
	}
	return nil
}
