package kvevents_test

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/kvevents"
)

// seqRecorder is a SequencerOutput that writes every call as one line.
type seqRecorder struct {
	log       []string
	replayOK  bool     // what requestReplay answers
	delivered []uint64 // seqs since the last reset
	epochs    [][]uint64
	notes     []kvevents.Note
	requested uint64 // the last RequestReplay's from
}

func (r *seqRecorder) Deliver(seq uint64, payload []byte) {
	r.log = append(r.log, fmt.Sprintf("deliver %d %s", seq, payload))
	r.delivered = append(r.delivered, seq)
}

func (r *seqRecorder) Reset(reason kvevents.ResetReason) {
	r.log = append(r.log, "reset "+string(reason))
	r.epochs = append(r.epochs, r.delivered)
	r.delivered = nil
}

func (r *seqRecorder) RequestReplay(from uint64) bool {
	r.requested = from
	r.log = append(r.log, fmt.Sprintf("request %d", from))
	return r.replayOK
}

func (r *seqRecorder) CancelReplay() { r.log = append(r.log, "cancel") }

func (r *seqRecorder) Note(n kvevents.Note) {
	r.notes = append(r.notes, n)
	s := "note " + n.Kind.String()
	switch n.Kind {
	case kvevents.NoteGap, kvevents.NoteLost, kvevents.NoteRestart, kvevents.NoteTruncated, kvevents.NoteReplayDone:
		s += fmt.Sprintf(" %d-%d", n.From, n.To)
	case kvevents.NoteReplayStart, kvevents.NoteDuplicate, kvevents.NoteJoin, kvevents.NoteStray:
		s += fmt.Sprintf(" %d", n.From)
	case kvevents.NoteReplayFailed:
		s += " " + n.Reason.String()
	}
	if n.Bootstrap {
		s += " bootstrap"
	}
	r.log = append(r.log, s)
}

// step is one input to a sequencer in a scripted test: "L5" live seq 5,
// "R5" replayed seq 5, "E" replay end marker, "T100" tick at now=100.
type step string

func runSteps(t *testing.T, s *kvevents.Sequencer, steps []step) {
	t.Helper()
	for _, st := range steps {
		var n uint64
		if len(st) > 1 {
			if _, err := fmt.Sscanf(string(st[1:]), "%d", &n); err != nil {
				t.Fatalf("bad step %q", st)
			}
		}
		payload := []byte(fmt.Sprintf("p%d", n))
		switch st[0] {
		case 'L':
			s.Live(n, payload, 0)
		case 'R':
			s.Replayed(n, payload, 0)
		case 'E':
			s.ReplayEnd(0)
		case 'T':
			s.Tick(int64(n))
		default:
			t.Fatalf("bad step %q", st)
		}
	}
}

