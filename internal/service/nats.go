package service

import (
	"bytes"
	"context"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/kvevents/natstransport"
)

// NATSConn says how relay and serve reach NATS: the server URL(s) and
// how to authenticate.
type NATSConn struct {
	// URL is one URL, or several comma-separated for a cluster.
	URL string
	// Creds is a credentials file (JWT and NKey seed); "" for none.
	Creds string
	// User and Password authenticate as one of the server's
	// authorization users. Both "" takes them from the environment,
	// EnvNATSUser and EnvNATSPassword, where a Kubernetes Secret can put
	// them without a flag or a command line that shows the password.
	User, Password string
	// TLSCA is a CA bundle for the server's certificate; "" for the
	// system roots.
	TLSCA string
	// AuthKey is a file holding the key relays and replicas share
	// (natstransport.Auth: at least natstransport.MinAuthKey bytes, a
	// trailing newline ignored). Without one, Insecure must say so: then
	// whoever may write to the NATS server can write any engine's entries
	// into every replica.
	AuthKey  string
	Insecure bool
}

// The settings of NATSConn's authentication, as configuration errors name
// them.
const (
	FieldNATSAuthKey  configerr.Field = "NATSAuthKey"
	FieldNATSInsecure configerr.Field = "NATSInsecure"
	FieldNATSCreds    configerr.Field = "NATSCreds"
)

// The roles a process connects to NATS in. Each takes its replies (API
// answers, acknowledgements, a snapshot's chunks) on subjects of its own,
// InboxPrefix(role) + ".>", so that the server's permissions can keep one
// role's replies out of the other's subscriptions (deploy/README.md,
// "NATS mode: subjects and permissions").
const (
	RoleRelay   = "relay"
	RoleReplica = "replica"
)

// InboxPrefix is the first tokens of a role's reply subjects.
func InboxPrefix(role string) string { return nats.InboxPrefix + role }

// The environment variables NATSConn takes a user name and password from
// (the names the nats CLI reads).
const (
	EnvNATSUser     = "NATS_USER"
	EnvNATSPassword = "NATS_PASSWORD"
)

// credentials returns the user and password to connect with ("" and ""
// for none): NATSConn's own, else the environment's (lookup is
// os.LookupEnv outside tests). One way to authenticate at a time: a user
// needs its password, and neither goes with a credentials file or a URL
// that carries its own user.
func (c NATSConn) credentials(lookup func(string) (string, bool)) (user, password string, err error) {
	user, password = c.User, c.Password
	from := "NATSConn"
	if user == "" && password == "" {
		user, _ = lookup(EnvNATSUser)
		password, _ = lookup(EnvNATSPassword)
		from = "the environment (" + EnvNATSUser + ", " + EnvNATSPassword + ")"
	}
	switch {
	case user == "" && password == "":
		return "", "", nil
	case user == "" || password == "":
		return "", "", configerr.New("NATS", "a NATS user and password from %s: give both, or neither", from)
	case c.Creds != "":
		return "", "", configerr.New(FieldNATSCreds, "%v and a NATS user and password from %s: give one", FieldNATSCreds, from)
	case urlsHaveUser(c.URL):
		return "", "", configerr.New("NATS", "%v %s names a user, and so does %s: give one", configerr.Field("NATS"), c.Redacted(), from)
	}
	return user, password, nil
}

// urlsHaveUser reports whether one of the comma-separated URLs carries
// user information.
func urlsHaveUser(urls string) bool {
	for _, s := range strings.Split(urls, ",") {
		if u, err := url.Parse(strings.TrimSpace(s)); err == nil && u.User != nil {
			return true
		}
	}
	return false
}

// Redacted is URL with any secret in it replaced, for logs and messages:
// a password, or a user without one (which NATS takes for a token).
func (c NATSConn) Redacted() string {
	parts := strings.Split(c.URL, ",")
	for i, s := range parts {
		u, err := url.Parse(strings.TrimSpace(s))
		if err != nil || u.User == nil {
			continue
		}
		if _, ok := u.User.Password(); !ok {
			u.User = url.User("xxxxx")
		}
		parts[i] = u.Redacted()
	}
	return strings.Join(parts, ",")
}

