package main

import (
	"github.com/spf13/pflag"
	"google.golang.org/grpc"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/server/security"
)

// securityFlags are serve's TLS and authorization settings; api/README's
// security section describes the model.
type securityFlags struct {
	tlsCert, tlsKey, tlsClientCA string
	authTokens                   string
	adminAddr                    string
}

func (f *securityFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.tlsCert, "tls-cert", "", "serve gRPC and HTTP over TLS with this certificate chain (PEM); reloaded when the file changes")
	fs.StringVar(&f.tlsKey, "tls-key", "", "private key (PEM) of --tls-cert; reloaded when the file changes")
	fs.StringVar(&f.tlsClientCA, "tls-client-ca", "", "require client certificates signed by these CAs (PEM) on the gRPC and HTTP listeners (mutual TLS); reloaded when the file changes")
	fs.StringVar(&f.authTokens, "auth-tokens", "", "authorize callers: YAML file of bearer tokens (by SHA-256) and client-certificate identities with their scopes (query, watch, metrics, admin) and cache salts / LoRA adapters; reloaded when it changes (see the API documentation's Security section)")
	fs.StringVar(&f.adminAddr, "admin-addr", "", "serve the admin listener here: Go profiles (/debug/pprof/), /metrics, /healthz, /readyz; keep it on loopback (e.g. 127.0.0.1:6060) unless callers need the admin scope (default: off)")
}

// options validates the flags into the server's security.Config and the admin
// address; pprof is the removed --pprof flag, refused with where profiles
// went.
func (f *securityFlags) options(pprof bool) (security.Config, string, error) {
	sec := security.Config{CertFile: f.tlsCert, KeyFile: f.tlsKey, ClientCAFile: f.tlsClientCA, AuthFile: f.authTokens}
	if pprof {
		return sec, "", usagef("--pprof was removed: Go profiles are served on the admin listener, off the API port; give --admin-addr 127.0.0.1:6060 instead")
	}
	if err := sec.Check(); err != nil {
		return sec, "", configUsage(err, serveFlagNames)
	}
	return sec, f.adminAddr, nil
}

// clientSecurityFlags are the TLS and token settings of the commands
// that talk to a running kvindex.
type clientSecurityFlags struct {
	ca, cert, key, serverName, tokenFile string
	addrFlag                             string // the flag naming kvindex's address: --server, or the picker's --index
}

func (f *clientSecurityFlags) register(fs *pflag.FlagSet, addrFlag string) {
	f.addrFlag = addrFlag
	fs.StringVar(&f.ca, "tls-ca", "", "speak TLS, trusting the CAs in this PEM file for kvindex's certificate (an https:// "+addrFlag+" uses the system's roots)")
	fs.StringVar(&f.cert, "tls-cert", "", "client certificate (PEM) for a kvindex that requires one (mutual TLS); with --tls-key")
	fs.StringVar(&f.key, "tls-key", "", "private key (PEM) of --tls-cert")
	fs.StringVar(&f.serverName, "tls-server-name", "", "name kvindex's certificate must carry (default: the host of "+addrFlag+")")
	fs.StringVar(&f.tokenFile, "token-file", "", "send the bearer token in this file with every call (over TLS only)")
}

// tls reports whether any flag asks for TLS.
func (f *clientSecurityFlags) tls() bool {
	return f.ca != "" || f.cert != "" || f.key != "" || f.serverName != ""
}

// dialOptions returns the dial options the flags ask for; useTLS says
// whether the address's scheme asked for TLS (https://, grpcs://).
func (f *clientSecurityFlags) dialOptions(useTLS bool) ([]grpc.DialOption, error) {
	if (f.cert == "") != (f.key == "") {
		return nil, usagef("--tls-cert and --tls-key go together: give both or neither")
	}
	if !useTLS && !f.tls() {
		if f.tokenFile != "" {
			return nil, usagef("--token-file: a bearer token is sent over TLS only; give --tls-ca FILE (or %s https://HOST:PORT for a certificate the system trusts)", f.addrFlag)
		}
		return nil, nil
	}
	var opts []grpc.DialOption
	o, err := client.WithTLS(client.TLSConfig{CAFile: f.ca, CertFile: f.cert, KeyFile: f.key, ServerName: f.serverName})
	if err != nil {
		return nil, usagef("%v", err)
	}
	opts = append(opts, o)
	if f.tokenFile != "" {
		o, err := client.WithTokenFile(f.tokenFile)
		if err != nil {
			return nil, usagef("--token-file: %v", err)
		}
		opts = append(opts, o)
	}
	return opts, nil
}
