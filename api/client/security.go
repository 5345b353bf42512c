package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// TLSConfig says how a client verifies kvindex's certificate and, for
// mutual TLS, which certificate it presents.
type TLSConfig struct {
	// CAFile holds the PEM certificates of the CAs trusted to sign the
	// server's certificate; empty: the system's roots.
	CAFile string
	// CertFile and KeyFile are the client's certificate chain and key
	// (PEM), for a kvindex that requires client certificates; both or
	// neither. They are read again at each handshake, so a rotated
	// certificate is used by the next connection.
	CertFile, KeyFile string
	// ServerName is the name the server's certificate must carry; empty:
	// the host of the dialed address.
	ServerName string
}

// WithTLS returns the dial option that makes Dial speak TLS as c says.
// The files are read now, so that a wrong path fails here rather than at
// the first connection.
func WithTLS(c TLSConfig) (grpc.DialOption, error) {
	cfg, err := c.Config()
	if err != nil {
		return nil, err
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(cfg)), nil
}

// Config builds the crypto/tls configuration of c, for callers that speak
// to kvindex's HTTP API too.
func (c TLSConfig) Config() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("TLS CA file: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("TLS CA file %s: no PEM certificate in it", c.CAFile)
		}
	}
	switch {
	case (c.CertFile == "") != (c.KeyFile == ""):
		return nil, errors.New("a client certificate needs both its certificate and its key file")
	case c.CertFile != "":
		last, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate %s / key %s: %w", c.CertFile, c.KeyFile, err)
		}
		var mu sync.Mutex
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			mu.Lock()
			defer mu.Unlock()
			// A pair caught between the writes of its two files fails to
			// load: the last good one is presented instead.
			if kp, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile); err == nil {
				last = kp
			}
			return &last, nil
		}
	}
	return cfg, nil
}

// The TLS mismatches TLSMismatch reports.
var (
	// ErrServerSpeaksTLS: a plaintext client reached a server that speaks
	// TLS.
	ErrServerSpeaksTLS = errors.New("the server speaks TLS")
	// ErrClientCertRequired: a TLS client presenting no certificate reached
	// a server that requires one (mutual TLS).
	ErrClientCertRequired = errors.New("the server requires a client certificate")
)

// TLSMismatch explains a failed Dial to addr that TLS settings would fix,
// for a caller to name its own settings: the failure itself reads only as
// a closed connection. It makes a TLS handshake of its own, which
// verifies nothing and sends no request, and returns ErrServerSpeaksTLS
// when the client spoke plaintext (useTLS false) to a server that
// completes one, ErrClientCertRequired when a TLS client without a
// certificate (hasCert false) reached a server that asks for one and
// refuses the connection without, and nil otherwise. ctx bounds it.
func TLSMismatch(ctx context.Context, addr string, useTLS, hasCert bool) error {
	if useTLS && hasCert {
		return nil
	}
	var sawServer, askedCert bool
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // a probe of the protocol only: nothing is sent over it
		VerifyPeerCertificate: func([][]byte, [][]*x509.Certificate) error {
			sawServer = true
			return nil
		},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			askedCert = true
			return &tls.Certificate{}, nil
		},
	}
	conn, err := (&tls.Dialer{Config: cfg}).DialContext(ctx, "tcp", addr)
	refused := err != nil
	if err == nil {
		// TLS 1.3 completes the client's handshake before the server
		// checks its certificate: the refusal is the first thing read.
		if d, ok := ctx.Deadline(); ok {
			_ = conn.SetReadDeadline(d)
		}
		var ne net.Error
		_, err = conn.Read(make([]byte, 1))
		refused = err != nil && !(errors.As(err, &ne) && ne.Timeout())
		conn.Close()
	}
	switch {
	case !useTLS && sawServer:
		return ErrServerSpeaksTLS
	case useTLS && askedCert && refused:
		return ErrClientCertRequired
	}
	return nil
}

// maxTokenFile bounds a bearer token file.
const maxTokenFile = 16 << 10

// tokenRecheck is how often, at most, a token file is looked at for a
// rotated token.
const tokenRecheck = 2 * time.Second

// WithTokenFile returns the dial option that sends the token held in path
// (surrounding white space ignored) as "authorization: Bearer TOKEN" with
// every call. The file is read now and again when it changes (checked at
// most every few seconds), so a rotated token is picked up without a new
// connection. The token is sent over TLS only: a call on a plaintext
// connection fails rather than expose it.
func WithTokenFile(path string) (grpc.DialOption, error) {
	t := &tokenFile{path: path}
	if _, err := t.read(); err != nil {
		return nil, err
	}
	return grpc.WithPerRPCCredentials(t), nil
}

// WithToken returns the dial option that sends token as a bearer token
// with every call, over TLS only.
func WithToken(token string) grpc.DialOption {
	return grpc.WithPerRPCCredentials(staticToken(token))
}

type staticToken string

func (t staticToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

func (staticToken) RequireTransportSecurity() bool { return true }

// tokenFile is a bearer token read from a file, re-read when the file
// changes.
type tokenFile struct {
	path string

	mu      sync.Mutex
	token   string
	mod     time.Time
	size    int64
	checked time.Time
}

func (t *tokenFile) read() (string, error) {
	fi, err := os.Stat(t.path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	if fi.ModTime().Equal(t.mod) && fi.Size() == t.size && t.token != "" {
		return t.token, nil
	}
	if fi.Size() > maxTokenFile {
		return "", fmt.Errorf("token file %s: larger than %d bytes", t.path, maxTokenFile)
	}
	data, err := os.ReadFile(t.path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	tok := string(bytes.TrimSpace(data))
	switch {
	case tok == "":
		return "", fmt.Errorf("token file %s is empty", t.path)
	case bytes.ContainsAny([]byte(tok), " \t\r\n"):
		return "", fmt.Errorf("token file %s: the token must be one word, without spaces or line breaks", t.path)
	}
	t.token, t.mod, t.size = tok, fi.ModTime(), fi.Size()
	return tok, nil
}

func (t *tokenFile) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if now := time.Now(); now.Sub(t.checked) >= tokenRecheck {
		t.checked = now
		// A file caught mid-rotation keeps the token read before.
		_, _ = t.read()
	}
	return map[string]string{"authorization": "Bearer " + t.token}, nil
}

func (*tokenFile) RequireTransportSecurity() bool { return true }
