package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/kvevents/natstransport"
)

// natsFlags are the NATS settings relay and serve share: where the server
// is, how to authenticate, and the JetStream stream of KV events, which
// whichever starts first creates.
type natsFlags struct {
	url        string
	creds      string
	tlsCA      string
	stream     string
	maxAge     time.Duration
	maxBytes   sizeValue
	replicas   int
	duplicates time.Duration
}

func (f *natsFlags) register(fs *pflag.FlagSet, urlHelp string) {
	f.maxBytes = sizeValue(natstransport.DefaultMaxBytes)
	fs.StringVar(&f.url, "nats", "", urlHelp)
	fs.StringVar(&f.creds, "nats-creds", "", "NATS credentials file (JWT and NKey seed) to authenticate with")
	fs.StringVar(&f.tlsCA, "nats-tls-ca", "", "CA bundle to verify the NATS server's certificate with (tls:// URLs); default: the system roots")
	fs.StringVar(&f.stream, "nats-stream", natstransport.DefaultStream, "JetStream stream of the KV events (subjects kvevents.>); created with the --nats-* settings if missing")
	fs.DurationVar(&f.maxAge, "nats-max-age", natstransport.DefaultMaxAge, "stream retention: events older than this are dropped (a replica restoring an older snapshot cannot catch up)")
	fs.Var(&f.maxBytes, "nats-max-bytes", "stream retention: the stream's size cap, e.g. 8GiB; the oldest events go first")
	fs.IntVar(&f.replicas, "nats-replicas", natstransport.DefaultReplicas, "stream replicas in a NATS cluster (1, 3 or 5)")
	fs.DurationVar(&f.duplicates, "nats-duplicates", natstransport.DefaultDuplicates, "stream duplicate window: a batch published twice within it (a relay retrying) is stored once")
}

// enabled reports whether --nats was given.
func (f *natsFlags) enabled() bool { return f.url != "" }

// streamConfig validates the stream settings.
func (f *natsFlags) streamConfig() (natstransport.StreamConfig, error) {
	c := natstransport.StreamConfig{
		Name: f.stream, MaxAge: f.maxAge, MaxBytes: int64(f.maxBytes), Replicas: f.replicas, Duplicates: f.duplicates,
	}
	if err := c.Validate(); err != nil {
		return c, usagef("--nats-stream settings: %s", strings.TrimPrefix(err.Error(), "natstransport: "))
	}
	if _, err := url.Parse(strings.Split(f.url, ",")[0]); err != nil {
		return c, usagef("--nats %q: %v", f.url, err)
	}
	return c, nil
}

// connect dials NATS. A server that is not up yet is retried in the
// background (the caller's readiness reflects it), and so is every later
// disconnection; both are logged.
func (f *natsFlags) connect(name string, log *slog.Logger) (*nats.Conn, jetstream.JetStream, error) {
	opts := []nats.Option{
		nats.Name(name),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.ConnectHandler(func(c *nats.Conn) { log.Info("NATS connected", "server", c.ConnectedUrlRedacted()) }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Warn("NATS disconnected; reconnecting", "err", err)
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("NATS reconnected", "server", c.ConnectedUrlRedacted()) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { log.Warn("NATS error", "err", err) }),
	}
	if f.creds != "" {
		opts = append(opts, nats.UserCredentials(f.creds))
	}
	if f.tlsCA != "" {
		opts = append(opts, nats.RootCAs(f.tlsCA))
	}
	nc, err := nats.Connect(f.url, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("--nats %s: %w", f.url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("--nats %s: %w", f.url, err)
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