func TestSequencer(t *testing.T) {
	type cfg struct {
		canReplay bool
		replayOK  bool // requestReplay succeeds
		maxHeld   int
	}
	withReplay := cfg{canReplay: true, replayOK: true, maxHeld: 100}
	noReplay := cfg{maxHeld: 100}
	tests := []struct {
		name     string
		cfg      cfg
		steps    []step
		want     []string
		degraded bool
	}{
		{
			name:  "in order from zero",
			cfg:   withReplay,
			steps: []step{"L0", "L1", "L2"},
			want:  []string{"deliver 0 p0", "deliver 1 p1", "deliver 2 p2"},
		},
		{
			name:  "gap recovered by replay, held batches follow",
			cfg:   withReplay,
			steps: []step{"L0", "L1", "L4", "L5", "R2", "R3", "R4", "E", "L6"},
			want: []string{
				"deliver 0 p0", "deliver 1 p1",
				"note gap 2-4", "note replay-start 2", "request 2",
				"deliver 2 p2", "deliver 3 p3", "deliver 4 p4",
				"note replay-done 2-5",
				"note duplicate 4", "deliver 5 p5", "deliver 6 p6",
			},
		},
		{
			name:  "replay returns newer batches than held ones",
			cfg:   withReplay,
			steps: []step{"L0", "L3", "R1", "R2", "R3", "R4", "E", "L4", "L5"},
			want: []string{
				"deliver 0 p0", "note gap 1-3", "note replay-start 1", "request 1",
				"deliver 1 p1", "deliver 2 p2", "deliver 3 p3",
				// The held L3 is passed: a duplicate.
				"note duplicate 3", "deliver 4 p4", "note replay-done 1-5",
				// L4 was still in flight when the replay applied it.
				"note duplicate 4", "deliver 5 p5",
			},
		},
		{
			name:  "duplicate replies are dropped",
			cfg:   withReplay,
			steps: []step{"L0", "L1", "L3", "R0", "R1", "R2", "R3", "E"},
			want: []string{
				"deliver 0 p0", "deliver 1 p1", "note gap 2-3", "note replay-start 2", "request 2",
				"note duplicate 0", "note duplicate 1", "deliver 2 p2", "deliver 3 p3",
				"note replay-done 2-4", "note duplicate 3",
			},
		},
		{
			name:  "gap without replay endpoint degrades and continues",
			cfg:   noReplay,
			steps: []step{"L0", "L1", "L5", "L6"},
			want: []string{
				"deliver 0 p0", "deliver 1 p1", "note gap 2-5", "note lost 2-5", "note degraded",
				"deliver 5 p5", "deliver 6 p6",
			},
			degraded: true,
		},
		{
			name:  "replay request cannot be sent",
			cfg:   cfg{canReplay: true, maxHeld: 100},
			steps: []step{"L0", "L3", "L4"},
			want: []string{
				"deliver 0 p0", "note gap 1-3", "note replay-start 1", "request 1",
				"note replay-failed unavailable", "note degraded", "note lost 1-3", "deliver 3 p3", "deliver 4 p4",
			},
			degraded: true,
		},
		{
			name:  "engine buffer no longer holds the start",
			cfg:   withReplay,
			steps: []step{"L0", "L10", "L11", "R7", "R8", "R9", "R10", "R11", "E", "L12"},
			want: []string{
				"deliver 0 p0", "note gap 1-10", "note replay-start 1", "request 1",
				"note lost 1-7", "deliver 7 p7", "deliver 8 p8", "deliver 9 p9", "deliver 10 p10",
				"note duplicate 10", "deliver 11 p11",
				"note replay-failed truncated", "note degraded",
				"note duplicate 11", "deliver 12 p12",
			},
			degraded: true,
		},
		{
			name:  "engine buffer moved past the held batch",
			cfg:   withReplay,
			steps: []step{"L0", "L5", "L6", "R6", "E", "L7"},
			want: []string{
				"deliver 0 p0", "note gap 1-5", "note replay-start 1", "request 1",
				"note lost 1-5", "deliver 5 p5", "deliver 6 p6",
				"note replay-failed truncated", "note degraded", "note duplicate 6", "deliver 7 p7",
			},
			degraded: true,
		},
		{
			name:  "bootstrap buffer moved past the held batch",
			cfg:   withReplay,
			steps: []step{"L5", "L6", "R6", "E"},
			want: []string{
				"note replay-start 0 bootstrap", "request 0", "note truncated 0-6",
				"deliver 5 p5", "deliver 6 p6", "note replay-done 6-7 bootstrap", "note duplicate 6",
			},
		},
		{
			name:  "a reply lost inside the replay",
			cfg:   withReplay,
			steps: []step{"L0", "L5", "R1", "R2", "R4", "R5", "E"},
			want: []string{
				"deliver 0 p0", "note gap 1-5", "note replay-start 1", "request 1",
				"deliver 1 p1", "deliver 2 p2", "note lost 3-4", "deliver 4 p4", "deliver 5 p5",
				"note replay-failed incomplete", "note degraded", "note duplicate 5",
			},
			degraded: true,
		},
		{
			name:  "replay answers nothing",
			cfg:   withReplay,
			steps: []step{"L0", "L3", "E", "L4"},
			want: []string{
				"deliver 0 p0", "note gap 1-3", "note replay-start 1", "request 1",
				"note replay-failed incomplete", "note degraded", "note lost 1-3", "deliver 3 p3", "deliver 4 p4",
			},
			degraded: true,
		},
		{
			name:  "replay timeout",
			cfg:   withReplay,
			steps: []step{"L0", "L3", "L4", "T5", "T1000000000", "R1", "E"},
			want: []string{
				"deliver 0 p0", "note gap 1-3", "note replay-start 1", "request 1",
				"cancel", "note replay-failed timeout", "note degraded", "note lost 1-3",
				"deliver 3 p3", "deliver 4 p4", "note stray 1", "note stray 18446744073709551615",
			},
			degraded: true,
		},
		{
			name:  "held batches overflow",
			cfg:   cfg{canReplay: true, replayOK: true, maxHeld: 2},
			steps: []step{"L0", "L3", "L4", "L5", "L6"},
			want: []string{
				"deliver 0 p0", "note gap 1-3", "note replay-start 1", "request 1",
				"cancel", "note replay-failed overflow", "note degraded", "note lost 1-3",
				"deliver 3 p3", "deliver 4 p4", "deliver 5 p5", "deliver 6 p6",
			},
			degraded: true,
		},
		{
			name:  "degraded stream heals after a successful replay",
			cfg:   withReplay,
			steps: []step{"L0", "L3", "E", "L5", "R4", "R5", "E"},
			want: []string{
				"deliver 0 p0", "note gap 1-3", "note replay-start 1", "request 1",
				"note replay-failed incomplete", "note degraded", "note lost 1-3", "deliver 3 p3",
				"note gap 4-5", "note replay-start 4", "request 4",
				"deliver 4 p4", "deliver 5 p5", "note replay-done 4-6", "note healthy", "note duplicate 5",
			},
		},
		{
			name:  "restart: sequence goes back to zero",
			cfg:   withReplay,
			steps: []step{"L0", "L1", "L2", "L0", "L1"},
			want: []string{
				"deliver 0 p0", "deliver 1 p1", "deliver 2 p2",
				"note restart 2-0", "reset restart", "deliver 0 p0", "deliver 1 p1",
			},
		},
		{
			name:  "restart after a single batch",
			cfg:   noReplay,
			steps: []step{"L0", "L0"},
			want:  []string{"deliver 0 p0", "note restart 0-0", "reset restart", "deliver 0 p0"},
		},
		{
			name:  "restart seen late (first batches lost) bootstraps from zero",
			cfg:   withReplay,
			steps: []step{"L7", "R0", "R1", "R2", "R3", "R4", "R5", "R6", "R7", "E", "L8", "L3", "R0", "R1", "R2", "R3", "E", "L4"},
			want: []string{
				"note replay-start 0 bootstrap", "request 0",
				"deliver 0 p0", "deliver 1 p1", "deliver 2 p2", "deliver 3 p3", "deliver 4 p4",
				"deliver 5 p5", "deliver 6 p6", "deliver 7 p7", "note replay-done 0-8 bootstrap",
				"note duplicate 7", "deliver 8 p8",
				"note restart 8-3", "reset restart", "note replay-start 0 bootstrap", "request 0",
				"deliver 0 p0", "deliver 1 p1", "deliver 2 p2", "deliver 3 p3", "note replay-done 0-4 bootstrap",
				"note duplicate 3", "deliver 4 p4",
			},
		},
		{
			name:  "restart while a replay is outstanding",
			cfg:   withReplay,
			steps: []step{"L0", "L1", "L5", "L6", "L0", "R2", "L1"},
			want: []string{
				"deliver 0 p0", "deliver 1 p1", "note gap 2-5", "note replay-start 2", "request 2",
				"cancel", "note restart 6-0", "reset restart", "deliver 0 p0", "note stray 2", "deliver 1 p1",
			},
		},
		{
			name:  "restart while a replay is outstanding, seq equal to the held one",
			cfg:   withReplay,
			steps: []step{"L0", "L5", "L5"},
			want: []string{
				"deliver 0 p0", "note gap 1-5", "note replay-start 1", "request 1",
				"cancel", "note restart 5-5", "reset restart", "note replay-start 0 bootstrap", "request 0",
			},
		},
		{
			name:  "late join without replay endpoint",
			cfg:   noReplay,
			steps: []step{"L42", "L43"},
			want:  []string{"note join 42", "deliver 42 p42", "deliver 43 p43"},
		},
		{
			name:  "late join bootstraps from zero, engine buffer truncated",
			cfg:   withReplay,
			steps: []step{"L42", "L43", "R40", "R41", "R42", "E", "L44"},
			want: []string{
				"note replay-start 0 bootstrap", "request 0",
				"note truncated 0-40", "deliver 40 p40", "deliver 41 p41", "deliver 42 p42",
				"note replay-done 40-43 bootstrap", "note duplicate 42", "deliver 43 p43", "deliver 44 p44",
			},
		},
		{
			name:  "bootstrap replay answers nothing",
			cfg:   withReplay,
			steps: []step{"L42", "E", "L43"},
			want: []string{
				"note replay-start 0 bootstrap", "request 0",
				"note replay-failed incomplete bootstrap", "note degraded", "deliver 42 p42", "deliver 43 p43",
			},
			degraded: true,
		},
		{
			name:  "bootstrap replay times out",
			cfg:   withReplay,
			steps: []step{"L42", "L43", "T2000000000"},
			want: []string{
				"note replay-start 0 bootstrap", "request 0",
				"cancel", "note replay-failed timeout bootstrap", "note degraded", "deliver 42 p42", "deliver 43 p43",
			},
			degraded: true,
		},
		{
			name:  "a live gap among held batches starts a second replay",
			cfg:   withReplay,
			steps: []step{"L0", "L2", "L5", "R1", "R2", "E", "R3", "R4", "E", "L6"},
			want: []string{
				"deliver 0 p0", "note gap 1-2", "note replay-start 1", "request 1",
				"deliver 1 p1", "deliver 2 p2", "note replay-done 1-3", "note duplicate 2",
				"note gap 3-5", "note replay-start 3", "request 3",
				"deliver 3 p3", "deliver 4 p4", "note replay-done 3-5", "deliver 5 p5", "deliver 6 p6",
			},
		},
		{
			name:  "stray replay frames without a request",
			cfg:   withReplay,
			steps: []step{"L0", "R1", "E", "L1"},
			want:  []string{"deliver 0 p0", "note stray 1", "note stray 18446744073709551615", "deliver 1 p1"},
		},
		{
			name:  "maximal sequence number",
			cfg:   noReplay,
			steps: []step{"L18446744073709551615", "L0"},
			want: []string{
				"note join 18446744073709551615", "deliver 18446744073709551615 p18446744073709551615",
				"note restart 18446744073709551615-0", "reset restart", "deliver 0 p0",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &seqRecorder{replayOK: tt.cfg.replayOK}
			s := kvevents.NewSequencer(rec, kvevents.SequencerConfig{CanReplay: tt.cfg.canReplay, MaxHeld: tt.cfg.maxHeld, ReplayTimeout: 1e9})
			runSteps(t, s, tt.steps)
			if !slices.Equal(rec.log, tt.want) {
				t.Errorf("got:\n\t%s\nwant:\n\t%s", strings.Join(rec.log, "\n\t"), strings.Join(tt.want, "\n\t"))
			}
			if s.Degraded() != tt.degraded {
				t.Errorf("degraded = %v, want %v", s.Degraded(), tt.degraded)
			}
			checkOrdered(t, rec)
		})
	}
}

