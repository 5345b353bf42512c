package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/kvindex/kvindex/api/server"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/picker/gateway"
)

// pickBound is the body bound of the size tests: small enough that a
// prompt of a few hundred ids passes it.
const pickBound = 4096

// decision is /v1/pick's answer as a gateway reads it: the documented
// field names, decoded without the picker's own types.
type decision struct {
	Endpoint string `json:"endpoint"`
	Pod      string `json:"pod"`
	Scores   []struct {
		Pod    string   `json:"pod"`
		Prefix *float64 `json:"prefix"`
		Load   *float64 `json:"load"`
		Total  *float64 `json:"total"`
	} `json:"scores"`
	Fallback string `json:"fallback"`
	Error    string `json:"error"`
}

func postPick(t *testing.T, url, body string, hdr map[string]string) (int, http.Header, decision) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/pick", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var d decision
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("answer %d is not JSON: %v: %q", resp.StatusCode, err, raw)
	}
	checkPickAnswer(t, resp.StatusCode, raw)
	return resp.StatusCode, resp.Header, d
}

// pickDoc is what the OpenAPI document says of /v1/pick's answers: the
// Decision and Error schemas and the statuses it lists.
type pickDoc struct {
	ok, refused *jsonschema.Schema
	statuses    map[string]any
}

var pickDocument = sync.OnceValues(func() (*pickDoc, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(server.OpenAPIDocument()))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("openapi.json", doc); err != nil {
		return nil, err
	}
	var d pickDoc
	if d.ok, err = c.Compile("openapi.json#/components/schemas/Decision"); err != nil {
		return nil, err
	}
	if d.refused, err = c.Compile("openapi.json#/components/schemas/Error"); err != nil {
		return nil, err
	}
	d.statuses = doc.(map[string]any)["paths"].(map[string]any)["/v1/pick"].(map[string]any)["post"].(map[string]any)["responses"].(map[string]any)
	return &d, nil
})

