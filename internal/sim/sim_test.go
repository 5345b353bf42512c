package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/testutil/zmqtest"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/tokenizer"
)

const testTokenizer = "../../tokenizer/testdata/qwen2.5/tokenizer.json.gz"

// deadline bounds every wait, so that an event that never comes fails
// the test instead of hanging it.
const deadline = 30 * time.Second

// recorder keeps what a sim tells.
type recorder struct {
	mu       sync.Mutex
	events   []Event
	started  chan struct{}
	finished chan struct{}
}

func newRecorder() *recorder {
	return &recorder{started: make(chan struct{}), finished: make(chan struct{})}
}

func (r *recorder) observe(ev Event) {
	r.mu.Lock()
	r.events = append(r.events, ev)
	r.mu.Unlock()
	switch ev.(type) {
	case Started:
		close(r.started)
	case Finished:
		close(r.finished)
	}
}

// requests returns the workload's requests told so far.
func (r *recorder) requests() []Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Request
	for _, ev := range r.events {
		if q, ok := ev.(Request); ok {
			out = append(out, q)
		}
	}
	return out
}

// httpRequests returns the HTTP requests told so far.
func (r *recorder) httpRequests() []HTTPRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []HTTPRequest
	for _, ev := range r.events {
		if q, ok := ev.(HTTPRequest); ok {
			out = append(out, q)
		}
	}
	return out
}

// awaitFinished waits until the workload has made its requests.
func (r *recorder) awaitFinished(t *testing.T) {
	t.Helper()
	select {
	case <-r.finished:
	case <-time.After(deadline):
		t.Fatalf("the workload did not finish: %d requests made", len(r.requests()))
	}
}

// running is a sim running in the test's process.
type running struct {
	*Sim
	rec *recorder
	// stop stops it as Ctrl-C does and returns how Run ended, once no
	// goroutine of its is left.
	stop func() error
}

// startSim runs a sim of o, its ports moved to free ones (a port taken
// meanwhile is retried elsewhere), until the test ends.
func startSim(t *testing.T, o Options) *running {
	t.Helper()
	for attempt := 0; ; attempt++ {
		r, err := tryStartSim(t, placePorts(t, o))
		if err == nil {
			return r
		}
		if attempt == 4 || !strings.Contains(err.Error(), "in use") {
			t.Fatal(err)
		}
	}
}

func tryStartSim(t *testing.T, o Options) (*running, error) {
	t.Helper()
	rec := newRecorder()
	o.Observe = rec.observe
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case <-rec.started:
	case err := <-done:
		cancel()
		awaitNoGoroutines(t)
		return nil, err
	case <-time.After(deadline):
		cancel()
		t.Fatal("the sim did not start")
	}
	r := &running{Sim: s, rec: rec}
	r.stop = sync.OnceValue(func() error {
		cancel()
		err := <-done
		awaitNoGoroutines(t)
		return err
	})
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return r, nil
}

// placePorts moves o's ports to free ones: in connect mode the event
// ports (the replay ports follow them), in bind mode the replay ports,
// and the HTTP ports clear of both.
func placePorts(t *testing.T, o Options) Options {
	t.Helper()
	hosts, first, n := []string{"127.0.0.1"}, 0, 0
	if o.Connect == "" {
		n = 2 * o.Engines * o.Ranks
		o.Port = testutil.FreePortsOn(t, hosts, n)
		first = o.Port
	} else {
		hosts = nil
		for i := range o.Engines {
			hosts = append(hosts, "127.0.0."+strconv.Itoa(i+1))
		}
		if !o.NoReplay {
			n = o.Ranks
			o.ReplayPort = testutil.FreePortsOn(t, hosts, n)
			first = o.ReplayPort
		}
	}
	if o.HTTPPort != 0 {
		hn := o.Engines // in bind mode, one port on every host
		if o.Connect != "" {
			hn = 1
		}
		o.HTTPPort = testutil.FreePortsOn(t, hosts, hn)
		for o.HTTPPort < first+n && first < o.HTTPPort+hn {
			o.HTTPPort = testutil.FreePortsOn(t, hosts, hn)
		}
	}
	return o
}