func TestSequencerConnected(t *testing.T) {
	tests := []struct {
		name      string
		canReplay bool
		steps     func(s *kvevents.Sequencer)
		want      []string
	}{
		{
			name: "fresh stream replays the engine's buffer on connect", canReplay: true,
			steps: func(s *kvevents.Sequencer) {
				s.Connected(0)
				s.Live(3, []byte("p3"), 0) // held
				s.Replayed(0, []byte("p0"), 0)
				s.Replayed(1, []byte("p1"), 0)
				s.Replayed(2, []byte("p2"), 0)
				s.ReplayEnd(0)
				s.Live(4, []byte("p4"), 0)
			},
			want: []string{
				"note replay-start 0 bootstrap", "request 0",
				"deliver 0 p0", "deliver 1 p1", "deliver 2 p2", "note replay-done 0-3 bootstrap",
				"deliver 3 p3", "deliver 4 p4",
			},
		},
		{
			name: "empty engine", canReplay: true,
			steps: func(s *kvevents.Sequencer) {
				s.Connected(0)
				s.ReplayEnd(0)
				s.Live(0, []byte("p0"), 0)
			},
			want: []string{"note replay-start 0 bootstrap", "request 0", "note replay-done 0-0 bootstrap", "deliver 0 p0"},
		},
		{
			name: "replayed batches still in flight live are duplicates", canReplay: true,
			steps: func(s *kvevents.Sequencer) {
				s.Connected(0)
				s.Replayed(0, []byte("p0"), 0)
				s.Replayed(1, []byte("p1"), 0)
				s.ReplayEnd(0)
				s.Live(1, []byte("p1"), 0)
				s.Live(2, []byte("p2"), 0)
			},
			want: []string{
				"note replay-start 0 bootstrap", "request 0", "deliver 0 p0", "deliver 1 p1",
				"note replay-done 0-2 bootstrap", "note duplicate 1", "deliver 2 p2",
			},
		},
		{
			name: "an idle engine known only from its replay restarts", canReplay: true,
			steps: func(s *kvevents.Sequencer) {
				s.Connected(0)
				s.Replayed(0, []byte("p0"), 0)
				s.Replayed(1, []byte("p1"), 0)
				s.ReplayEnd(0)
				// Seq 1 again, but another batch: a new process.
				s.Live(1, []byte("new1"), 0)
			},
			want: []string{
				"note replay-start 0 bootstrap", "request 0", "deliver 0 p0", "deliver 1 p1",
				"note replay-done 0-2 bootstrap", "note restart 1-1", "reset restart",
				"note replay-start 0 bootstrap", "request 0",
			},
		},
		{
			name: "a batch unlike the replayed one under its seq is a restart", canReplay: true,
			steps: func(s *kvevents.Sequencer) {
				s.Live(0, []byte("p0"), 0)
				s.Live(2, []byte("p2"), 0)
				s.Replayed(1, []byte("p1"), 0)
				s.Replayed(2, []byte("p2"), 0)
				s.Replayed(3, []byte("p3"), 0)
				s.ReplayEnd(0)
				s.Live(3, []byte("p3"), 0) // in flight: a duplicate
				s.Live(4, []byte("p4"), 0)
				s.Live(4, []byte("x4"), 0) // below the live high mark
			},
			want: []string{
				"deliver 0 p0", "note gap 1-2", "note replay-start 1", "request 1",
				"deliver 1 p1", "deliver 2 p2", "note duplicate 2", "deliver 3 p3", "note replay-done 1-4",
				"note duplicate 3", "deliver 4 p4",
				"note restart 4-4", "reset restart", "note replay-start 0 bootstrap", "request 0",
			},
		},
		{
			name: "reconnect of a stream with history does nothing", canReplay: true,
			steps: func(s *kvevents.Sequencer) {
				s.Live(0, []byte("p0"), 0)
				s.Connected(0)
				s.Live(1, []byte("p1"), 0)
			},
			want: []string{"deliver 0 p0", "deliver 1 p1"},
		},
		{
			name: "no replay endpoint", canReplay: false,
			steps: func(s *kvevents.Sequencer) { s.Connected(0) },
			want:  nil,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &seqRecorder{replayOK: true}
			s := kvevents.NewSequencer(rec, kvevents.SequencerConfig{CanReplay: tt.canReplay, MaxHeld: 10, ReplayTimeout: 1e9})
			tt.steps(s)
			if !slices.Equal(rec.log, tt.want) {
				t.Errorf("got:\n\t%s\nwant:\n\t%s", strings.Join(rec.log, "\n\t"), strings.Join(tt.want, "\n\t"))
			}
			if s.Degraded() {
				t.Error("degraded")
			}
		})
	}
}