// checkPickAnswer holds a /v1/pick answer to the OpenAPI document: a
// status it lists, with a Decision for 200 and an Error otherwise.
func checkPickAnswer(t *testing.T, code int, raw []byte) {
	t.Helper()
	d, err := pickDocument()
	if err != nil {
		t.Fatal(err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	schema := d.refused
	if code == http.StatusOK {
		schema = d.ok
	}
	if err := schema.Validate(v); err != nil {
		t.Errorf("/v1/pick answered %d with what the OpenAPI document does not describe: %v\n%s", code, err, raw)
	}
	if _, ok := d.statuses[strconv.Itoa(code)]; !ok {
		t.Errorf("/v1/pick answered %d, a status the OpenAPI document does not list for it", code)
	}
}

// POST /v1/pick over loopback HTTP: the decision's JSON and header for a
// prompt the index places, and each refusal with its status.
func TestHTTPPick(t *testing.T) {
	f := newFleet(t, "pod-a", "pod-b", "pod-c")
	svc, _ := newService(t, f, remote(t, f.indexAddr), func(c *gateway.Config) { c.MaxBody = pickBound })
	hs := httptest.NewServer(svc.Handler())
	t.Cleanup(hs.Close)

	// Place a prompt on the pod /v1/pick chooses, as a gateway would.
	held := testutil.Seq(300, 8*bs)
	code, hdr, d := postPick(t, hs.URL, idsBody(held), nil)
	if code != http.StatusOK {
		t.Fatalf("first pick: %d %s", code, d.Error)
	}
	resp, err := http.Post("http://"+hdr.Get(gateway.HeaderDestination)+"/v1/completions", "application/json", strings.NewReader(idsBody(held)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	holder := d.Pod
	testutil.Await(t, waitFor, "the index to hear the prompt", func() bool { return f.held(t, holder, held) == 8 })

	for _, tt := range []struct {
		name    string
		body    string
		hdr     map[string]string
		want    int
		wantPod string // for 200
		// fallback is the reason in the JSON and the header for 200, a
		// word of the error otherwise.
		fallback string
	}{
		{"held prompt goes to its holder", idsBody(held), nil, http.StatusOK, holder, ""},
		// This kvindex has no tokenizer: routed by load, and said so.
		{"chat request", `{"model":"qwen","messages":[{"role":"user","content":"hi"}]}`, nil, http.StatusOK, "", "tokenizer"},
		{"subset of one", idsBody(held), map[string]string{gateway.SubsetKey: f.endpoints[2].Addr}, http.StatusOK, f.endpoints[2].Pod, ""},
		{"not JSON", `{"prompt`, nil, http.StatusBadRequest, "", ""},
		{"no prompt", `{"model":"qwen"}`, nil, http.StatusBadRequest, "", ""},
		{"unknown model", `{"model":"qwne","prompt":[1,2,3]}`, nil, http.StatusNotFound, "", `unknown model "qwne"`},
		{"over the body bound", idsBody(testutil.Seq(1, pickBound)), nil, http.StatusRequestEntityTooLarge, "", ""},
		{"subset of unknown endpoints", idsBody(held), map[string]string{gateway.SubsetKey: "10.9.9.9:1, 10.9.9.8:1"}, http.StatusServiceUnavailable, "", ""},
		{"empty subset", idsBody(held), map[string]string{gateway.SubsetKey: " "}, http.StatusServiceUnavailable, "", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, hdr, d := postPick(t, hs.URL, tt.body, tt.hdr)
			if code != tt.want {
				t.Fatalf("status %d (%s), want %d", code, d.Error, tt.want)
			}
			if code != http.StatusOK {
				if d.Error == "" || hdr.Get(gateway.HeaderDestination) != "" || !strings.Contains(d.Error, tt.fallback) {
					t.Errorf("refusal: error %q, destination header %q", d.Error, hdr.Get(gateway.HeaderDestination))
				}
				return
			}
			if d.Fallback != tt.fallback || hdr.Get(gateway.HeaderFallback) != tt.fallback {
				t.Errorf("fallback %q, header %q, want %q", d.Fallback, hdr.Get(gateway.HeaderFallback), tt.fallback)
			}
			if got := hdr.Get(gateway.HeaderDestination); got != d.Endpoint || f.podOf[got] != d.Pod {
				t.Errorf("header %q, decision %s=%s: they disagree", got, d.Pod, d.Endpoint)
			}
			if tt.wantPod != "" && d.Pod != tt.wantPod {
				t.Errorf("picked %s, want %s", d.Pod, tt.wantPod)
			}
			if len(d.Scores) == 0 {
				t.Fatal("no scores")
			}
			for _, s := range d.Scores {
				if s.Pod == "" || s.Prefix == nil || s.Load == nil || s.Total == nil {
					t.Errorf("score without pod, prefix, load or total: %+v", s)
				}
				if tt.name == "held prompt goes to its holder" && s.Pod == holder && *s.Prefix <= 0 {
					t.Errorf("the holder's prefix score is %v", *s.Prefix)
				}
			}
		})
	}
}

// The ext_proc front refuses a body past the bound with an immediate
// 413, however it is framed, and routes one at the bound.
func TestExtProcBodyBound(t *testing.T) {
	f := newFleet(t, "pod-a")
	svc, reg := newService(t, f, gateway.Local{Server: f.srv}, func(c *gateway.Config) { c.MaxBody = pickBound })
	xc, _ := startPicker(t, svc)
	// atBound is a valid body of exactly pickBound bytes.
	atBound := idsBody(testutil.Seq(1, 10))
	atBound = atBound[:len(atBound)-1] + `,"user":"` + strings.Repeat("x", pickBound-len(atBound)-10) + `"}`
	if len(atBound) != pickBound {
		t.Fatalf("body of %d bytes, want %d", len(atBound), pickBound)
	}
	over := idsBody(testutil.Seq(1, pickBound))
	tooLarge := 0
	for _, tt := range []struct {
		name  string
		body  string
		frame int
		want  int // 0: routed
	}{
		{"at the bound", atBound, 1000, 0},
		{"over, one frame", over, len(over), http.StatusRequestEntityTooLarge},
		{"over, small frames", over, 512, http.StatusRequestEntityTooLarge},
		{"one byte over", atBound[:len(atBound)-2] + `x"}`, 4096, http.StatusRequestEntityTooLarge},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := send(t, xc, "/v1/completions", nil, nil, tt.body, tt.frame)
			if e.status != tt.want {
				t.Fatalf("status %d (%s), want %d", e.status, e.body, tt.want)
			}
			if tt.want == 0 {
				if e.dest == "" {
					t.Fatal("not routed")
				}
				e.finish(t, nil)
				return
			}
			tooLarge++
			if n := mustVec(t, reg, "kvindex_picker_bad_requests_total", "too_large"); n != float64(tooLarge) {
				t.Errorf("too_large refusals counted %v, want %d", n, tooLarge)
			}
		})
	}
}

// The bodies buffered at once are bounded across ext_proc streams and
// /v1/pick: while one stream holds most of the bound with a body that
// keeps coming, another request's body is refused as busy (429), and
// once the first is done the same request passes.
func TestBodiesInFlightBound(t *testing.T) {
	f := newFleet(t, "pod-a")
	svc, reg := newService(t, f, gateway.Local{Server: f.srv}, func(c *gateway.Config) {
		c.MaxBody, c.MaxBodyInFlight = pickBound, pickBound+pickBound/2
	})
	xc, _ := startPicker(t, svc)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held, err := xc.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/completions")}}}
	for _, r := range []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(`{"prompt":[` + strings.Repeat(" ", pickBound-100))}}},
	} {
		if err := held.Send(r); err != nil {
			t.Fatal(err)
		}
	}
	gaugeOf := func() float64 {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == "kvindex_picker_body_bytes_in_flight" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return -1
	}
	testutil.Await(t, waitFor, "the held stream's body buffered", func() bool { return gaugeOf() >= pickBound-100 })
	body := idsBody(testutil.Seq(1, 600)) // about 3 KiB: with the held 4 KiB, past the bound
	if e := send(t, xc, "/v1/completions", nil, nil, body, 512); e.status != http.StatusTooManyRequests {
		t.Fatalf("ext_proc while the bound is held: status %d (%s), want 429", e.status, e.body)
	}
	hs := httptest.NewServer(svc.Handler())
	t.Cleanup(hs.Close)
	resp, err := http.Post(hs.URL+"/v1/pick", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("/v1/pick while the bound is held: %d, want 429", resp.StatusCode)
	}
	if n := mustVec(t, reg, "kvindex_picker_bad_requests_total", "busy"); n != 2 {
		t.Errorf("busy refusals counted %v, want 2", n)
	}
	// A body announced small passes on the reserve (a quarter of the
	// bound, for bodies of up to 1/16 of it: 96 bytes here), over HTTP
	// and over ext_proc in one frame.
	tiny := `{"model":"qwen","prompt":[1,2,3]}`
	if resp, err = http.Post(hs.URL+"/v1/pick", "application/json", strings.NewReader(tiny)); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/v1/pick of a small body while the bound is held: %d, want 200", resp.StatusCode)
	}
	if e := send(t, xc, "/v1/completions", nil, nil, tiny, len(tiny)); e.status != 0 || e.dest == "" {
		t.Fatalf("ext_proc of a small body while the bound is held: status %d (%s), want routed", e.status, e.body)
	}
	cancel() // the held stream ends: its bytes go back
	testutil.Await(t, waitFor, "the held bytes released", func() bool { return gaugeOf() == 0 })
	if e := send(t, xc, "/v1/completions", nil, nil, body, 512); e.status != 0 || e.dest == "" {
		t.Fatalf("ext_proc once the bound is free: status %d (%s), want routed", e.status, e.body)
	}
}

