package service

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents/enginesim/simzmq"
	"github.com/kvindex/kvindex/kvevents/natstransport"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// warmUp processes prompts on e until the service sees one: a SUB socket
// misses what an engine publishes before the subscription is through.
func warmUp(t *testing.T, s *started, pod string, e *simzmq.Engine) {
	t.Helper()
	for i := 0; ; i++ {
		p := testutil.Seq(1_000_000+i*100, 2*testBlockSize)
		if _, err := e.Process(p, nil); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(200 * time.Millisecond)
		for time.Now().Before(deadline) {
			if s.matched(t, p)[pod] == 2 {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		if i > 100 {
			t.Fatalf("%s's events never reached the index", pod)
		}
	}
}

// goroutines waits until the number of goroutines is at most n and
// returns it, dumping them if it stays above.
func goroutines(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(testDeadline)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			var b bytes.Buffer
			pprof.Lookup("goroutine").WriteTo(&b, 1)
			t.Fatalf("%d goroutines outlive the service (%d before it):\n%s", runtime.NumGoroutine(), n, b.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The service follows its engines and answers; once stopped, none of its
// goroutines is left.
func TestServeRunsAndStopsWhole(t *testing.T) {
	before := runtime.NumGoroutine()
	e, ec := newEngine(t, "pod-a")
	o := baseOptions(ec)
	o.AdminAddr = "127.0.0.1:0"
	s := startService(t, o)
	warmUp(t, s, "pod-a", e)
	p := testutil.Seq(1, 4*testBlockSize)
	if _, err := e.Process(p, nil); err != nil {
		t.Fatal(err)
	}
	s.awaitHeld(t, "pod-a", p)
	if s.HTTPAddr() == "" || s.AdminAddr() == "" || s.PickerAddr() != "" {
		t.Errorf("addresses: HTTP %q, admin %q, picker %q", s.HTTPAddr(), s.AdminAddr(), s.PickerAddr())
	}
	s.stop(t)
	if !strings.Contains(s.logs.String(), `msg=stopped`) {
		t.Errorf("no stop logged:\n%s", s.logs.String())
	}
	e.Close()
	goroutines(t, before)
}

// freePort returns a port nothing listens on (at the time).
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// A part that cannot start stops the ones started before it: a taken
// HTTP port closes the gRPC listener already open, and the error names
// the setting.
func TestServeStartFailureUndoes(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	before := runtime.NumGoroutine()
	o := baseOptions(zmqtransport.EngineConfig{Name: "a", Model: testModel, Endpoint: "tcp://127.0.0.1:1", Ranks: 1})
	o.GRPCAddr, o.HTTPAddr = freePort(t), taken.Addr().String()
	log, _ := testLogger(t)
	s, err := New(o, log)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Start(context.Background())
	ce, ok := configerr.As(err)
	if !ok || ce.Field != "HTTPAddr" || ce.Usage() || !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("Start: %v, want HTTPAddr failing with EADDRINUSE", err)
	}
	l, err := net.Listen("tcp", o.GRPCAddr)
	if err != nil {
		t.Fatalf("the gRPC listener is still open after the failed start: %v", err)
	}
	l.Close()
	goroutines(t, before)
}

// Validate refuses settings that cannot work together, naming the field.
func TestOptionsValidate(t *testing.T) {
	ec := zmqtransport.EngineConfig{Name: "a", Model: testModel, Endpoint: "tcp://h:1", Ranks: 1}
	nats := &NATSOptions{Conn: NATSConn{URL: "nats://n:4222", Insecure: true}, Stream: natstransport.StreamConfig{Name: "S"}}
	for _, tc := range []struct {
		name  string
		edit  func(*Options)
		field configerr.Field
		want  string
	}{
		{"no source", func(o *Options) { o.Engines = nil }, "Engines", "no event source"},
		{"NATS and engines", func(o *Options) { o.NATS = nats }, "NATS", "NATS replaces Engines, Listen and Discover"},
		{"NATS without model", func(o *Options) { o.Engines, o.NATS, o.Model = nil, nats, "" }, "Model", "NATS needs Model"},
		{"NATS and a state dir", func(o *Options) { o.Engines, o.NATS, o.StateDir = nil, nats, "/tmp/x" }, "StateDir", "does not apply"},
		{"same addresses", func(o *Options) { o.GRPCAddr, o.HTTPAddr = ":9", ":9" }, "GRPCAddr", `are both ":9"`},
		{"no address", func(o *Options) { o.HTTPAddr = "" }, "GRPCAddr", "must not be empty"},
		{"query tokens", func(o *Options) { o.MaxQueryTokens = 0 }, "MaxQueryTokens", "want an integer in 1.."},
		{"negative grace", func(o *Options) { o.ReadyGrace = -1 }, "ReadyGrace", "must not be negative"},
		{"negative forget", func(o *Options) { o.ForgetAfter = -1 }, "ForgetAfter", "0: never"},
		{"negative engines", func(o *Options) { o.MaxEngines = -1 }, "MaxEngines", "want at least 1"},
		{"snapshot interval", func(o *Options) { o.SnapshotInterval = time.Millisecond }, "SnapshotInterval", "want at least 100ms"},
		{"budget too small for the engines", func(o *Options) {
			o.Index.MemoryBudget = 1 << 20
			o.Engines = []zmqtransport.EngineConfig{{Name: "a", Model: testModel, Endpoint: "tcp://h:1", Ranks: 8}}
		}, "Index.MemoryBudget", "holds the state and event queues of at most 5 engine ranks (96KiB each, beside an index of half the budget); 8 need 1.5MiB or more"},
		{"budget too small for max engines", func(o *Options) {
			o.Index.MemoryBudget, o.MaxEngines, o.Listen, o.EngineAllow = 16<<20, 8000, "tcp://127.0.0.1:5557", []zmqtransport.AllowRule{mustAllow(t, "*=127.0.0.0/8")}
		}, "Index.MemoryBudget", "8001 need 1.465GiB or more"},
		{"NATS without a key", func(o *Options) {
			o.Engines, o.NATS = nil, &NATSOptions{Conn: NATSConn{URL: "nats://n:4222"}, Stream: natstransport.StreamConfig{Name: "S"}}
		}, "NATSAuthKey", "NATS mode needs NATSAuthKey FILE"},
		{"NATS with a key and insecure", func(o *Options) {
			o.Engines, o.NATS = nil, &NATSOptions{Conn: NATSConn{URL: "nats://n:4222", AuthKey: "k", Insecure: true}, Stream: natstransport.StreamConfig{Name: "S"}}
		}, "NATSInsecure", "give one"},
		{"discovery without model", func(o *Options) { o.Model, o.Discover = "", &DiscoverOptions{Selector: "app=vllm"} }, "Model", "Discover needs Model"},
		{"bind mode open to anyone", func(o *Options) { o.Engines, o.Listen = nil, "tcp://127.0.0.1:5557" }, "EngineAllow", "needs engine allow rules (EngineAllow POD=CIDR) or discovery (Discover)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := baseOptions(ec)
			tc.edit(o)
			err := o.Validate()
			ce, ok := configerr.As(err)
			if !ok || ce.Field != tc.field || !ce.Usage() || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v, want a usage error of %s saying %q", err, tc.field, tc.want)
			}
			// New refuses it the same way, before anything listens.
			if _, err := New(o, slog.New(slog.DiscardHandler)); !errors.Is(err, ce) && err.Error() != ce.Error() {
				t.Errorf("New: %v, want %v", err, ce)
			}
		})
	}
	if err := baseOptions(ec).Validate(); err != nil {
		t.Fatalf("valid options: %v", err)
	}
}
