package natstransport_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvindex/kvindex/kvevents/natstransport"
)

func TestEnsureStream(t *testing.T) {
	ns := startNATS(t)
	_, js := connect(t, ns.url())
	ctx := context.Background()
	s, err := natstransport.EnsureStream(ctx, js, natstransport.StreamConfig{}, quiet())
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	if cfg.Name != natstransport.DefaultStream || cfg.MaxAge != natstransport.DefaultMaxAge ||
		cfg.MaxBytes != natstransport.DefaultMaxBytes || cfg.Replicas != natstransport.DefaultReplicas ||
		cfg.Duplicates != natstransport.DefaultDuplicates || cfg.Storage != jetstream.FileStorage ||
		cfg.Retention != jetstream.LimitsPolicy || len(cfg.Subjects) != 1 || cfg.Subjects[0] != "kvevents.>" {
		t.Fatalf("created stream: %+v", cfg)
	}
	// Present with other settings: kept as it is, each difference logged.
	log, warns := newCountingLogger()
	s2, err := natstransport.EnsureStream(ctx, js, natstransport.StreamConfig{MaxAge: time.Hour, MaxBytes: 1 << 20}, log)
	if err != nil {
		t.Fatal(err)
	}
	if got := s2.CachedInfo().Config; got.MaxAge != natstransport.DefaultMaxAge || got.MaxBytes != natstransport.DefaultMaxBytes {
		t.Fatalf("existing stream changed: %+v", got)
	}
	if warns.Load() != 2 {
		t.Errorf("%d differences logged, want 2", warns.Load())
	}
	log, warns = newCountingLogger()
	if _, err := natstransport.EnsureStream(ctx, js, natstransport.StreamConfig{}, log); err != nil || warns.Load() != 0 {
		t.Errorf("same settings: err %v, %d warnings", err, warns.Load())
	}
}

func TestStreamConfigValidation(t *testing.T) {
	ns := startNATS(t)
	_, js := connect(t, ns.url())
	for _, tc := range []struct {
		name string
		cfg  natstransport.StreamConfig
		want string
	}{
		{"duplicates beyond max age", natstransport.StreamConfig{MaxAge: time.Minute, Duplicates: 2 * time.Minute}, "exceeds its max age"},
		{"negative max age", natstransport.StreamConfig{MaxAge: -1}, "negative"},
		{"negative max bytes", natstransport.StreamConfig{MaxBytes: -1}, "negative"},
		{"too many replicas", natstransport.StreamConfig{Replicas: 6}, "replicas"},
		{"negative duplicates", natstransport.StreamConfig{Duplicates: -time.Second}, "negative"},
		{"name with a dot", natstransport.StreamConfig{Name: "KV.EVENTS"}, "stream name"},
	} {
		_, err := natstransport.EnsureStream(context.Background(), js, tc.cfg, quiet())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want one saying %q", tc.name, err, tc.want)
		}
	}
	// A short max age takes a duplicate window within it.
	s, err := natstransport.EnsureStream(context.Background(), js, natstransport.StreamConfig{Name: "SHORT", MaxAge: time.Minute}, quiet())
	if err != nil {
		t.Fatal(err)
	}
	if d := s.CachedInfo().Config.Duplicates; d != time.Minute {
		t.Errorf("duplicates %v, want the max age", d)
	}
}
