package nginx

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/service"
	"github.com/kvindex/kvindex/internal/sim"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/testutil/simtest"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
	"github.com/kvindex/kvindex/picker/enginemetrics"
	"github.com/kvindex/kvindex/picker/gateway"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

const (
	model   = "Qwen/Qwen2.5-7B-Instruct" // kvindex sim's default
	engines = 3
	// awaitBound bounds every wait for a condition: it only turns a hang
	// into a failure, no result depends on it.
	awaitBound = time.Minute
	jsModule   = "/usr/lib/nginx/modules/ngx_http_js_module.so"
)

// nginxBinary finds Debian's nginx (in /usr/sbin, not on every user's
// PATH) with its njs module, or skips the test.
func nginxBinary(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("nginx")
	if err != nil {
		bin = "/usr/sbin/nginx"
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skip("nginx is not installed (Debian: apt-get install nginx libnginx-mod-http-js; make deps installs it)")
	}
	if _, err := os.Stat(jsModule); err != nil {
		t.Skipf("nginx's js module %s is not installed (Debian: apt-get install libnginx-mod-http-js; make deps installs it)", jsModule)
	}
	return bin
}

// TestNginxRoutesByPrefix sends conversations through a real nginx running
// nginx.conf: with the picker answering, every later turn reaches the pod
// holding the conversation's first turn and is served from its cache; with
// the picker unreachable, nginx's fallback spreads the turns round robin
// and the fleet's cached fraction, read from the engines' own counters,
// is lower.
func TestNginxRoutesByPrefix(t *testing.T) {
	nginxBin := nginxBinary(t)
	dir := t.TempDir()

	// The engines, their HTTP fronts (kvindex sim's), kvindex serve
	// following them and kvindex picker asking it, in this process.
	evPorts, httpPorts := testutil.FreePorts(t, 2*engines), testutil.FreePorts(t, engines)
	so := sim.DefaultOptions()
	so.Engines, so.Rate, so.Port, so.HTTPPort = engines, 0, evPorts, httpPorts
	follow := simtest.Start(t, so)
	o := service.DefaultOptions()
	o.GRPCAddr, o.HTTPAddr, o.Model = "127.0.0.1:0", "127.0.0.1:0", follow.Model
	o.Index.Hasher = blockhash.MustNew(follow.Hash)
	for _, e := range follow.Engines {
		o.Engines = append(o.Engines, zmqtransport.EngineConfig{Name: e.Pod, Model: follow.Model, Endpoint: e.Endpoint, ReplayEndpoint: e.Replay, Ranks: e.Ranks})
	}
	serve, err := service.New(o, slog.New(slog.NewTextHandler(simtest.Log(t, "serve"), nil)))
	if err != nil {
		t.Fatal(err)
	}
	simtest.Run(t, serve.Start, serve.Wait)
	grpcAddr := serve.GRPCAddr()
	ctx, cancel := context.WithTimeout(context.Background(), 5*awaitBound)
	defer cancel()
	idx, err := client.Dial(ctx, grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer idx.Close()
	testutil.Await(t, awaitBound, "kvindex ready", func() bool { ok, err := idx.Ready(ctx); return err == nil && ok })

	pods := make([]string, engines)
	addrs := make([]string, engines)
	// nginx never tells the picker that a request ended, so a /v1/pick
	// decision counts as in flight for the pick hold. Here each turn ends
	// in milliseconds, before the next is sent: with the default hold,
	// three finished turns would count as load on their pod and the load
	// scorer would move the fourth away.
	po := &service.PickerServiceOptions{
		Picker:   service.PickerOptions{Gateway: gateway.Config{PickHold: time.Millisecond}, ExtProcAddr: "127.0.0.1:0"},
		Index:    grpcAddr,
		Dial:     []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		HTTPAddr: "127.0.0.1:0",
	}
	for i := range engines {
		pods[i], addrs[i] = fmt.Sprintf("pod-%d", i), fmt.Sprintf("127.0.0.1:%d", httpPorts+i)
		po.Picker.Gateway.Endpoints = append(po.Picker.Gateway.Endpoints, gateway.Endpoint{Pod: pods[i], Addr: addrs[i]})
	}
	picker, err := service.NewPicker(po, slog.New(slog.NewTextHandler(simtest.Log(t, "picker"), nil)))
	if err != nil {
		t.Fatal(err)
	}
	simtest.Run(t, picker.Start, picker.Wait)
	pickerAddr := picker.HTTPAddr()

	// Two nginx: one asking the picker, one whose picker is a closed port,
	// so that every request takes the fallback.
	routed := startNginx(t, nginxBin, filepath.Join(dir, "routed"), pickerAddr, addrs)
	fallback := startNginx(t, nginxBin, filepath.Join(dir, "fallback"), testutil.FreeAddr(t), addrs)

	rng := rand.New(rand.NewPCG(13, 1))
	const conversations, turns = 4, 4
	run := func(t *testing.T, base string, wantSticky bool) enginemetrics.Fraction {
		before := readCounters(t, addrs)
		last := before
		for c := range conversations {
			prompt := randomIDs(rng, 256) // its own prefix: no conversation shares blocks with another
			first := ""
			for turn := range turns {
				if turn > 0 {
					prompt = append(prompt, randomIDs(rng, 64)...)
				}
				got := complete(t, base, prompt, fmt.Sprintf("c%d", c))
				served := servedBy(t, addrs, &last, len(prompt))
				if got.upstream != addrs[served] {
					t.Fatalf("conversation %d turn %d: nginx says it proxied to %s, the engines' counters say %s", c, turn+1, got.upstream, addrs[served])
				}
				if turn == 0 {
					first = got.upstream
				} else if wantSticky {
					prev := (len(prompt) - 64) / 16 * 16 // the previous turn's full blocks
					if got.upstream != first || got.cached < prev {
						t.Errorf("conversation %d turn %d: reached %s with %d cached tokens, want %s (turn 1's pod) with >= %d",
							c, turn+1, got.upstream, got.cached, first, prev)
					}
				}
				t.Logf("conversation %d turn %d: %d tokens -> %s (%s), %d cached", c, turn+1, len(prompt), got.upstream, pods[served], got.cached)
				// The next turn is asked only once the index knows where this
				// one's blocks are, so that routing does not race the events.
				awaitHeld(t, ctx, idx, pods[served], prompt)
			}
		}
		after := readCounters(t, addrs)
		var f enginemetrics.Fraction
		for i := range addrs {
			f.Queries += after[i].Queries - before[i].Queries
			f.Hits += after[i].Hits - before[i].Hits
		}
		return f
	}
	var pick, rr enginemetrics.Fraction
	t.Run("picker", func(t *testing.T) { pick = run(t, routed, true) })
	t.Run("fallback", func(t *testing.T) { rr = run(t, fallback, false) })
	pf, pok := pick.Value()
	rf, rok := rr.Value()
	t.Logf("fleet cached fraction through nginx: with the picker %.3f (%v), round robin fallback %.3f (%v)", pf, pick, rf, rr)
	if !pok || !rok || pf <= rf {
		t.Errorf("fleet cached fraction with the picker %.3f, want above the round robin fallback's %.3f", pf, rf)
	}
	// The fallback really was the fallback: nginx logged the picker's failure.
	if b, _ := os.ReadFile(filepath.Join(dir, "fallback", "logs", "error.log")); !bytes.Contains(b, []byte("using the fallback")) {
		t.Errorf("the fallback nginx's error.log does not say it fell back:\n%s", b)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "routed", "logs", "error.log")); bytes.Contains(b, []byte("kvindex picker:")) {
		t.Errorf("the routed nginx's error.log reports picker failures:\n%s", b)
	}
}