func TestSequencerCleared(t *testing.T) {
	rec := &seqRecorder{}
	s := kvevents.NewSequencer(rec, kvevents.SequencerConfig{CanReplay: false, MaxHeld: 10, ReplayTimeout: 1e9})
	runSteps(t, s, []step{"L0", "L3"})
	if !s.Degraded() {
		t.Fatal("gap without replay did not degrade the stream")
	}
	s.Cleared()
	if s.Degraded() {
		t.Fatal("AllBlocksCleared did not heal the stream")
	}
	if got := rec.log[len(rec.log)-1]; got != "note healthy" {
		t.Fatalf("last call %q, want note healthy", got)
	}
}

func TestSequencerReplayDeadline(t *testing.T) {
	rec := &seqRecorder{replayOK: true}
	s := kvevents.NewSequencer(rec, kvevents.SequencerConfig{CanReplay: true, MaxHeld: 10, ReplayTimeout: 500})
	if _, ok := s.ReplayDeadline(); ok {
		t.Fatal("deadline reported without a replay")
	}
	s.Live(0, nil, 1000)
	s.Live(2, nil, 1000)
	d, ok := s.ReplayDeadline()
	if !ok || d != 1500 {
		t.Fatalf("deadline = %d, %v; want 1500, true", d, ok)
	}
	s.Tick(1499)
	if !s.Replaying() {
		t.Fatal("replay failed before its deadline")
	}
	s.Replayed(1, nil, 1400) // progress moves the deadline
	if d, _ := s.ReplayDeadline(); d != 1900 {
		t.Fatalf("deadline after a reply = %d, want 1900", d)
	}
	s.Tick(1899)
	if !s.Replaying() {
		t.Fatal("replay failed before its extended deadline")
	}
	s.Tick(1900)
	if s.Replaying() || !s.Degraded() {
		t.Fatal("replay survived its deadline")
	}
}

