package natstransport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/nats-io/nats.go/jetstream"
)

// Stream defaults: the one place they are written (the serve and relay
// flags take theirs from here).
const (
	// DefaultStream is the stream's name.
	DefaultStream = "KVEVENTS"
	// DefaultMaxAge bounds how far back a replica without a snapshot can
	// rebuild: batches older than this are gone from the stream.
	DefaultMaxAge = 2 * time.Hour
	// DefaultMaxBytes bounds the stream's disk use; the oldest batches
	// go first (Limits retention, discard old).
	DefaultMaxBytes int64 = 8 << 30
	// DefaultReplicas is the stream's replication factor (3 in a NATS
	// cluster that has the servers for it).
	DefaultReplicas = 1
	// DefaultDuplicates is the window in which JetStream drops a
	// re-published batch by its Nats-Msg-Id: it must cover a relay's
	// reconnect and restart (its replay from the engine).
	DefaultDuplicates = 2 * time.Minute
)

// StreamConfig sizes the stream. A zero field takes its default.
type StreamConfig struct {
	Name       string
	MaxAge     time.Duration
	MaxBytes   int64
	Replicas   int
	Duplicates time.Duration
}

// Validate reports what EnsureStream would refuse in c (zero fields take
// their defaults).
func (c StreamConfig) Validate() error {
	_, err := c.withDefaults()
	return err
}

// withDefaults fills zero fields and validates the result.
func (c StreamConfig) withDefaults() (StreamConfig, error) {
	if c.Name == "" {
		c.Name = DefaultStream
	}
	if c.MaxAge == 0 {
		c.MaxAge = DefaultMaxAge
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	if c.Replicas == 0 {
		c.Replicas = DefaultReplicas
	}
	if c.Duplicates == 0 {
		c.Duplicates = min(DefaultDuplicates, c.MaxAge)
	}
	switch {
	case !validStreamName(c.Name):
		return c, configerr.New("Name", "stream name %q: want letters, digits, '-' or '_'", c.Name)
	case c.MaxAge < 0:
		return c, configerr.New("MaxAge", "stream max age %v is negative", c.MaxAge)
	case c.MaxBytes < 0:
		return c, configerr.New("MaxBytes", "stream max bytes %d is negative", c.MaxBytes)
	case c.Replicas < 1 || c.Replicas > 5:
		return c, configerr.New("Replicas", "stream replicas %d: JetStream allows 1 to 5", c.Replicas)
	case c.Duplicates < 0:
		return c, configerr.New("Duplicates", "stream duplicate window %v is negative", c.Duplicates)
	case c.Duplicates > c.MaxAge:
		return c, configerr.New("Duplicates", "stream duplicate window %v exceeds its max age %v (JetStream refuses it)", c.Duplicates, c.MaxAge)
	}
	return c, nil
}

func validStreamName(s string) bool {
	if s == "" || len(s) > 255 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !plainByte(s[i]) && s[i] != '_' {
			return false
		}
	}
	return true
}

// jetstreamConfig is the stream as EnsureStream creates it. Only features
// of server 2.9 are used.
func (c StreamConfig) jetstreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        c.Name,
		Description: "kvindex: KV-cache event batches, one subject per engine rank",
		Subjects:    []string{SubjectPrefix + ".>"},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		Storage:     jetstream.FileStorage,
		MaxAge:      c.MaxAge,
		MaxBytes:    c.MaxBytes,
		Replicas:    c.Replicas,
		Duplicates:  c.Duplicates,
	}
}

// EnsureStream creates the stream if it is missing. If it exists it is
// kept as it is (another kvindex process, or an operator, made it; its
// data is not ours to drop), and every setting that differs from cfg is
// logged as a warning.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig, log *slog.Logger) (jetstream.Stream, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	want := cfg.jetstreamConfig()
	s, err := js.Stream(ctx, cfg.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = js.CreateStream(ctx, want)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			// Another process created it meanwhile: use theirs.
			s, err = js.Stream(ctx, cfg.Name)
		} else if err == nil {
			log.Info("natstransport: stream created", slog.String("stream", cfg.Name),
				slog.Duration("max_age", cfg.MaxAge), slog.Int64("max_bytes", cfg.MaxBytes),
				slog.Int("replicas", cfg.Replicas), slog.Duration("duplicates", cfg.Duplicates))
			return s, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("natstransport: stream %s: %w", cfg.Name, err)
	}
	have := s.CachedInfo().Config
	for _, d := range streamDiffs(have, want) {
		log.Warn("natstransport: existing stream differs from the configuration; keeping it as it is",
			slog.String("stream", cfg.Name), slog.String("setting", d.name),
			slog.String("have", d.have), slog.String("want", d.want))
	}
	return s, nil
}

type streamDiff struct{ name, have, want string }

func streamDiffs(have, want jetstream.StreamConfig) []streamDiff {
	var d []streamDiff
	add := func(name string, h, w any) {
		hs, ws := fmt.Sprint(h), fmt.Sprint(w)
		if hs != ws {
			d = append(d, streamDiff{name, hs, ws})
		}
	}
	add("max_age", have.MaxAge, want.MaxAge)
	add("max_bytes", have.MaxBytes, want.MaxBytes)
	add("replicas", have.Replicas, want.Replicas)
	add("duplicates", have.Duplicates, want.Duplicates)
	add("retention", have.Retention, want.Retention)
	add("storage", have.Storage, want.Storage)
	add("discard", have.Discard, want.Discard)
	if !slices.Contains(have.Subjects, want.Subjects[0]) {
		add("subjects", have.Subjects, want.Subjects)
	}
	return d
}
