package faultlab

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/internal/memlimit"
	"github.com/kvindex/kvindex/picker/gateway"
)

// The HTTP flood rows' settings.
const (
	// floodHTTPBudget is the --memory-budget of the body-flood rows.
	floodHTTPBudget = 64 << 20
	// floodBodyBytes is each flooding body's length (sent chunked, with
	// no Content-Length, so that it cannot be refused before it is read).
	floodBodyBytes = 200 << 20
	// floodFor is how long the floods at least last: past the 5 s header
	// deadline, so that it is hit while legitimate queries go on.
	floodFor = 10 * time.Second
	// probeEvery paces the legitimate queries.
	probeEvery = 50 * time.Millisecond
	// legitAddr is where the legitimate clients connect from: another
	// loopback address than the floods' 127.0.0.1, as another host would.
	legitAddr = "127.0.0.2"
)

// legitClient is an HTTP client connecting from legitAddr, with a generous
// deadline: a query slower than it is a failure.
func legitClient() *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(legitAddr)}, Timeout: 10 * time.Second}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 4}}
}

// floodPattern is what a flooding body repeats: token ids, never ending
// the JSON value, so that the server reads until a bound stops it.
var floodPattern = bytes.Repeat([]byte("1,"), 32<<10)

// floodBody is a request body of n bytes: a JSON object opening a token
// list that goes on for all of them.
type floodBody struct{ prefix, left int }

func newFloodBody(n int) *floodBody { return &floodBody{left: n} }

func (b *floodBody) Read(p []byte) (int, error) {
	const head = `{"model":"` + model + `","tokens":[`
	if b.left <= 0 {
		return 0, io.EOF
	}
	var n int
	if b.prefix < len(head) {
		n = copy(p, head[b.prefix:])
		b.prefix += n
	} else {
		n = copy(p[:min(len(p), b.left)], floodPattern)
	}
	b.left -= n
	return n, nil
}

// outcomes counts the answers a flood got, by status ("error" for none).
type outcomes struct {
	mu sync.Mutex
	m  map[string]int
}

func (o *outcomes) add(k string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[string]int{}
	}
	o.m[k]++
}

func (o *outcomes) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var keys []string
	for k := range o.m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, o.m[k]))
	}
	return strings.Join(parts, ", ")
}

// floodHTTP posts chunked floodBodyBytes bodies to url from n goroutines,
// one after the other, until ctx ends.
func floodHTTP(ctx context.Context, wg *sync.WaitGroup, n int, urls []string, out *outcomes) {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	for i := range n {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, urls[i%len(urls)], newFloodBody(floodBodyBytes))
				if err != nil {
					panic(err)
				}
				resp, err := hc.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						out.add("error")
					}
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				out.add(strconv.Itoa(resp.StatusCode))
			}
		})
	}
}

// probes are the legitimate queries of a row: their latencies and
// failures.
type probes struct {
	mu    sync.Mutex
	lat   []time.Duration
	fails []string
}

func (p *probes) record(d time.Duration, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.fails = append(p.fails, err.Error())
		return
	}
	p.lat = append(p.lat, d)
}

// summary is "N answered, p50 X, max Y, F failed".
func (p *probes) summary() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	lat := slices.Clone(p.lat)
	slices.Sort(lat)
	var p50, pmax time.Duration
	if len(lat) > 0 {
		p50, pmax = lat[len(lat)/2], lat[len(lat)-1]
	}
	return fmt.Sprintf("%d answered, p50 %v, max %v, %d failed", len(lat), p50.Round(time.Millisecond), pmax.Round(time.Millisecond), len(p.fails))
}

// failed fails t if any probe failed.
func (p *probes) failed(t *testing.T, what string) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.fails) > 0 {
		t.Errorf("%d legitimate %s failed under the flood, e.g. %s", len(p.fails), what, p.fails[0])
	}
}

