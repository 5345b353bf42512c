package main

import (
	"net/url"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/internal/bytesize"
	"github.com/kvindex/kvindex/internal/service"
	"github.com/kvindex/kvindex/internal/snapstore"
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
	maxBytes   bytesize.Value
	replicas   int
	duplicates time.Duration
	authKey    string
	insecure   bool
}

func (f *natsFlags) register(fs *pflag.FlagSet, urlHelp string) {
	f.maxBytes = bytesize.Value(natstransport.DefaultMaxBytes)
	fs.StringVar(&f.url, "nats", "", urlHelp)
	fs.StringVar(&f.creds, "nats-creds", "", "NATS credentials file (JWT and NKey seed) to authenticate with")
	fs.StringVar(&f.authKey, "nats-auth-key", "", "file of the key relays and replicas share (at least 32 bytes, e.g. openssl rand -hex 32): every record and heartbeat is signed with it, and replicas apply only what verifies; required unless --nats-insecure")
	fs.BoolVar(&f.insecure, "nats-insecure", false, "run NATS mode without --nats-auth-key, for trials: whoever may write to the NATS server can then write, or wipe, any engine's entries in every replica")
	fs.StringVar(&f.tlsCA, "nats-tls-ca", "", "CA bundle to verify the NATS server's certificate with (tls:// URLs); default: the system roots")
	fs.StringVar(&f.stream, "nats-stream", natstransport.DefaultStream, "JetStream stream of the KV events (subjects kvevents.>); created with the --nats-* settings if missing")
	fs.DurationVar(&f.maxAge, "nats-max-age", natstransport.DefaultMaxAge, "stream retention: events older than this are dropped (a replica restoring an older snapshot cannot catch up)")
	fs.Var(&f.maxBytes, "nats-max-bytes", "stream retention: the stream's size cap, e.g. 8GiB; the oldest events go first")
	fs.IntVar(&f.replicas, "nats-replicas", natstransport.DefaultReplicas, "stream replicas in a NATS cluster (1, 3 or 5)")
	fs.DurationVar(&f.duplicates, "nats-duplicates", natstransport.DefaultDuplicates, "stream duplicate window: a batch published twice within it (a relay retrying) is stored once")
}

// conn is how to reach NATS.
func (f *natsFlags) conn() service.NATSConn {
	return service.NATSConn{URL: f.url, Creds: f.creds, TLSCA: f.tlsCA, AuthKey: f.authKey, Insecure: f.insecure}
}

// streamConfig validates the stream settings.
func (f *natsFlags) streamConfig() (natstransport.StreamConfig, error) {
	c := natstransport.StreamConfig{
		Name: f.stream, MaxAge: f.maxAge, MaxBytes: int64(f.maxBytes), Replicas: f.replicas, Duplicates: f.duplicates,
	}
	if err := c.Validate(); err != nil {
		return c, usagef("--nats-stream settings: %v", err)
	}
	if _, err := url.Parse(strings.Split(f.url, ",")[0]); err != nil {
		return c, usagef("--nats %q: %v", f.url, err)
	}
	return c, nil
}

// natsOptions validates the NATS mode flags; nil without --nats.
func (f *serveFlags) natsOptions() (*service.NATSOptions, error) {
	if f.nats.url == "" { // not NATS mode
		if f.snapshotBucket != snapstore.DefaultBucket || f.snapshotKeep != snapstore.DefaultKeep {
			return nil, usagef("--snapshot-bucket and --snapshot-keep apply to NATS mode (--nats) only")
		}
		return nil, nil
	}
	sc, err := f.nats.streamConfig()
	if err != nil {
		return nil, err
	}
	snap := snapstore.Config{Bucket: f.snapshotBucket, Model: f.model, Keep: f.snapshotKeep, Replicas: f.nats.replicas}
	switch {
	case f.snapshotBucket == "":
		return nil, usagef("--snapshot-bucket must not be empty")
	case f.snapshotKeep < 1:
		return nil, usagef("--snapshot-keep %d: want at least 1", f.snapshotKeep)
	}
	return &service.NATSOptions{Conn: f.nats.conn(), Stream: sc, Snapshot: snap, Interval: f.snapshotEvery}, nil
}
