package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"

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
		return sec, "", configUsage(err, serverFlagNames)
	}
	return sec, f.adminAddr, nil
}

// listenAdmin opens the admin listener, or returns nil without
// --admin-addr.
func listenAdmin(addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--admin-addr %s: %w", addr, err)
	}
	return lis, nil
}

func closeAdmin(lis net.Listener) {
	if lis != nil {
		lis.Close()
	}
}

// adminAddr is the admin listener's resolved address, "" when off.
func (s *service) adminAddr() string {
	if s.adminLis == nil {
		return ""
	}
	return s.adminLis.Addr().String()
}

// serveAdmin serves the admin listener, if any, until shutdownAdmin.
func (s *service) serveAdmin(wg *sync.WaitGroup, errs chan<- error) {
	if s.adminLis == nil {
		return
	}
	s.admin = s.api.NewAdminServer()
	lis := s.api.AdminListener(s.adminLis)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := s.admin.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs <- fmt.Errorf("admin server: %w", err)
		}
	}()
}

func (s *service) shutdownAdmin(ctx context.Context) error {
	if s.admin == nil {
		return nil
	}
	return s.admin.Shutdown(ctx)
}

// logSecurity logs how serve authenticates callers, and warns when a
// listener reachable from other hosts has no authentication.
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
	for _, a := range addrs {
		if a != "" && !loopback(a) {
			log.Warn("listening beyond loopback without authentication: any host that reaches this address may query, watch every tenant's block hashes and read metrics; see --auth-tokens and --tls-client-ca", "addr", a)
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

// clientSecurityFlags are the TLS and token settings of the commands
// that talk to a running kvindex.
type clientSecurityFlags struct {
	ca, cert, key, serverName, tokenFile string
}

func (f *clientSecurityFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.ca, "tls-ca", "", "speak TLS, trusting the CAs in this PEM file for kvindex's certificate (an https:// --server uses the system's roots)")
	fs.StringVar(&f.cert, "tls-cert", "", "client certificate (PEM) for a kvindex that requires one (mutual TLS); with --tls-key")
	fs.StringVar(&f.key, "tls-key", "", "private key (PEM) of --tls-cert")
	fs.StringVar(&f.serverName, "tls-server-name", "", "name kvindex's certificate must carry (default: the host of --server)")
	fs.StringVar(&f.tokenFile, "token-file", "", "send the bearer token in this file with every call (over TLS only)")
}

// tls reports whether any flag asks for TLS.
func (f *clientSecurityFlags) tls() bool {
	return f.ca != "" || f.cert != "" || f.key != "" || f.serverName != ""
}

// dialOptions returns the dial options the flags ask for; useTLS says
// whether --server's scheme asked for TLS (https://, grpcs://).
func (f *clientSecurityFlags) dialOptions(useTLS bool) ([]grpc.DialOption, error) {
	if (f.cert == "") != (f.key == "") {
		return nil, usagef("--tls-cert and --tls-key go together: give both or neither")
	}
	if !useTLS && !f.tls() {
		if f.tokenFile != "" {
			return nil, usagef("--token-file: a bearer token is sent over TLS only; give --tls-ca FILE (or --server https://HOST:PORT for a certificate the system trusts)")
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
