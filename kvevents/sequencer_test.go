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
	case kvevents.NoteGap, kvevents.NoteLost, kvevents.NoteRestart, kvevents.NoteBackwards, kvevents.NoteTruncated, kvevents.NoteReplayDone:
		s += fmt.Sprintf(" %d-%d", n.From, n.To)
	case kvevents.NoteReplayStart, kvevents.NoteDuplicate, kvevents.NoteJoin, kvevents.NoteStray,
		kvevents.NoteVerified, kvevents.NoteLate, kvevents.NoteUnverifiable:
		s += fmt.Sprintf(" %d", n.From)
	case kvevents.NoteReplayFailed:
		s += " " + n.Reason.String()
	case kvevents.NoteReplayRestart:
		s += fmt.Sprintf(" %d-%d %s", n.From, n.To, n.Reason)
	case kvevents.NoteHealth:
		s += " " + n.Health.String()
	}
	if n.Bootstrap {
		s += " bootstrap"
	}
	r.log = append(r.log, s)
}

// step is one input to a sequencer in a scripted test: "L5" live seq 5,
// "R5" replayed seq 5, "E" replay end marker, "T100" tick at now=100,
// "C" the live socket connected, "V5" resume from seq 5 (whose batch was
// "p5"; "V5!" from a degraded position). A letter after the number tags
// the batch of another engine process: "L5b" carries "p5b", not "p5".
type step string