// longestPrefixHTTP asks kvindex's HTTP API for prompt's longest prefix.
func longestPrefixHTTP(hc *http.Client, httpAddr string, prompt []uint64) (client.LongestPrefixJSON, error) {
	var out client.LongestPrefixJSON
	body, _ := json.Marshal(map[string]any{"model": model, "tokens": prompt})
	resp, err := hc.Post("http://"+httpAddr+"/v1/longest-prefix", "application/json", bytes.NewReader(body))
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return out, err
	}
	if resp.StatusCode != http.StatusOK {
		return out, fmt.Errorf("status %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	return out, json.Unmarshal(b, &out)
}

// probeHTTP asks kvindex for a check prompt every probeEvery until stop
// is closed and floodFor has passed.
func probeHTTP(httpAddr string, stop <-chan struct{}, p *probes) {
	hc := legitClient()
	until := time.Now().Add(floodFor)
	for i := 0; ; i++ {
		t0 := time.Now()
		_, err := longestPrefixHTTP(hc, httpAddr, checkPrompts[i%len(checkPrompts)])
		p.record(time.Since(t0), err)
		select {
		case <-stop:
			if time.Now().After(until) {
				return
			}
		default:
		}
		time.Sleep(probeEvery)
	}
}

// checkHTTP compares kvindex's HTTP answer for every check prompt with
// the engines' true caches, as check does over gRPC.
func checkHTTP(t *testing.T, httpAddr string, engines []*engine) tally {
	t.Helper()
	hc := legitClient()
	var out tally
	for i, p := range checkPrompts {
		r, err := longestPrefixHTTP(hc, httpAddr, p)
		if err != nil {
			t.Fatalf("HTTP longest prefix: %v", err)
		}
		got := map[string]client.PodMatchJSON{}
		for _, m := range r.Pods {
			got[podKey(m.Pod, m.DPRank)] = m
		}
		for _, e := range engines {
			m, ok := got[podKey(e.name, 0)]
			truth := e.LookupKeys(checkKeys[i])
			out.checked++
			switch {
			case ok && int(m.MatchedBlocks) == truth, !ok && truth == 0:
			case !ok || m.Health == "ok":
				out.wrongOK++
				if len(out.examples) < 5 {
					out.examples = append(out.examples, fmt.Sprintf("HTTP, prompt %d: %s reported ok with %d blocks, holds %d", i, e.name, m.MatchedBlocks, truth))
				}
			default:
				out.wrongFlagged++
			}
		}
	}
	return out
}

// metricSum adds up the samples of a metric (all its label sets) in the
// Prometheus text at url, the ones whose labels contain match.
func metricSum(t *testing.T, url, name, match string) float64 {
	t.Helper()
	resp, err := legitClient().Get(url)
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest[0] != ' ' && rest[0] != '{') || !strings.Contains(rest, match) {
			continue
		}
		f := strings.Fields(rest)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// amend changes the recorded row of t's fault.
func amend(t *testing.T, edit func(*row)) {
	fault := strings.TrimPrefix(t.Name(), "TestFaults/")
	tableMu.Lock()
	defer tableMu.Unlock()
	for i := range table {
		if table[i].fault == fault {
			edit(&table[i])
		}
	}
}

// addNote appends to a row's note.
func addNote(r *row, note string) {
	if r.note != "" {
		r.note += "; "
	}
	r.note += note
}

// httpBodyFlood: kvindex serve --memory-budget 64MiB under 96 chunked
// 200 MB request bodies at a time, to /v1/longest-prefix and /v1/lookup,
// while 4 engines publish and legitimate HTTP queries (from another
// address) go on. Every legitimate query must answer, the answers under
// the flood must be exact, and the peak RSS must stay within the bound.
func httpBodyFlood(t *testing.T) {
	k, engines, tr := start(t, 4, engineOpts{replay: true}, "--memory-budget", strconv.Itoa(floodHTTPBudget))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	var flood outcomes
	floodHTTP(ctx, &wg, 96, []string{"http://" + k.httpAddr + "/v1/longest-prefix", "http://" + k.httpAddr + "/v1/lookup"}, &flood)
	legit, httpTally := probeUnderLoad(t, k, engines, tr, 300)
	metrics := "http://" + k.httpAddr + "/metrics"
	busy := metricSum(t, metrics, "kvindex_query_refused_total", `reason="body_bytes_in_flight"`)
	cancel()
	wg.Wait()
	faultEnd := time.Now()
	tail(t, newTraffic(4), engines)
	settle(t, k, faultEnd, engines, nil, floodHTTPBudget)
	checkBound(t, k, floodHTTPBudget)
	note := fmt.Sprintf("legitimate queries: %s; flood answers: %s; %v refused as busy", legit.summary(), flood.String(), busy)
	reportHTTP(t, legit, httpTally, note)
}

// httpSlowConns: 1,200 connections from 127.0.0.1 trickling their
// headers (half) or their bodies (half) a byte every 50 ms, reconnecting
// when closed, while 2 engines publish and legitimate HTTP queries come
// from 127.0.0.2. Every legitimate query must answer (within the
// client's 10 s), and the answers stay exact.
func httpSlowConns(t *testing.T) {
	k, engines, tr := start(t, 2, engineOpts{replay: true})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	var opened atomic.Int64
	for i := range 1200 {
		head := "GET /v1/pods HTTP/1.1\r\nHost: kvindex\r\nX-Slow: "
		if i%2 == 1 {
			head = "POST /v1/longest-prefix HTTP/1.1\r\nHost: kvindex\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n" + `{"model":"` + model + `","tokens":[`
		}
		wg.Go(func() { trickle(ctx, k.httpAddr, head, &opened) })
	}
	legit, httpTally := probeUnderLoad(t, k, engines, tr, 1000)
	metrics := "http://" + k.httpAddr + "/metrics"
	refused := metricSum(t, metrics, "kvindex_http_connections_refused_total", "")
	timeouts := metricSum(t, metrics, "kvindex_http_read_timeouts_total", "")
	cancel()
	wg.Wait()
	faultEnd := time.Now()
	settle(t, k, faultEnd, engines, nil, 0)
	note := fmt.Sprintf("legitimate queries: %s; %d slow connections opened, %v refused by the per-address share, %v closed by a read deadline",
		legit.summary(), opened.Load(), refused, timeouts)
	reportHTTP(t, legit, httpTally, note)
}

// probeUnderLoad runs legitimate HTTP queries (probeHTTP) while the
// engines serve requests through tr, then, with the fault still on,
// waits for a quiescent point and compares every HTTP answer with the
// engines' caches (checkHTTP).
func probeUnderLoad(t *testing.T, k *kvindexProc, engines []*engine, tr *traffic, requests int) (*probes, tally) {
	t.Helper()
	legit := &probes{}
	stop, probed := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(probed)
		probeHTTP(k.httpAddr, stop, legit)
	}()
	tr.run(t, engines, requests)
	close(stop)
	<-probed
	tail(t, tr, engines)
	if !quiesce(t, k, engines) {
		t.Fatal("no quiescent point under the fault")
	}
	return legit, checkHTTP(t, k.httpAddr, engines)
}