// proc is a process the test started; it is killed when the test ends and
// its output shown if the test failed.
type proc struct {
	testutil.SyncBuffer
	done chan struct{}
	err  error
}

func start(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{done: make(chan struct{})}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = p, p
	// SIGTERM: nginx's master then stops its workers (which share its
	// output: killed alone, it would leave them holding the pipe);
	// WaitDelay bounds the wait for the pipe all the same.
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(awaitBound):
			cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			out := p.String()
			if len(out) > 6000 {
				out = "...\n" + out[len(out)-6000:]
			}
			t.Logf("%s %s:\n%s", filepath.Base(bin), strings.Join(args, " "), out)
		}
	})
	return p
}

// renderConf is nginx.conf with the example's addresses (the lines marked
// EDIT) replaced by listen, picker and engines.
func renderConf(t *testing.T, listen, picker string, engines []string) string {
	t.Helper()
	b, err := os.ReadFile("nginx.conf")
	if err != nil {
		t.Fatal(err)
	}
	conf := string(b)
	var servers strings.Builder
	for _, e := range engines {
		fmt.Fprintf(&servers, "        server %s;\n", e)
	}
	for _, r := range []struct {
		re, with string
	}{
		{`(?m)(upstream engines \{\n)(?:\s*server [^\n]*\n)+`, "${1}" + servers.String()},
		{`(?m)(upstream kvindex_picker \{\n\s*server )\S+;`, "${1}" + picker + ";"},
		{`(?m)^(\s*listen )\S+;`, "${1}" + listen + ";"},
	} {
		re := regexp.MustCompile(r.re)
		if !re.MatchString(conf) {
			t.Fatalf("nginx.conf has no %s to fill in", r.re)
		}
		conf = re.ReplaceAllString(conf, r.with)
	}
	return conf
}