func runSteps(t *testing.T, s *kvevents.Sequencer, steps []step) {
	t.Helper()
	for _, st := range steps {
		var n uint64
		rest := string(st[1:])
		i := 0
		for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
			i++
		}
		if i > 0 {
			if _, err := fmt.Sscanf(rest[:i], "%d", &n); err != nil {
				t.Fatalf("bad step %q", st)
			}
		}
		tag := rest[i:]
		payload := []byte(fmt.Sprintf("p%d", n))
		if tag != "!" {
			payload = append(payload, tag...)
		}
		switch st[0] {
		case 'L':
			s.Live(n, payload, 0)
		case 'R':
			s.Replayed(n, payload, 0)
		case 'E':
			s.ReplayEnd(0)
		case 'T':
			s.Tick(int64(n))
		case 'C':
			s.Connected(0)
		case 'V':
			p := kvevents.Position{Seq: n, Print: kvevents.BatchPrint(payload), Health: kvevents.HealthOK}
			if tag == "!" {
				p.Health = kvevents.HealthDegraded
			}
			s.Resume(p)
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
		name   string
		cfg    cfg
		steps  []step
		want   []string
		health kvevents.Health
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
			steps: []step{"L0", "L1", "L4", "L5", "R1", "R2", "R3", "R4", "E", "L6"},
			want: []string{
				"deliver 0 p0",
				"deliver 1 p1",
				"note gap 2-4",
				"note replay-start 1",
				"request 1",
				"note verified 1",
				"deliver 2 p2",
				"deliver 3 p3",
				"deliver 4 p4",
				"note replay-done 2-5",
				"note duplicate 4",
				"deliver 5 p5",
				"deliver 6 p6",
			},
		},
		{
			name:  "replay returns newer batches than held ones",
			cfg:   withReplay,
			steps: []step{"L0", "L3", "R0", "R1", "R2", "R3", "R4", "E", "L4", "L5"},
			want: []string{
				"deliver 0 p0",
				"note gap 1-3",
				"note replay-start 0",
				"request 0",
				"note verified 0",
				"deliver 1 p1",
				"deliver 2 p2",
				"deliver 3 p3",
				"note duplicate 3",
				"deliver 4 p4",
				"note replay-done 1-5",
				"note duplicate 4",
				"deliver 5 p5",
			},
		},
		{
			name:  "duplicate replies are dropped",
			cfg:   withReplay,
			steps: []step{"L0", "L1", "L3", "R0", "R1", "R2", "R3", "E"},
			want: []string{
				"deliver 0 p0",
				"deliver 1 p1",
				"note gap 2-3",
				"note replay-start 1",
				"request 1",
				"note verified 0",
				"note duplicate 1",
				"deliver 2 p2",
				"deliver 3 p3",
				"note replay-done 2-4",
				"note duplicate 3",
			},
		},
		{
			name:  "gap without replay endpoint degrades and continues",
			cfg:   noReplay,
			steps: []step{"L0", "L1", "L5", "L6"},
			want: []string{
				"deliver 0 p0",
				"deliver 1 p1",
				"note gap 2-5",
				"note lost 2-5",
				"note health degraded",
				"deliver 5 p5",
				"deliver 6 p6",
			},
			health: kvevents.HealthDegraded,
		},
		{
			name:  "replay request cannot be sent",
			cfg:   cfg{canReplay: true, maxHeld: 100},
			steps: []step{"L0", "L3", "L4"},
			want: []string{
				"deliver 0 p0",
				"note gap 1-3",
				"note replay-start 0",
				"request 0",
				"note replay-failed unavailable",
				"note health degraded",
				"note lost 1-3",
				"deliver 3 p3",
				"deliver 4 p4",
			},
			health: kvevents.HealthDegraded,
		},
		{
			name:  "engine buffer moved past last: identity unprovable, reset",
			cfg:   withReplay,
			steps: []step{"L0", "L10", "L11", "R7", "R8", "R9", "R10", "R11", "E", "L12"},
			want: []string{
				"deliver 0 p0",
				"note gap 1-10",
				"note replay-start 0",
				"request 0",
				"note replay-restart 0-7 truncated",
				"cancel",
				"reset restart",
				"note replay-start 0 bootstrap",
				"request 0",
				"note truncated 0-8",
				"note health unconfirmed",
				"deliver 8 p8",
				"deliver 9 p9",
				"deliver 10 p10",
				"deliver 11 p11",
				"note replay-done 8-12 bootstrap",
				"deliver 12 p12",
			},
			health: kvevents.HealthUnconfirmed,
		},
		{
			name:  "engine buffer moved past the held batch",
			cfg:   withReplay,
			steps: []step{"L0", "L5", "L6", "R6", "R6", "E", "L7"},
			want: []string{
				"deliver 0 p0",
				"note gap 1-5",
				"note replay-start 0",
				"request 0",
				"note replay-restart 0-6 truncated",
				"cancel",
				"reset restart",
				"note replay-start 0 bootstrap",
				"request 0",
				"note truncated 0-6",
				"note health unconfirmed",
				"deliver 6 p6",
				"note replay-done 6-7 bootstrap",
				"deliver 7 p7",
			},
			health: kvevents.HealthUnconfirmed,
		},
		{
			name:  "bootstrap buffer moved past the held batch",
			cfg:   withReplay,
			steps: []step{"L5", "L6", "R6", "E"},
			want: []string{
				"note replay-start 0 bootstrap",
				"request 0",
				"note truncated 0-6",
				"note health unconfirmed",
				"deliver 5 p5",
				"deliver 6 p6",
				"note replay-done 6-7 bootstrap",
				"note duplicate 6",
			},
			health: kvevents.HealthUnconfirmed,
		},
		{
			name:  "a reply lost inside the replay",
			cfg:   withReplay,
			steps: []step{"L0", "L5", "R0", "R1", "R2", "R4", "R5", "E"},
			want: []string{
				"deliver 0 p0",
				"note gap 1-5",
				"note replay-start 0",
				"request 0",
				"note verified 0",
				"deliver 1 p1",
				"deliver 2 p2",
				"note lost 3-4",
				"deliver 4 p4",
				"deliver 5 p5",
				"note replay-failed incomplete",
				"note health degraded",
				"note duplicate 5",
			},
			health: kvevents.HealthDegraded,
		},
		{
			name:  "replay answers nothing: a new process with fewer batches",
			cfg:   withReplay,
			steps: []step{"L0", "L3", "E", "R0n", "E", "L1n"},
			want: []string{
				"deliver 0 p0",
				"note gap 1-3",
				"note replay-start 0",
				"request 0",
				"note replay-restart 0-0 incomplete",
				"reset restart",
				"note replay-start 0 bootstrap",
				"request 0",
				"deliver 0 p0n",
				"note replay-done 0-1 bootstrap",
				"deliver 1 p1n",
			},
			health: kvevents.HealthOK,
		},
		{
			name:  "replay timeout",
			cfg:   withReplay,
			steps: []step{"L0", "L3", "L4", "T5", "T1000000000", "R1", "E"},
			want: []string{
				"deliver 0 p0",
				"note gap 1-3",
				"note replay-start 0",
				"request 0",
				"cancel",
				"note replay-failed timeout",
				"note health degraded",
				"note lost 1-3",
				"deliver 3 p3",
				"deliver 4 p4",
				"note stray 1",
				"note stray 18446744073709551615",
			},
			health: kvevents.HealthDegraded,
		},
		{
			name:  "held batches overflow",
			cfg:   cfg{canReplay: true, replayOK: true, maxHeld: 2},
			steps: []step{"L0", "L3", "L4", "L5", "L6"},
			want: []string{
				"deliver 0 p0",
				"note gap 1-3",
				"note replay-start 0",
				"request 0",
				"cancel",
				"note replay-failed overflow",
				"note health degraded",
				"note lost 1-3",
				"deliver 3 p3",
				"deliver 4 p4",
				"deliver 5 p5",
				"deliver 6 p6",
			},
			health: kvevents.HealthDegraded,
		},
		{
			name:  "a later successful replay does not heal a lost batch",
			cfg:   withReplay,
			steps: []step{"L0", "L3", "R0", "E", "L5", "R3", "R4", "R5", "E"},
			want: []string{
				"deliver 0 p0",
				"note gap 1-3",
				"note replay-start 0",
				"request 0",
				"note verified 0",
				"note replay-failed incomplete",
				"note health degraded",
				"note lost 1-3",
				"deliver 3 p3",
				"note gap 4-5",
				"note replay-start 3",
				"request 3",
				"note verified 3",
				"deliver 4 p4",
				"deliver 5 p5",
				"note replay-done 4-6",
				"note duplicate 5",
			},
			health: kvevents.HealthDegraded,
		},
		{
			name:  "restart: sequence goes back to zero on a new connection",
			cfg:   withReplay,
			steps: []step{"L0", "L1", "L2", "C", "L0b", "L1b"},
			want: []string{
				"deliver 0 p0",
				"deliver 1 p1",
				"deliver 2 p2",
				"note replay-start 2",
				"request 2",
				"cancel",
				"note restart 2-0",
				"reset restart",
				"deliver 0 p0b",
				"deliver 1 p1b",
			},
		},
		{
			name:  "restart after a single batch",
			cfg:   noReplay,
			steps: []step{"L0", "C", "L0b"},
			want: []string{
				"deliver 0 p0",
				"note unverifiable 0",
				"note health unconfirmed",
				"note restart 0-0",
				"reset restart",
				"deliver 0 p0b",
				"note health ok",
			},
		},
		{
			name:  "restart seen late (first batches lost) bootstraps from zero",
			cfg:   withReplay,
			steps: []step{"L7", "R0", "R1", "R2", "R3", "R4", "R5", "R6", "R7", "E", "L8", "C", "L3b", "R0b", "R1b", "R2b", "R3b", "E", "L4b"},
			want: []string{
				"note replay-start 0 bootstrap",
				"request 0",
				"deliver 0 p0",
				"deliver 1 p1",
				"deliver 2 p2",
				"deliver 3 p3",
				"deliver 4 p4",
				"deliver 5 p5",
				"deliver 6 p6",
				"deliver 7 p7",
				"note replay-done 0-8 bootstrap",
				"note duplicate 7",
				"deliver 8 p8",
				"note replay-start 8",
				"request 8",
				"cancel",
				"note restart 8-3",
				"reset restart",
				"note replay-start 0 bootstrap",
				"request 0",
				"deliver 0 p0b",
				"deliver 1 p1b",
				"deliver 2 p2b",
				"deliver 3 p3b",
				"note replay-done 0-4 bootstrap",
				"note duplicate 3",
				"deliver 4 p4b",
			},
		},
		{
			name:  "restart while a replay is outstanding",
			cfg:   withReplay,
			steps: []step{"L0", "L1", "L5", "L6", "C", "L0b", "R2", "L1b"},
			want: []string{
				"deliver 0 p0",
				"deliver 1 p1",
				"note gap 2-5",
				"note replay-start 1",
				"request 1",
				"cancel",
				"note replay-start 1",
				"request 1",
				"cancel",
				"note restart 6-0",
				"reset restart",
				"deliver 0 p0b",
				"note stray 2",
				"deliver 1 p1b",
			},
		},
		{
			name:  "restart while a replay is outstanding, seq equal to the held one",
			cfg:   withReplay,
			steps: []step{"L0", "L5", "C", "L5b"},
			want: []string{
				"deliver 0 p0",
				"note gap 1-5",
				"note replay-start 0",
				"request 0",
				"cancel",
				"note replay-start 0",
				"request 0",
				"cancel",
				"note restart 5-5",
				"reset restart",
				"note replay-start 0 bootstrap",
				"request 0",
			},
		},
		{
			name:  "late join without replay endpoint",
			cfg:   noReplay,
			steps: []step{"L42", "L43"},
			want: []string{
				"note join 42",
				"note health unconfirmed",
				"deliver 42 p42",
				"deliver 43 p43",
			},
			health: kvevents.HealthUnconfirmed,
		},
		{
			name:  "late join bootstraps from zero, engine buffer truncated",
			cfg:   withReplay,
			steps: []step{"L42", "L43", "R40", "R41", "R42", "E", "L44"},
			want: []string{
				"note replay-start 0 bootstrap",
				"request 0",
				"note truncated 0-40",
				"note health unconfirmed",
				"deliver 40 p40",
				"deliver 41 p41",
				"deliver 42 p42",
				"note replay-done 40-43 bootstrap",
				"note duplicate 42",
				"deliver 43 p43",
				"deliver 44 p44",
			},
			health: kvevents.HealthUnconfirmed,
		},
		{
			name:  "bootstrap replay answers nothing",
			cfg:   withReplay,
			steps: []step{"L42", "E", "L43"},
			want: []string{
				"note replay-start 0 bootstrap",
				"request 0",
				"note replay-failed incomplete bootstrap",
				"note health degraded",
				"deliver 42 p42",
				"deliver 43 p43",
			},
			health: kvevents.HealthDegraded,
		},
		{
			name:  "bootstrap replay times out",
			cfg:   withReplay,
			steps: []step{"L42", "L43", "T2000000000"},
			want: []string{
				"note replay-start 0 bootstrap",
				"request 0",
				"cancel",
				"note replay-failed timeout bootstrap",
				"note health degraded",
				"deliver 42 p42",
				"deliver 43 p43",
			},
			health: kvevents.HealthDegraded,
		},
		{
			name:  "a live gap among held batches starts a second replay",
			cfg:   withReplay,
			steps: []step{"L0", "L2", "L5", "R0", "R1", "R2", "E", "R2", "R3", "R4", "E", "L6"},
			want: []string{
				"deliver 0 p0",
				"note gap 1-2",
				"note replay-start 0",
				"request 0",
				"note verified 0",
				"deliver 1 p1",
				"deliver 2 p2",
				"note replay-done 1-3",
				"note duplicate 2",
				"note gap 3-5",
				"note replay-start 2",
				"request 2",
				"note verified 2",
				"deliver 3 p3",
				"deliver 4 p4",
				"note replay-done 3-5",
				"deliver 5 p5",
				"deliver 6 p6",
			},
		},
		{
			name:  "stray replay frames without a request",
			cfg:   withReplay,
			steps: []step{"L0", "R1", "E", "L1"},
			want:  []string{"deliver 0 p0", "note stray 1", "note stray 18446744073709551615", "deliver 1 p1"},
		},
		{
			name:  "a sequence wrapping past its maximum proves no restart",
			cfg:   noReplay,
			steps: []step{"L18446744073709551615", "L0b"},
			want: []string{
				"note join 18446744073709551615",
				"note health unconfirmed",
				"deliver 18446744073709551615 p18446744073709551615",
				"note backwards 18446744073709551615-0",
				"reset restart",
				"deliver 0 p0b",
			},
			health: kvevents.HealthUnconfirmed,
		},
		{
			// vLLM numbers a new process's batches from 0 on a new
			// connection; on the same one, an unknown batch under an
			// old seq is a peer's doing: reset, and not ok.
			name:  "a sequence going back on the same connection proves no restart",
			cfg:   noReplay,
			steps: []step{"L0", "L1", "L2", "L0b", "L1b"},
			want: []string{
				"deliver 0 p0",
				"deliver 1 p1",
				"deliver 2 p2",
				"note backwards 2-0",
				"note health unconfirmed",
				"reset restart",
				"deliver 0 p0b",
				"deliver 1 p1b",
			},
			health: kvevents.HealthUnconfirmed,
		},
		{
			name:  "a sequence going back on the same connection, with replay, bootstraps unconfirmed",
			cfg:   withReplay,
			steps: []step{"L0", "L1", "L2", "L1b", "R0b", "R1b", "E", "L2b"},
			want: []string{
				"deliver 0 p0",
				"deliver 1 p1",
				"deliver 2 p2",
				"note backwards 2-1",
				"note health unconfirmed",
				"reset restart",
				"note replay-start 0 bootstrap",
				"request 0",
				"deliver 0 p0b",
				"deliver 1 p1b",
				"note replay-done 0-2 bootstrap",
				"note duplicate 1",
				"deliver 2 p2b",
			},
			health: kvevents.HealthUnconfirmed,
		},
		{
			// A restarted engine whose first batches were lost while
			// the connection came back may go on at last+1.
			name:  "a reconnect without a replay endpoint is unconfirmed, whatever follows",
			cfg:   noReplay,
			steps: []step{"L0", "L1", "C", "L2", "L3", "C", "L4"},
			want: []string{
				"deliver 0 p0",
				"deliver 1 p1",
				"note unverifiable 1",
				"note health unconfirmed",
				"deliver 2 p2",
				"deliver 3 p3",
				"deliver 4 p4",
			},
			health: kvevents.HealthUnconfirmed,
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
			if s.Health() != tt.health {
				t.Errorf("health = %v, want %v", s.Health(), tt.health)
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
				// Seq 1 again on a new connection, but another batch:
				// a new process.
				s.Connected(0)
				s.Live(1, []byte("new1"), 0)
			},
			want: []string{
				"note replay-start 0 bootstrap",
				"request 0",
				"deliver 0 p0",
				"deliver 1 p1",
				"note replay-done 0-2 bootstrap",
				"note replay-start 1",
				"request 1",
				"cancel",
				"note restart 1-1",
				"reset restart",
				"note replay-start 0 bootstrap",
				"request 0",
			},
		},
		{
			name: "a batch unlike the replayed one under its seq is a restart", canReplay: true,
			steps: func(s *kvevents.Sequencer) {
				s.Live(0, []byte("p0"), 0)
				s.Live(2, []byte("p2"), 0)
				s.Replayed(0, []byte("p0"), 0) // verifies the process
				s.Replayed(1, []byte("p1"), 0)
				s.Replayed(2, []byte("p2"), 0)
				s.Replayed(3, []byte("p3"), 0)
				s.ReplayEnd(0)
				s.Live(3, []byte("p3"), 0) // in flight: a duplicate
				s.Live(4, []byte("p4"), 0)
				s.Connected(0)
				s.Live(4, []byte("x4"), 0) // below the live high mark
			},
			want: []string{
				"deliver 0 p0",
				"note gap 1-2",
				"note replay-start 0",
				"request 0",
				"note verified 0",
				"deliver 1 p1",
				"deliver 2 p2",
				"note duplicate 2",
				"deliver 3 p3",
				"note replay-done 1-4",
				"note duplicate 3",
				"deliver 4 p4",
				"note replay-start 4",
				"request 4",
				"cancel",
				"note restart 4-4",
				"reset restart",
				"note replay-start 0 bootstrap",
				"request 0",
			},
		},
		{
			name: "reconnect of a stream with history verifies it", canReplay: true,
			steps: func(s *kvevents.Sequencer) {
				s.Live(0, []byte("p0"), 0)
				s.Connected(0)
				s.Replayed(0, []byte("p0"), 0)
				s.ReplayEnd(0)
				s.Live(1, []byte("p1"), 0)
			},
			want: []string{
				"deliver 0 p0", "note replay-start 0", "request 0", "note verified 0",
				"note replay-done 0-0", "deliver 1 p1",
			},
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
			if s.Health() == kvevents.HealthDegraded {
				t.Error("degraded")
			}
		})
	}
}