// A /v1/pick body not sent within the HTTP server's read deadline is
// counted (read_timeout) and its buffered bytes go back.
func TestPickBodyReadTimeout(t *testing.T) {
	f := newFleet(t, "pod-a")
	svc, reg := newService(t, f, gateway.Local{Server: f.srv}, nil)
	hs := httptest.NewUnstartedServer(svc.Handler())
	hs.Config.ReadTimeout = 100 * time.Millisecond
	hs.Start()
	t.Cleanup(hs.Close)
	c, err := net.Dial("tcp", hs.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("POST /v1/pick HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"prompt\":")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("the server did not close the connection: %v", err)
	}
	testutil.Await(t, waitFor, "the timeout counted", func() bool {
		return mustVec(t, reg, "kvindex_picker_bad_requests_total", "read_timeout") == 1
	})
}

// /v1/pick reads bodies in body turns, as ext_proc does: clients that
// stall mid-body give their turns back, so the request behind them is
// answered; when their bodies come they are answered too, and every
// request's turn is in kvindex_picker_queue_seconds{turn="body"}.
func TestPickStalledBodiesHoldNoSlot(t *testing.T) {
	f := newFleet(t, "pod-a", "pod-b")
	svc, reg := newService(t, f, gateway.Local{Server: f.srv}, nil)
	hs := httptest.NewServer(svc.Handler())
	t.Cleanup(hs.Close)
	body := idsBody(testutil.Seq(1, 4*bs))
	var stalled []net.Conn
	for range 2*runtime.GOMAXPROCS(0) + 1 {
		c, err := net.Dial("tcp", hs.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		head := "POST /v1/pick HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n"
		if _, err := c.Write([]byte(head + body[:10])); err != nil {
			t.Fatal(err)
		}
		stalled = append(stalled, c)
	}
	bodyTurns := func() uint64 {
		return metricOf(t, reg, "kvindex_picker_queue_seconds", "body").GetHistogram().GetSampleCount()
	}
	// Each stalled request's handler has read its first bytes, in a turn.
	testutil.Await(t, waitFor, "the stalled requests' first reads", func() bool { return bodyTurns() >= uint64(len(stalled)) })
	done := make(chan int, 1)
	go func() {
		resp, err := http.Post(hs.URL+"/v1/pick", "application/json", strings.NewReader(body))
		if err != nil {
			done <- -1
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	select {
	case code := <-done:
		if code != http.StatusOK {
			t.Fatalf("the request behind the stalled ones: %d", code)
		}
	case <-time.After(waitFor):
		t.Fatalf("a request waited %v behind %d stalled bodies", waitFor, len(stalled))
	}
	for i, c := range stalled {
		if _, err := c.Write([]byte(body[10:])); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(waitFor))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("stalled request %d: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stalled request %d: %d", i, resp.StatusCode)
		}
	}
	// Every request's turns are in the histogram (TestBodySlotTurns times
	// the waits, which depend here on how the handlers interleaved).
	if n := metricOf(t, reg, "kvindex_picker_queue_seconds", "body").GetHistogram().GetSampleCount(); n < uint64(len(stalled)+1) {
		t.Errorf("body turns: %d; want at least one per request, %d", n, len(stalled)+1)
	}
}