// reportHTTP adds the HTTP answers' tally and a note to the row, and
// fails the test for a failed legitimate query or an HTTP answer wrong
// for an engine reported ok.
func reportHTTP(t *testing.T, legit *probes, httpTally tally, note string) {
	t.Helper()
	amend(t, func(r *row) {
		r.checked += httpTally.checked
		r.wrongOK += httpTally.wrongOK
		r.wrongFlagged += httpTally.wrongFlagged
		addNote(r, note)
	})
	t.Log(note)
	legit.failed(t, "queries")
	if httpTally.wrongOK > 0 {
		t.Errorf("%d of %d HTTP answers under the fault wrong for an engine reported ok, e.g.\n  %s", httpTally.wrongOK, httpTally.checked, strings.Join(httpTally.examples, "\n  "))
	}
}

// trickle connects to addr and sends head, then one more byte every 50 ms,
// until the server closes the connection; then it connects again (after a
// pause, so that refused connections do not spin), until ctx ends.
func trickle(ctx context.Context, addr, head string, opened *atomic.Int64) {
	for ctx.Err() == nil {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			opened.Add(1)
			trickleOn(ctx, conn, head)
			conn.Close()
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func trickleOn(ctx context.Context, conn net.Conn, head string) {
	for i := 0; ; i++ {
		b := byte('1')
		if i < len(head) {
			b = head[i]
		}
		if _, err := conn.Write([]byte{b}); err != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

var pickerServing = regexp.MustCompile(`picker serving"? extproc=(\S+) http=(\S+)`)

// pickerBodyFlood: kvindex picker --memory-budget 64MiB, asking a kvindex
// that follows 2 engines, under 64 ext_proc streams whose request body
// never ends (half send without pause, half send 1 MiB and then hold it)
// and 16 chunked 200 MB bodies to /v1/pick at a time. Legitimate picks,
// over ext_proc and over HTTP from another address, must be routed, and
// the picker's peak RSS must stay within the bound of its budget.
func pickerBodyFlood(t *testing.T) {
	k, engines, tr := start(t, 2, engineOpts{replay: true})
	p, m := startProc(t, []string{"picker", "--index", k.grpcAddr, "--extproc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--endpoint", engines[0].name + "=127.0.0.1:8001", "--endpoint", engines[1].name + "=127.0.0.1:8002",
		"--scrape-interval", "0", "--memory-budget", strconv.Itoa(floodHTTPBudget)}, pickerServing)
	extprocAddr, pickHTTP := m[1], m[2]
	cc, err := grpc.NewClient(extprocAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	xc := extprocv3.NewExternalProcessorClient(cc)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	var streams outcomes
	for i := range 64 {
		wg.Go(func() {
			for ctx.Err() == nil {
				streams.add(endlessStream(ctx, xc, i%2 == 1))
			}
		})
	}
	var flood outcomes
	floodHTTP(ctx, &wg, 16, []string{"http://" + pickHTTP + "/v1/pick"}, &flood)
	var legitX, legitH probes
	stop := make(chan struct{})
	var probing sync.WaitGroup
	probing.Go(func() {
		hc := legitClient()
		for i := 0; ; i++ {
			body := fmt.Sprintf(`{"model":%q,"prompt":%s}`, model, idsJSON(checkPrompts[i%len(checkPrompts)]))
			t0 := time.Now()
			err := pickExtProc(ctx, xc, body)
			legitX.record(time.Since(t0), err)
			t0 = time.Now()
			err = pickHTTPOnce(hc, pickHTTP, body)
			legitH.record(time.Since(t0), err)
			select {
			case <-stop:
				return
			case <-time.After(probeEvery):
			}
		}
	})
	go func() {
		defer close(stop)
		time.Sleep(floodFor)
	}()
	tr.run(t, engines, 300)
	probing.Wait()
	inFlight := metricSum(t, "http://"+pickHTTP+"/metrics", "kvindex_picker_body_bytes_in_flight", "")
	busy := metricSum(t, "http://"+pickHTTP+"/metrics", "kvindex_picker_bad_requests_total", `reason="busy"`)
	cancel()
	wg.Wait()
	p.kill() // reads its peak RSS
	faultEnd := time.Now()
	tail(t, tr, engines)
	settle(t, k, faultEnd, engines, nil, 0)
	checkBound(t, p, floodHTTPBudget)
	note := fmt.Sprintf("picker: ext_proc picks: %s; HTTP picks: %s; flooding streams: %s; flooding /v1/pick: %s; %v refused as busy, %s of bodies held at the end",
		legitX.summary(), legitH.summary(), streams.String(), flood.String(), busy, mib(int64(inFlight)))
	amend(t, func(r *row) {
		r.rss = fmt.Sprintf("picker %s / %s (limit %s)", mib(p.peakRSS), mib(floodHTTPBudget), mib(memlimit.ProcessBound(floodHTTPBudget)))
		addNote(r, note)
	})
	t.Log(note)
	legitX.failed(t, "ext_proc picks")
	legitH.failed(t, "HTTP picks")
}

// endlessStream opens an ext_proc stream and sends request body frames
// without end: without pause, or, with hold, 1 MiB and then nothing until
// ctx ends. It returns how the stream ended: the picker's immediate
// status, or "ended".
func endlessStream(ctx context.Context, xc extprocv3.ExternalProcessorClient, hold bool) string {
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	st, err := xc.Process(sctx)
	if err != nil {
		return "error"
	}
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/completions")}}}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm}}}); err != nil {
		return "error"
	}
	answered := make(chan string, 1)
	go func() {
		resp, err := st.Recv()
		switch {
		case err != nil:
			answered <- "ended"
		case resp.GetImmediateResponse() != nil:
			answered <- strconv.Itoa(int(resp.GetImmediateResponse().GetStatus().GetCode()))
		default:
			answered <- "other"
		}
	}()
	frame := floodPattern
	for sent := 0; ; sent += len(frame) {
		if hold && sent >= 1<<20 {
			select {
			case a := <-answered:
				return a
			case <-ctx.Done():
				return "held"
			}
		}
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: frame}}}); err != nil {
			if errors.Is(err, io.EOF) {
				select {
				case a := <-answered:
					return a
				case <-ctx.Done():
					return "ended"
				}
			}
			return "error"
		}
		select {
		case a := <-answered:
			return a
		default:
		}
	}
}