// TestSequencerVerify covers what proves or disproves that an engine is
// still the process a stream's history came from: duplicates recognised
// by their print, live batches held in seq order, the replay from last on
// a reconnect, a gap or a resume, and the health each outcome leaves.
func TestSequencerVerify(t *testing.T) {
	withReplay := seqConfig(true)
	noReplay := seqConfig(false)
	tests := []struct {
		name   string
		cfg    kvevents.SequencerConfig
		steps  []step
		want   []string
		health kvevents.Health
	}{
		{
			name:  "the same live batch twice is a duplicate, not a restart",
			cfg:   noReplay,
			steps: []step{"L0", "L1", "L1", "L2", "L0"},
			want: []string{
				"deliver 0 p0",
				"deliver 1 p1",
				"note duplicate 1",
				"deliver 2 p2",
				"note duplicate 0",
			},
		},
		{
			name:  "another batch under an applied seq is a restart",
			cfg:   noReplay,
			steps: []step{"L0", "L1", "C", "L1b", "L2b"},
			want: []string{
				"deliver 0 p0",
				"deliver 1 p1",
				"note unverifiable 1",
				"note health unconfirmed",
				"note restart 1-1",
				"reset restart",
				"note join 1",
				"deliver 1 p1b",
				"deliver 2 p2b",
			},
			health: kvevents.HealthUnconfirmed,
		},
		{
			name:  "live batches arriving out of order during a replay are held in seq order",
			cfg:   withReplay,
			steps: []step{"L0", "L3", "L5", "L4", "L4", "R0", "R1", "R2", "E", "L6"},
			want: []string{
				"deliver 0 p0",
				"note gap 1-3",
				"note replay-start 0",
				"request 0",
				"note duplicate 4",
				"note verified 0",
				"deliver 1 p1",
				"deliver 2 p2",
				"note replay-done 1-3",
				"deliver 3 p3",
				"deliver 4 p4",
				"deliver 5 p5",
				"deliver 6 p6",
			},
		},
		{
			name:  "another batch under a held seq is a restart",
			cfg:   withReplay,
			steps: []step{"L0", "L3", "C", "L3b"},
			want: []string{
				"deliver 0 p0",
				"note gap 1-3",
				"note replay-start 0",
				"request 0",
				"cancel",
				"note replay-start 0",
				"request 0",
				"cancel",
				"note restart 3-3",
				"reset restart",
				"note replay-start 0 bootstrap",
				"request 0",
			},
		},
		{
			name:  "reconnect: the same process goes on",
			cfg:   withReplay,
			steps: []step{"L0", "L1", "C", "L3", "R1", "R2", "R3", "E", "L4"},
			want: []string{
				"deliver 0 p0",
				"deliver 1 p1",
				"note replay-start 1",
				"request 1",
				"note verified 1",
				"deliver 2 p2",
				"deliver 3 p3",
				"note replay-done 2-4",
				"note duplicate 3",
				"deliver 4 p4",
			},
		},
		{
			name:  "reconnect: another batch under last is a new process",
			cfg:   withReplay,
			steps: []step{"L0", "L1", "L2", "C", "L5b", "R2b", "R0b", "R1b", "R2b", "R3b", "R4b", "R5b", "E", "L6b"},
			want: []string{
				"deliver 0 p0",
				"deliver 1 p1",
				"deliver 2 p2",
				"note replay-start 2",
				"request 2",
				"note replay-restart 2-2 mismatch",
				"cancel",
				"reset restart",
				"note replay-start 0 bootstrap",
				"request 0",
				"deliver 0 p0b",
				"deliver 1 p1b",
				"deliver 2 p2b",
				"deliver 3 p3b",
				"deliver 4 p4b",
				"deliver 5 p5b",
				"note replay-done 0-6 bootstrap",
				"deliver 6 p6b",
			},
		},
		{
			name:  "reconnect: an empty replay is a new process with fewer batches",
			cfg:   withReplay,
			steps: []step{"L0", "L1", "L2", "C", "E", "R0b", "E", "L1b"},
			want: []string{
				"deliver 0 p0",
				"deliver 1 p1",
				"deliver 2 p2",
				"note replay-start 2",
				"request 2",
				"note replay-restart 2-2 incomplete",
				"reset restart",
				"note replay-start 0 bootstrap",
				"request 0",
				"deliver 0 p0b",
				"note replay-done 0-1 bootstrap",
				"deliver 1 p1b",
			},
		},
		{
			name:  "reconnect: a buffer that moved past last cannot prove the process",
			cfg:   withReplay,
			steps: []step{"L0", "L1", "C", "R5", "R5", "R6", "E", "L7"},
			want: []string{
				"deliver 0 p0",
				"deliver 1 p1",
				"note replay-start 1",
				"request 1",
				"note replay-restart 1-5 truncated",
				"cancel",
				"reset restart",
				"note replay-start 0 bootstrap",
				"request 0",
				"note truncated 0-5",
				"note health unconfirmed",
				"deliver 5 p5",
				"deliver 6 p6",
				"note replay-done 5-7 bootstrap",
				"deliver 7 p7",
			},
			health: kvevents.HealthUnconfirmed,
		},
		{
			name:  "reconnect: no answer leaves the stream unconfirmed",
			cfg:   withReplay,
			steps: []step{"L0", "L1", "C", "L2", "T2000000000", "L3"},
			want: []string{
				"deliver 0 p0",
				"deliver 1 p1",
				"note replay-start 1",
				"request 1",
				"cancel",
				"note replay-failed timeout",
				"note health unconfirmed",
				"deliver 2 p2",
				"deliver 3 p3",
			},
			health: kvevents.HealthUnconfirmed,
		},
		{
			name:  "reconnect: no answer and a hole is degraded",
			cfg:   withReplay,
			steps: []step{"L0", "L1", "C", "L4", "T2000000000"},
			want: []string{
				"deliver 0 p0",
				"deliver 1 p1",
				"note replay-start 1",
				"request 1",
				"cancel",
				"note replay-failed timeout",
				"note health unconfirmed",
				"note lost 2-4",
				"note health degraded",
				"deliver 4 p4",
			},
			health: kvevents.HealthDegraded,
		},
		{
			name:  "reconnect without a replay endpoint: the next batch decides",
			cfg:   noReplay,
			steps: []step{"L0", "L1", "C", "L2", "C", "L1b"},
			want: []string{
				"deliver 0 p0",
				"deliver 1 p1",
				"note unverifiable 1",
				"note health unconfirmed",
				"deliver 2 p2",
				"note restart 2-1",
				"reset restart",
				"note join 1",
				"deliver 1 p1b",
			},
			health: kvevents.HealthUnconfirmed,
		},
		{
			name:  "resume: the same process with a buffer reaching back is exact",
			cfg:   withReplay,
			steps: []step{"V5", "C", "L8", "R5", "R6", "R7", "R8", "E", "L9"},
			want: []string{
				"note health restored",
				"note replay-start 5",
				"request 5",
				"note verified 5",
				"deliver 6 p6",
				"deliver 7 p7",
				"deliver 8 p8",
				"note replay-done 6-9",
				"note health ok",
				"note duplicate 8",
				"deliver 9 p9",
			},
		},
		{
			name:  "resume: another process is reset",
			cfg:   withReplay,
			steps: []step{"V5", "C", "R5b", "R0b", "R1b", "E", "L2b"},
			want: []string{
				"note health restored",
				"note replay-start 5",
				"request 5",
				"note replay-restart 5-5 mismatch",
				"cancel",
				"reset restart",
				"note health ok",
				"note replay-start 0 bootstrap",
				"request 0",
				"deliver 0 p0b",
				"deliver 1 p1b",
				"note replay-done 0-2 bootstrap",
				"deliver 2 p2b",
			},
		},
		{
			name:  "resume without a connection event verifies before the first batch",
			cfg:   withReplay,
			steps: []step{"V5", "L6", "R5", "R6", "E", "L7"},
			want: []string{
				"note health restored",
				"note replay-start 5",
				"request 5",
				"note verified 5",
				"deliver 6 p6",
				"note replay-done 6-7",
				"note health ok",
				"note duplicate 6",
				"deliver 7 p7",
			},
		},
		{
			name:  "resume: no answer keeps the stream restored",
			cfg:   withReplay,
			steps: []step{"V5", "C", "T2000000000", "L6"},
			want: []string{
				"note health restored",
				"note replay-start 5",
				"request 5",
				"cancel",
				"note replay-failed timeout",
				"deliver 6 p6",
			},
			health: kvevents.HealthRestored,
		},
		{
			name:  "resume without a replay endpoint stays restored",
			cfg:   noReplay,
			steps: []step{"V5", "C", "L6", "L7"},
			want: []string{
				"note health restored",
				"deliver 6 p6",
				"deliver 7 p7",
			},
			health: kvevents.HealthRestored,
		},
		{
			name:  "resume without a replay endpoint: a restart from 0 is exact",
			cfg:   noReplay,
			steps: []step{"V5", "L0b", "L1b"},
			want: []string{
				"note health restored",
				"note restart 5-0",
				"reset restart",
				"deliver 0 p0b",
				"note health ok",
				"deliver 1 p1b",
			},
		},
		{
			name:  "resume of a degraded position stays degraded when verified",
			cfg:   withReplay,
			steps: []step{"V5!", "C", "R5", "E"},
			want: []string{
				"note health degraded",
				"note replay-start 5",
				"request 5",
				"note verified 5",
				"note replay-done 5-5",
			},
			health: kvevents.HealthDegraded,
		},
		{
			name:  "a truncated bootstrap is unconfirmed",
			cfg:   withReplay,
			steps: []step{"L9", "R7", "R8", "R9", "E"},
			want: []string{
				"note replay-start 0 bootstrap",
				"request 0",
				"note truncated 0-7",
				"note health unconfirmed",
				"deliver 7 p7",
				"deliver 8 p8",
				"deliver 9 p9",
				"note replay-done 7-10 bootstrap",
				"note duplicate 9",
			},
			health: kvevents.HealthUnconfirmed,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &seqRecorder{replayOK: true}
			s := kvevents.NewSequencer(rec, tt.cfg)
			runSteps(t, s, tt.steps)
			if !slices.Equal(rec.log, tt.want) {
				t.Errorf("got:\n\t%s\nwant:\n\t%s", strings.Join(rec.log, "\n\t"), strings.Join(tt.want, "\n\t"))
			}
			if s.Health() != tt.health {
				t.Errorf("health = %v, want %v", s.Health(), tt.health)
			}
			checkOrdered(t, rec)
		})
	}
}