// checkOrdered asserts the sequencer's central promise: between resets,
// delivered sequence numbers strictly increase.
func checkOrdered(t *testing.T, rec *seqRecorder) {
	t.Helper()
	for _, e := range append(slices.Clone(rec.epochs), rec.delivered) {
		for i := 1; i < len(e); i++ {
			if e[i] <= e[i-1] {
				t.Fatalf("delivered out of order or twice: %v", e)
			}
		}
	}
}

// simPublisher mimics an engine: a live stream that may lose batches and a
// replay buffer of the last `keep` batches.
type simPublisher struct {
	next   uint64
	buffer []uint64
	keep   int
}

func (p *simPublisher) publish() uint64 {
	seq := p.next
	p.next++
	p.buffer = append(p.buffer, seq)
	if len(p.buffer) > p.keep {
		p.buffer = p.buffer[1:]
	}
	return seq
}

// TestSequencerLossyStream drives a sequencer with a randomly lossy and
// delayed live stream whose engine keeps every batch: every seq must arrive
// exactly once and in order, whatever was lost, and replays overtaking the
// live stream must not look like restarts.
func TestSequencerLossyStream(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0))
		pub := &simPublisher{keep: 1 << 20}
		rec := &seqRecorder{replayOK: true}
		s := kvevents.NewSequencer(rec, kvevents.SequencerConfig{CanReplay: true, MaxHeld: 1 << 20, ReplayTimeout: 1e9})
		var inflight []uint64 // published, not yet received live
		serveIn := -1         // steps until the outstanding request is served
		const total = 3000
		serve := func() {
			from := rec.requested
			for _, b := range pub.buffer {
				if b >= from {
					s.Replayed(b, nil, 0)
				}
			}
			s.ReplayEnd(0)
		}
		for pub.next < total || len(inflight) > 0 {
			switch r := rng.IntN(10); {
			case r < 4 && pub.next < total:
				inflight = append(inflight, pub.publish())
			case r < 9 && len(inflight) > 0:
				seq := inflight[0]
				inflight = inflight[1:]
				if rng.IntN(8) != 0 { // 12.5% live loss
					s.Live(seq, nil, 0)
				}
			}
			if s.Replaying() && serveIn < 0 {
				serveIn = rng.IntN(6)
			}
			if serveIn == 0 {
				serve()
				serveIn = -1
			} else if serveIn > 0 {
				serveIn--
			}
		}
		for s.Replaying() {
			serve()
		}
		if len(rec.epochs) != 0 {
			t.Fatalf("seed %d: unexpected reset; log tail %q", seed, rec.log[max(0, len(rec.log)-8):])
		}
		// The last batches may all have been lost live with nothing after
		// them to reveal the hole; everything delivered must be a prefix.
		for i, seq := range rec.delivered {
			if seq != uint64(i) {
				t.Fatalf("seed %d: delivered[%d] = %d; want every seq once in order", seed, i, seq)
			}
		}
		if len(rec.delivered) < total/2 {
			t.Fatalf("seed %d: only %d of %d delivered", seed, len(rec.delivered), total)
		}
		if s.Degraded() {
			t.Fatalf("seed %d: degraded although every hole was replayable", seed)
		}
	}
}

