package zmqtransport

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
)

// debianPython is the interpreter with Debian's python3-zmq and
// python3-msgpack.
const debianPython = "/usr/bin/python3"

// pyPublisher drives testdata/interop/vllm_publisher.py.
type pyPublisher struct {
	t        *testing.T
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	out      *bufio.Scanner
	PubEP    string
	ReplayEP string
	last     int64 // last published seq, -1 for none
}

type pyReply struct {
	Pub    string `json:"pub"`
	Replay string `json:"replay"`
	Seq    int64  `json:"seq"`
}

func startPyPublisher(t *testing.T, args ...string) *pyPublisher {
	t.Helper()
	if _, err := os.Stat(debianPython); err != nil {
		t.Skipf("interop test skipped: %s not found (install Debian's python3, python3-zmq, python3-msgpack)", debianPython)
	}
	if out, err := exec.Command(debianPython, "-c", "import zmq, msgpack").CombinedOutput(); err != nil {
		t.Skipf("interop test skipped: %s lacks python3-zmq or python3-msgpack: %s", debianPython, strings.TrimSpace(string(out)))
	}
	cmd := exec.Command(debianPython, append([]string{"testdata/interop/vllm_publisher.py"}, args...)...)
	cmd.Stderr = testWriter{t}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &pyPublisher{t: t, cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}
	t.Cleanup(func() {
		p.stdin.Close() // EOF: the script exits
		if err := p.cmd.Wait(); err != nil {
			t.Errorf("publisher script: %v", err)
		}
	})
	r := p.read()
	p.PubEP, p.ReplayEP = r.Pub, r.Replay
	return p
}

func (p *pyPublisher) read() pyReply {
	p.t.Helper()
	if !p.out.Scan() {
		p.t.Fatalf("publisher script ended: %v", p.out.Err())
	}
	var r pyReply
	if err := json.Unmarshal(p.out.Bytes(), &r); err != nil {
		p.t.Fatalf("publisher script said %q: %v", p.out.Text(), err)
	}
	p.last = r.Seq
	return r
}

// do sends one command and returns the last published seq.
func (p *pyPublisher) do(cmd string) int64 {
	p.t.Helper()
	if _, err := fmt.Fprintln(p.stdin, cmd); err != nil {
		p.t.Fatal(err)
	}
	return p.read().Seq
}

// handshake publishes probe batches until one is applied: then the
// engine's PUB has our subscription (its slow-joiner window is over).
func (p *pyPublisher) handshake(sink *recSink, e kvevents.EngineID) {
	p.t.Helper()
	testutil.Await(p.t, waitTimeout, "a probe batch to arrive live", func() bool {
		seq := p.do("probe")
		a := sink.applied(e)
		return len(a) > 0 && a[len(a)-1] == uint64(seq)
	})
}

// checkPyBatches asserts that every applied batch of e carries what the
// script put under that seq.
func checkPyBatches(t *testing.T, sink *recSink, e kvevents.EngineID) {
	t.Helper()
	for _, ent := range sink.entries(e) {
		if ent.reset != "" {
			continue
		}
		n := ent.seq
		wantKinds := []kvevents.Kind{kvevents.BlockStored}
		wantHashes := []uint64{hashOf(n), n}
		if n%10 == 9 {
			wantKinds = append(wantKinds, kvevents.BlockRemoved)
			wantHashes = append(wantHashes, n-5)
		}
		if !slices.Equal(ent.kinds, wantKinds) || !slices.Equal(ent.hashes, wantHashes) {
			t.Fatalf("%s seq %d: got %v %x, want %v %x", e, n, ent.kinds, ent.hashes, wantKinds, wantHashes)
		}
	}
}

// TestInteropPythonPublisher runs the subscriber against a publisher in
// Python (libzmq via pyzmq, payloads via python3-msgpack) that behaves
// like vLLM's ZmqEventPublisher: late join with history, lost batches
// replayed in both reply layouts, and a restarted process on the same
// ports.
func TestInteropPythonPublisher(t *testing.T) {
	tests := []struct {
		layout, shape string
		rank          int
	}{
		{"old", "array", 0},
		{"new", "map", 0},
		{"new", "array", 3}, // a batch stamped with rank 3 on the rank-0 port wins
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("replay-%s/%s/rank%d", tt.layout, tt.shape, tt.rank), func(t *testing.T) {
			py := startPyPublisher(t, "--topic", "kv@py@m", "--replay-layout", tt.layout,
				"--shape", tt.shape, "--dp-rank", fmt.Sprint(tt.rank), "--pre", "25")
			sink := newRecSink()
			s := startSubscriber(t, SubscriberConfig{Engines: []EngineConfig{{
				Name: "py", Model: "m", Endpoint: py.PubEP, ReplayEndpoint: py.ReplayEP, Topic: "kv@",
			}}}, sink)
			e := kvevents.EngineID{Pod: "py", Model: "m", DPRank: tt.rank}
			// The 25 batches published before we connected come from
			// the replay asked for on connecting.
			sink.waitApplied(t, e, 24)
			py.handshake(sink, e)

			last := py.do("go 200 40,41,42,150")
			sink.waitApplied(t, e, uint64(last))
			sink.wantCalls(t, e, seqRange(0, uint64(last)+1))
			checkPyBatches(t, sink, e)
			st := mustStream(t, s, e)
			// One replay may cover both holes if the script published
			// the second before serving the first request.
			if st.Gaps < 1 || (st.Health == kvevents.HealthDegraded) || st.LostBatches != 0 || st.DecodeErrors != 0 {
				t.Fatalf("stats %+v; want gaps replayed, healthy", st)
			}

			// A new engine process on the same ports.
			before := len(sink.entries(e))
			py.do("restart")
			py.handshake(sink, e)
			last = py.do("go 30")
			testutil.Await(t, waitTimeout, "the restarted publisher's batches", func() bool {
				a := sink.applied(e)
				return len(a) > 0 && a[len(a)-1] == uint64(last) && len(sink.entries(e)) > before
			})
			calls := sink.entries(e)[before:]
			if calls[0].reset != kvevents.ResetRestart {
				t.Fatalf("after the restart the Sink got %v first, want a restart reset", calls[0])
			}
			if got := sink.applied(e); !slices.Equal(got, seqsUpTo(uint64(last))) {
				t.Fatalf("after the restart applied %v, want 0..%d", got, last)
			}
			checkPyBatches(t, sink, e)
			if st := mustStream(t, s, e); st.Restarts != 1 || (st.Health == kvevents.HealthDegraded) {
				t.Fatalf("stats %+v; want 1 restart, healthy", st)
			}
		})
	}
}

func seqsUpTo(last uint64) []uint64 {
	out := make([]uint64, last+1)
	for i := range out {
		out[i] = uint64(i)
	}
	return out
}