// seqConfig is a sequencer configuration for scripted tests.
func seqConfig(canReplay bool) kvevents.SequencerConfig {
	return kvevents.SequencerConfig{CanReplay: canReplay, MaxHeld: 100, ReplayTimeout: 1e9}
}

func TestSequencerCleared(t *testing.T) {
	rec := &seqRecorder{}
	s := kvevents.NewSequencer(rec, kvevents.SequencerConfig{CanReplay: false, MaxHeld: 10, ReplayTimeout: 1e9})
	runSteps(t, s, []step{"L0", "L3"})
	if s.Health() != kvevents.HealthDegraded {
		t.Fatal("gap without replay did not degrade the stream")
	}
	s.Cleared()
	if s.Health() == kvevents.HealthDegraded {
		t.Fatal("AllBlocksCleared did not heal the stream")
	}
	if got := rec.log[len(rec.log)-1]; got != "note health ok" {
		t.Fatalf("last call %q, want note health ok", got)
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
	if s.Replaying() || (s.Health() != kvevents.HealthDegraded) {
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
		if s.Health() == kvevents.HealthDegraded {
			t.Fatalf("seed %d: degraded although every hole was replayable", seed)
		}
	}
}

// FuzzSequencer feeds arbitrary event scripts, from a fresh or a resumed
// stream, with batches of two engine processes: the sequencer must never
// panic, never deliver a seq twice or out of order between resets (so
// never twice per engine process), never hold more batches than its bound,
// and always note the health it reports.
//
//	go test -run XXX -fuzz FuzzSequencer -fuzztime 60s ./kvevents
func FuzzSequencer(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 0, 4, 1, 2, 1, 3, 2, 0})
	f.Add([]byte{0, 9, 3, 9, 0, 0, 2, 0})
	f.Add([]byte{4, 0, 1, 5, 1, 6, 2, 0, 0, 7})
	f.Add([]byte{0, 0, 0, 1, 4, 0, 0x11, 1, 0x11, 0, 2, 0})
	f.Fuzz(func(t *testing.T, script []byte) {
		rec := &seqRecorder{replayOK: len(script)%2 == 0}
		const maxHeld = 4
		s := kvevents.NewSequencer(rec, kvevents.SequencerConfig{CanReplay: len(script)%3 != 0, MaxHeld: maxHeld, ReplayTimeout: 10})
		if len(script)%5 == 0 && len(script) > 0 {
			seq := uint64(script[0])
			s.Resume(kvevents.Position{Seq: seq, Print: kvevents.BatchPrint([]byte(fmt.Sprintf("p%d", seq)))})
		}
		var now int64
		for i := 0; i+1 < len(script); i += 2 {
			op := script[i]
			arg := uint64(script[i+1])
			if op&0x80 != 0 {
				arg = binary.BigEndian.Uint64([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, script[i+1]})
			}
			payload := []byte(fmt.Sprintf("p%d", arg))
			if op&0x10 != 0 {
				payload = append(payload, 'b') // another engine process
			}
			switch op % 8 {
			case 0, 5:
				s.Live(arg, payload, now)
			case 1, 6:
				s.Replayed(arg, payload, now)
			case 2:
				s.ReplayEnd(now)
			case 3:
				now += int64(arg)
				s.Tick(now)
			case 4:
				s.Connected(now)
			case 7:
				s.Cleared()
			}
			if s.Held() > maxHeld {
				t.Fatalf("holding %d batches, bound %d", s.Held(), maxHeld)
			}
			if h := lastHealth(rec); h != s.Health() {
				t.Fatalf("health %v, last noted %v; log tail %q", s.Health(), h, rec.log[max(0, len(rec.log)-8):])
			}
		}
		checkOrdered(t, rec)
	})
}

// lastHealth returns the health a recorder was last told (ok if never).
func lastHealth(rec *seqRecorder) kvevents.Health {
	for i := len(rec.notes) - 1; i >= 0; i-- {
		if rec.notes[i].Kind == kvevents.NoteHealth {
			return rec.notes[i].Health
		}
	}
	return kvevents.HealthOK
}