// FuzzSequencer feeds arbitrary event scripts: the sequencer must never
// panic, never deliver a seq twice or out of order between resets, and
// never hold more batches than its bound.
func FuzzSequencer(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 0, 4, 1, 2, 1, 3, 2, 0})
	f.Add([]byte{0, 9, 3, 9, 0, 0, 2, 0})
	f.Fuzz(func(t *testing.T, script []byte) {
		rec := &seqRecorder{replayOK: len(script)%2 == 0}
		const maxHeld = 4
		s := kvevents.NewSequencer(rec, kvevents.SequencerConfig{CanReplay: len(script)%3 != 0, MaxHeld: maxHeld, ReplayTimeout: 10})
		var now int64
		for i := 0; i+1 < len(script); i += 2 {
			arg := uint64(script[i+1])
			if script[i]&0x80 != 0 {
				arg = binary.BigEndian.Uint64([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, script[i+1]})
			}
			switch script[i] % 4 {
			case 0:
				s.Live(arg, nil, now)
			case 1:
				s.Replayed(arg, nil, now)
			case 2:
				s.ReplayEnd(now)
			case 3:
				now += int64(arg)
				s.Tick(now)
			}
			if s.Held() > maxHeld {
				t.Fatalf("holding %d batches, bound %d", s.Held(), maxHeld)
			}
		}
		checkOrdered(t, rec)
	})
}