// awaitNoGoroutines waits until no goroutine runs the sim's code, the
// engines' or their HTTP servers': a part Run did not stop would run on.
func awaitNoGoroutines(t *testing.T) {
	t.Helper()
	end := time.Now().Add(deadline)
	for {
		buf := make([]byte, 1<<22)
		buf = buf[:runtime.Stack(buf, true)]
		var left []string
		for _, g := range strings.Split(string(buf), "\n\n") {
			for _, code := range []string{"kvindex/internal/sim.(*", "kvindex/internal/lifecycle.", "kvindex/kvevents/", "net/http.(*conn).serve"} {
				if strings.Contains(g, code) {
					left = append(left, g)
					break
				}
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%d goroutines outlive Run:\n%s", len(left), strings.Join(left, "\n\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// testOptions are a quick workload on two engines of two ranks.
func testOptions() Options {
	o := DefaultOptions()
	o.Ranks, o.Rate, o.Sessions, o.Turns = 2, maxRate, 3, 4
	return o
}

// zmqSocket opens a socket of its own context, closed when the test ends.
func zmqSocket(t *testing.T, kind zmq.Type) *zmq.Socket {
	t.Helper()
	ctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	s, err := ctx.NewSocket(kind)
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(s.SetLinger(0), s.SetRcvtimeo(zmqtest.RecvTimeout)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); ctx.Term() })
	return s
}

// receive reads one message of an engine's PUB socket: its topic and
// its batch.
func receive(t *testing.T, s *zmq.Socket) (string, kvevents.Batch) {
	t.Helper()
	f, err := s.RecvMessageBytes(0)
	if err != nil {
		t.Fatalf("receiving an event batch: %v", err)
	}
	var b kvevents.Batch
	if len(f) != 3 || len(f[1]) != 8 {
		t.Fatalf("a message of %d frames: %x", len(f), f)
	}
	if err := (&kvevents.Decoder{}).Decode(f[2], &b); err != nil {
		t.Fatal(err)
	}
	return string(f[0]), b
}

// Every engine rank publishes its events live, byte for byte as vLLM
// does, and replays them: in connect mode on its own socket, in bind mode
// through kvindex's, on its engine's topic.
func TestEnginesPublish(t *testing.T) {
	for _, tc := range []struct {
		name string
		bind bool
	}{{"connect mode", false}, {"bind mode", true}} {
		t.Run(tc.name, func(t *testing.T) {
			o := testOptions()
			var listen *zmq.Socket
			if tc.bind {
				// kvindex serve's listen socket, as the engines see it.
				listen = zmqSocket(t, zmq.SUB)
				o.Connect = "tcp://127.0.0.1:" + strconv.Itoa(testutil.FreePortsOn(t, []string{"127.0.0.1"}, 1))
				if err := errors.Join(listen.SetSubscribe(""), listen.Bind(o.Connect)); err != nil {
					t.Fatal(err)
				}
			}
			r := startSim(t, o)
			engines := r.Engines()
			if len(engines) != 4 {
				t.Fatalf("%d engine ranks, want 4", len(engines))
			}
			// A batch from every rank.
			if tc.bind {
				heard := map[string]bool{}
				for len(heard) < len(engines) {
					topic, b := receive(t, listen)
					pod, ok := strings.CutPrefix(strings.TrimSuffix(topic, "@"+o.Model), "kv@")
					if !ok || !slices.Contains(r.Plan().Pods(), pod) || !b.HasDPRank || b.DPRank >= o.Ranks {
						t.Fatalf("a batch on topic %q, rank %v %d", topic, b.HasDPRank, b.DPRank)
					}
					heard[pod+"/"+strconv.Itoa(b.DPRank)] = true
				}
			} else {
				for _, e := range engines {
					sub := zmqSocket(t, zmq.SUB)
					if err := errors.Join(sub.SetSubscribe(""), sub.Connect(e.PubEndpoint())); err != nil {
						t.Fatal(err)
					}
					if topic, b := receive(t, sub); topic != "" || b.DPRank != e.Rank {
						t.Fatalf("%s published on topic %q as rank %d", e.Name(), topic, b.DPRank)
					}
				}
			}
			for _, e := range engines {
				if want := map[bool]string{false: "", true: "kv@" + e.Pod + "@" + o.Model}[tc.bind]; e.Topic != want {
					t.Errorf("%s: topic %q, want %q", e.Name(), e.Topic, want)
				}
				d := zmqtest.Dealer(t, e.ReplayEndpoint())
				zmqtest.Request(t, d, 0)
				got := zmqtest.ReadReplay(t, d, e.Topic, false)
				if len(got) == 0 {
					t.Errorf("%s replays nothing", e.Name())
				}
				for i := 1; i < len(got); i++ {
					if got[i].Seq != got[i-1].Seq+1 {
						t.Fatalf("%s replays seq %d after %d", e.Name(), got[i].Seq, got[i-1].Seq)
					}
				}
			}
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// The requests a seed sends are the same from run to run, engine for
// engine, and another seed sends others. Every conversation stays on its
// engine, which holds its previous prompt when its next turn resends it;
// a conversation starting on an engine that served another finds the
// shared system prompt cached there.
func TestDeterministicWorkload(t *testing.T) {
	for _, tc := range []struct {
		name      string
		tokenizer string
	}{{"token ids", ""}, {"text", testTokenizer}} {
		t.Run(tc.name, func(t *testing.T) {
			run := func(seed uint64) ([]Request, string) {
				o := testOptions()
				o.Seed, o.Requests, o.Tokenizer = seed, 30, tc.tokenizer
				o.LogPrompts = filepath.Join(t.TempDir(), "prompts.txt")
				r := startSim(t, o)
				r.rec.awaitFinished(t)
				if err := r.stop(); err != nil {
					t.Fatal(err)
				}
				log, err := os.ReadFile(o.LogPrompts)
				if err != nil {
					t.Fatal(err)
				}
				return r.rec.requests(), string(log)
			}
			a, alog := run(7)
			b, blog := run(7)
			if len(a) != 30 || strings.Count(alog, "\n") != 30 {
				t.Fatalf("%d requests, %d prompts logged; want 30", len(a), strings.Count(alog, "\n"))
			}
			same := func(p, q Request) bool {
				return p.N == q.N && p.Conv == q.Conv && p.Turn == q.Turn && p.Engine.Name() == q.Engine.Name() && p.Tokens == q.Tokens && p.Cached == q.Cached
			}
			if !slices.EqualFunc(a, b, same) || alog != blog {
				t.Fatalf("two runs of seed 7 differ:\n%v\n%v", a, b)
			}
			if _, clog := run(8); clog == alog {
				t.Error("seeds 7 and 8 sent the same prompts")
			}
			last := map[int]Request{}
			served := map[string]bool{}
			for _, q := range a {
				prev, ok := last[q.Conv]
				switch {
				case ok && (q.Engine.Name() != prev.Engine.Name() || q.Turn != prev.Turn+1):
					t.Errorf("request %d leaves conversation %d's engine %s, or skips a turn", q.N, q.Conv, prev.Engine.Name())
				case ok && (q.Tokens <= prev.Tokens || q.Cached < prev.Tokens/16*16):
					t.Errorf("request %d: %d tokens, %d cached; its conversation's previous prompt had %d", q.N, q.Tokens, q.Cached, prev.Tokens)
				case !ok && q.Turn != 0:
					t.Errorf("request %d opens conversation %d at turn %d", q.N, q.Conv, q.Turn)
				case !ok && served[q.Engine.Name()] && q.Cached < systemTokens:
					t.Errorf("request %d opens conversation %d on %s with %d tokens cached, not the system prompt", q.N, q.Conv, q.Engine.Name(), q.Cached)
				}
				last[q.Conv], served[q.Engine.Name()] = q, true
			}
		})
	}
}

// With a tokenizer the prompts are text: the log holds them one per line
// and the tokenizer gives back what the engines were sent.
func TestTextPrompts(t *testing.T) {
	o := DefaultOptions()
	o.Engines, o.Tokenizer, o.Rate, o.Requests = 1, testTokenizer, 200, 5
	o.LogPrompts = filepath.Join(t.TempDir(), "prompts.txt")
	r := startSim(t, o)
	r.rec.awaitFinished(t)
	local, err := tokenizer.LoadFile(testTokenizer)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(o.LogPrompts)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if len(lines) != 5 || len(r.rec.requests()) != 5 {
		t.Fatalf("%d prompts logged, %d requests told; want 5", len(lines), len(r.rec.requests()))
	}
	// The last prompt is cached whole (its full blocks) on the one engine.
	ids := local.Encode(lines[4], true)
	e := r.Engines()[0]
	if n, err := e.Lookup(ids, nil); err != nil || n != len(ids)/16 || n == 0 || r.rec.requests()[4].Tokens != len(ids) {
		t.Errorf("pod-0 holds %d blocks (%v) of the last prompt's %d tokens", n, err, len(ids))
	}
}

// Each engine's HTTP front answers vLLM's API from the engine's cache and
// tells of its requests; once the sim stops, it is gone.
func TestHTTPFronts(t *testing.T) {
	o := DefaultOptions()
	o.Tokenizer, o.Rate, o.HTTPPort, o.PrefillPerToken = testTokenizer, 0, 8000, 0
	r := startSim(t, o)
	fronts := r.Fronts()
	if len(fronts) != 2 || fronts[0].Pod != "pod-0" || fronts[1].Pod != "pod-1" {
		t.Fatalf("fronts %v", fronts)
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	post := func(path, body string) (int, string) {
		t.Helper()
		resp, err := client.Post("http://"+fronts[1].Addr+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}
	const prompt = "You are a coding agent working in a large Go repository. Read the files before you change them, and run the tests after."
	var cached []int
	for range 2 {
		code, body := post("/v1/completions", `{"prompt":"`+prompt+`","max_tokens":4}`)
		var u struct {
			Usage struct {
				PromptTokens        int `json:"prompt_tokens"`
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if code != http.StatusOK || json.Unmarshal([]byte(body), &u) != nil || u.Usage.PromptTokens < 16 {
			t.Fatalf("completion: %d %s", code, body)
		}
		cached = append(cached, u.Usage.PromptTokensDetails.CachedTokens)
	}
	if cached[0] != 0 || cached[1] == 0 {
		t.Errorf("cached tokens %v: want none, then the prompt's full blocks", cached)
	}
	if code, body := post("/v1/completions", `{"model":"other","prompt":"x"}`); code != http.StatusNotFound && code != http.StatusBadRequest {
		t.Errorf("another model: %d %s", code, body)
	}
	var told []string
	for _, q := range r.rec.httpRequests() {
		name := "-"
		if q.Engine != nil {
			name = q.Engine.Name()
		}
		told = append(told, fmt.Sprintf("%s %s %s %d %d", q.Pod, name, q.Path, q.Status, q.CachedTokens))
	}
	want := []string{
		"pod-1 pod-1 /v1/completions 200 0",
		"pod-1 pod-1 /v1/completions 200 " + strconv.Itoa(cached[1]),
	}
	if len(told) != 3 || !slices.Equal(told[:2], want) || !strings.HasPrefix(told[2], "pod-1 - /v1/completions 4") {
		t.Errorf("told %q", told)
	}
	resp, err := client.Get("http://" + fronts[1].Addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), `vllm:prefix_cache_hits_total{engine="0",model_name="`+o.Model+`"} `+strconv.Itoa(cached[1])+"\n") {
		t.Errorf("pod-1's /metrics does not count its %d cached tokens:\n%s", cached[1], metrics)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Get("http://" + fronts[1].Addr + "/health"); err == nil {
		t.Error("pod-1's front answers after the sim stopped")
	}
}

// A part that cannot start stops the sim before its workload, with the
// setting at fault; what had started is stopped, its ports free again.
func TestStartRefused(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none")
	for _, tc := range []struct {
		name  string
		taken func(o *Options) int // the port another program holds
		field configerr.Field
		want  string
	}{
		{"event port", func(o *Options) int { return o.Port + 1 }, "Port",
			"pod-0/1: zmqtransport: "},
		{"replay port", func(o *Options) int { return o.Port + 2 }, "Port",
			"pod-0: zmqtransport: "},
		{"HTTP port", func(o *Options) int { o.HTTPPort = o.Port + 10; return o.HTTPPort }, "HTTPPort",
			"pod-0: HTTP: listen tcp 127.0.0.1:"},
		{"prompt log", func(o *Options) int { o.LogPrompts = filepath.Join(missing, "p.txt"); return 0 }, "LogPrompts",
			"LogPrompts " + filepath.Join(missing, "p.txt") + ": no such file or directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := DefaultOptions()
			o.Engines, o.Ranks = 1, 2
			o.Port = testutil.FreePortsOn(t, []string{"127.0.0.1"}, 11)
			port := tc.taken(&o)
			if port != 0 {
				l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
				if err != nil {
					t.Skipf("port %d: %v", port, err)
				}
				defer l.Close()
			}
			rec := newRecorder()
			o.Observe = rec.observe
			s, err := New(o)
			if err != nil {
				t.Fatal(err)
			}
			err = s.Run(context.Background())
			awaitNoGoroutines(t)
			ce, ok := configerr.As(err)
			if !ok || ce.Field != tc.field || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("Run: %v; want %s: %q...", err, tc.field, tc.want)
			}
			if port != 0 && !strings.Contains(err.Error(), "in use (another program holds the port? choose ") {
				t.Errorf("Run: %v", err)
			}
			if len(rec.events) != 0 {
				t.Errorf("told %v", rec.events)
			}
			for p := o.Port; p < o.Port+4; p++ {
				if p == port {
					continue
				}
				l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
				if err != nil {
					t.Errorf("port %d still held: %v", p, err)
					continue
				}
				l.Close()
			}
		})
	}
}