// pickExtProc sends one small request over ext_proc and wants it routed.
func pickExtProc(ctx context.Context, xc extprocv3.ExternalProcessorClient, body string) error {
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	defer scancel()
	st, err := xc.Process(sctx)
	if err != nil {
		return err
	}
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/completions")}}}
	for _, r := range []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}},
	} {
		if err := st.Send(r); err != nil {
			return err
		}
	}
	resp, err := st.Recv()
	if err != nil {
		return err
	}
	if im := resp.GetImmediateResponse(); im != nil {
		return fmt.Errorf("ext_proc: status %d: %s", im.GetStatus().GetCode(), im.GetBody())
	}
	for _, h := range resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == gateway.HeaderDestination && len(h.GetHeader().GetRawValue()) > 0 {
			return nil
		}
	}
	return fmt.Errorf("ext_proc: no destination in %v", resp)
}

// pickHTTPOnce POSTs body to /v1/pick and wants it routed.
func pickHTTPOnce(hc *http.Client, addr, body string) error {
	resp, err := hc.Post("http://"+addr+"/v1/pick", "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(gateway.HeaderDestination) == "" {
		return fmt.Errorf("/v1/pick: status %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	return nil
}

func idsJSON(ids []uint64) string {
	b, _ := json.Marshal(ids)
	return string(b)
}