// startNginx runs nginx.conf, filled in, from prefix dir and returns its
// base URL once it accepts connections.
func startNginx(t *testing.T, bin, dir, picker string, engines []string) string {
	t.Helper()
	listen := testutil.FreeAddr(t)
	for _, d := range []string{"logs", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// As root, nginx's workers run as nobody: they must reach the prefix.
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	js, err := os.ReadFile("pick.js")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pick.js"), js, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(renderConf(t, listen, picker, engines)), 0o644); err != nil {
		t.Fatal(err)
	}
	p := start(t, bin, "-p", dir, "-c", "nginx.conf", "-g", "daemon off;")
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "logs", "error.log"))
			t.Logf("%s/logs/error.log:\n%s", dir, b)
		}
	})
	testutil.Await(t, awaitBound, "nginx listening on "+listen, func() bool {
		select {
		case <-p.done:
			t.Fatalf("nginx exited: %v\n%s", p.err, p.String())
		default:
		}
		c, err := net.Dial("tcp", listen)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return "http://" + listen
}

func randomIDs(rng *rand.Rand, n int) []uint64 {
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = 1 + rng.Uint64N(150_000)
	}
	return ids
}

type reply struct {
	upstream string // where nginx proxied the request (x-kvindex-upstream)
	cached   int    // usage.prompt_tokens_details.cached_tokens
}

// complete sends a /v1/completions request through nginx.
func complete(t *testing.T, base string, prompt []uint64, session string) reply {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 4})
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-session-id", session)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s/v1/completions: %d %v\n%s", base, resp.StatusCode, err, b)
	}
	u, err := enginemetrics.ParseUsage(b)
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	if u.PromptTokens != len(prompt) {
		t.Fatalf("usage reports %d prompt tokens, sent %d", u.PromptTokens, len(prompt))
	}
	return reply{upstream: resp.Header.Get("x-kvindex-upstream"), cached: u.CachedTokens}
}

// readCounters reads each engine's prefix-cache counters for the model.
func readCounters(t *testing.T, addrs []string) []enginemetrics.Counters {
	t.Helper()
	out := make([]enginemetrics.Counters, len(addrs))
	for i, a := range addrs {
		resp, err := http.Get("http://" + a + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		r, err := enginemetrics.Parse(bufio.NewReader(resp.Body))
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s/metrics: %v", a, err)
		}
		out[i] = r.Prefix[model]
	}
	return out
}

// servedBy returns the engine whose prefix-cache queries grew by the
// request's prompt since *last (requests are sent one at a time), and
// moves *last on.
func servedBy(t *testing.T, addrs []string, last *[]enginemetrics.Counters, promptTokens int) int {
	t.Helper()
	now := readCounters(t, addrs)
	served := -1
	for i := range addrs {
		switch d := now[i].Queries - (*last)[i].Queries; d {
		case 0:
		case float64(promptTokens):
			if served >= 0 {
				t.Fatalf("two engines served one request: %v -> %v", *last, now)
			}
			served = i
		default:
			t.Fatalf("engine %s queried %v tokens for a %d-token prompt", addrs[i], d, promptTokens)
		}
	}
	if served < 0 {
		t.Fatalf("no engine counted the request: %v -> %v", *last, now)
	}
	*last = now
	return served
}

// awaitHeld waits until kvindex reports pod holding prompt's full blocks.
func awaitHeld(t *testing.T, ctx context.Context, idx *client.Client, pod string, prompt []uint64) {
	t.Helper()
	testutil.Await(t, awaitBound, pod+" holding the prompt in kvindex", func() bool {
		r, err := idx.LongestPrefixTokens(ctx, model, prompt, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range r.GetPods() {
			if m.GetPod() == pod && m.GetMatchedBlocks() == r.GetBlocksTotal() {
				return true
			}
		}
		return false
	})
}