// checkAuth refuses a connection that neither authenticates what it
// carries nor says it will not.
func (c NATSConn) checkAuth() error {
	if _, _, err := c.credentials(os.LookupEnv); err != nil {
		return err
	}
	switch {
	case c.AuthKey == "" && !c.Insecure:
		return configerr.New(FieldNATSAuthKey, "NATS mode needs %v FILE, a key relays and replicas share, so that replicas apply only what kvindex's relays wrote (whoever may write to the NATS server could otherwise write or wipe any engine's entries); %v runs without it, for trials",
			FieldNATSAuthKey, FieldNATSInsecure)
	case c.AuthKey != "" && c.Insecure:
		return configerr.New(FieldNATSInsecure, "%v and %v: give one", FieldNATSAuthKey, FieldNATSInsecure)
	}
	return nil
}

// Auth checks the authentication settings and loads the key: nil when
// Insecure (logged as a warning by the caller).
func (c NATSConn) Auth() (*natstransport.Auth, error) {
	if err := c.checkAuth(); err != nil || c.Insecure {
		return nil, err
	}
	b, err := os.ReadFile(c.AuthKey)
	if err != nil {
		return nil, configerr.Failed(FieldNATSAuthKey, "%v %s: %v", FieldNATSAuthKey, c.AuthKey, err)
	}
	a, err := natstransport.NewAuth(bytes.TrimRight(b, "\r\n"))
	if err != nil {
		return nil, configerr.Failed(FieldNATSAuthKey, "%v %s: %v", FieldNATSAuthKey, c.AuthKey, err)
	}
	return a, nil
}

// insecureWarning is logged by a relay or replica running without a key.
const insecureWarning = "NATS without an authentication key (insecure mode): whoever may write to the NATS server can write, or wipe, any engine's entries in every replica"

// connect dials NATS in role (RoleRelay, RoleReplica). A server that is
// not up yet is retried in the background (the caller's readiness
// reflects it), and so is every later disconnection; both are logged.
func (c NATSConn) connect(role, name string, log *slog.Logger) (*nats.Conn, jetstream.JetStream, error) {
	opts := []nats.Option{
		nats.Name(name),
		nats.CustomInboxPrefix(InboxPrefix(role)),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.ConnectHandler(func(c *nats.Conn) { log.Info("NATS connected", "server", c.ConnectedUrlRedacted()) }),
		nats.DisconnectErrHandler(func(c *nats.Conn, err error) {
			if err == nil && c.IsClosed() {
				return // our own Close: nothing is reconnecting
			}
			log.Warn("NATS disconnected; reconnecting", "err", err)
		}),
		// Handlers run in order: this one comes after a Close's
		// disconnect handler.
		nats.ClosedHandler(func(*nats.Conn) { log.Debug("NATS connection closed") }),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("NATS reconnected", "server", c.ConnectedUrlRedacted()) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { log.Warn("NATS error", "err", err) }),
	}
	if c.Creds != "" {
		opts = append(opts, nats.UserCredentials(c.Creds))
	}
	user, password, err := c.credentials(os.LookupEnv)
	if err != nil {
		return nil, nil, err
	}
	if user != "" {
		opts = append(opts, nats.UserInfo(user, password))
	}
	if c.TLSCA != "" {
		opts = append(opts, nats.RootCAs(c.TLSCA))
	}
	nc, err := nats.Connect(c.URL, opts...)
	if err != nil {
		return nil, nil, configerr.Failed("NATS", "%v %s: %w", configerr.Field("NATS"), c.Redacted(), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, configerr.Failed("NATS", "%v %s: %w", configerr.Field("NATS"), c.Redacted(), err)
	}
	return nc, js, nil
}

// ensureStream creates the events stream if missing, retrying while NATS
// is unreachable until ctx ends: relay and serve may start before NATS.
func ensureStream(ctx context.Context, js jetstream.JetStream, cfg natstransport.StreamConfig, log *slog.Logger) error {
	return retryNATS(ctx, log, "JetStream stream not ready; retrying", []any{"stream", cfg.Name}, func(ctx context.Context) error {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := natstransport.EnsureStream(actx, js, cfg, log)
		return err
	})
}

// retryNATS calls attempt until it succeeds or ctx ends, backing off from
// 250 ms to 5 s and logging each failure (msg, attrs and the error), for
// the steps that need a NATS server that may not be up yet. It returns
// ctx's error once ctx ends.
func retryNATS(ctx context.Context, log *slog.Logger, msg string, attrs []any, attempt func(context.Context) error) error {
	for wait := 250 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		err := attempt(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		log.Warn(msg, append(slices.Clip(attrs), "err", err, "retry_in", wait.String())...)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}
