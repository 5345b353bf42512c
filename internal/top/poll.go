package top

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
)

// PodLister is the ListPods call of kvindex's API (client.Client.Index).
type PodLister interface {
	ListPods(ctx context.Context, in *kvindexv1.ListPodsRequest, opts ...grpc.CallOption) (*kvindexv1.ListPodsResponse, error)
}

// maxPage bounds a /metrics page read: serve's with every engine's series
// is far smaller.
const maxPage = 32 << 20

// Poller reads a Sample: ListPods and the metrics pages, at once.
type Poller struct {
	Pods PodLister
	// CallError turns a failed ListPods into the line shown (nil: the
	// error as it is).
	CallError func(error) error
	// Serve is serve's /metrics URL ("": not read); Pickers are the
	// pickers'.
	Serve   string
	Pickers []string
	// HTTP reads the pages; TokenFile, if set, holds the bearer token
	// sent with them (a kvindex with --auth-tokens wants the metrics
	// scope).
	HTTP      *http.Client
	TokenFile string
	// Timeout bounds each read.
	Timeout time.Duration
	// Now is the clock (time.Now if nil).
	Now func() time.Time
}

// Poll reads every source, each within the Timeout; what fails is
// recorded in the Sample, never returned.
func (p *Poller) Poll(ctx context.Context) *Sample {
	s := &Sample{Pickers: make([]PickerSample, len(p.Pickers))}
	var wg sync.WaitGroup
	wg.Go(func() {
		ctx, cancel := context.WithTimeout(ctx, p.Timeout)
		defer cancel()
		r, err := p.Pods.ListPods(ctx, &kvindexv1.ListPodsRequest{})
		if err != nil {
			if p.CallError != nil {
				err = p.CallError(err)
			}
			s.PodsErr = err.Error()
			return
		}
		pods := client.PodsJSONOf(r, p.now())
		s.Pods = &pods
	})
	if p.Serve != "" {
		wg.Go(func() { s.Serve, s.ServeErr = p.scrape(ctx, p.Serve) })
	}
	for i, u := range p.Pickers {
		wg.Go(func() {
			s.Pickers[i].URL = u
			s.Pickers[i].Metrics, s.Pickers[i].Err = p.scrape(ctx, u)
		})
	}
	wg.Wait()
	s.At = p.now()
	return s
}

func (p *Poller) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

// scrape reads and parses one metrics page; the error is the line shown.
func (p *Poller) scrape(ctx context.Context, u string) (Metrics, string) {
	ctx, cancel := context.WithTimeout(ctx, p.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err.Error()
	}
	if p.TokenFile != "" {
		tok, err := os.ReadFile(p.TokenFile)
		if err != nil {
			return nil, err.Error()
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	}
	hc := p.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, resp.Status
	}
	m, err := ParseMetrics(io.LimitReader(resp.Body, maxPage))
	if err != nil {
		return nil, err.Error()
	}
	return m, ""
}

// HTTPClient reads metrics pages, over TLS with tc for https URLs (nil:
// the system's roots).
func HTTPClient(tc *tls.Config) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tc
	return &http.Client{Transport: tr}
}

// MetricsURL makes a metrics page's URL of what a flag gave: a URL as
// is, "/metrics" added when it has no path; HOST:PORT as http://HOST:PORT/metrics.
func MetricsURL(s string) (string, error) {
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("%q is not an http(s) URL or HOST:PORT", s)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/metrics"
	}
	return u.String(), nil
}

// Pages checks the metrics pages to read, serve's and the pickers', as
// MetricsURL makes them.
func Pages(serve string, pickers []string) (string, []string, error) {
	s, err := MetricsURL(serve)
	if err != nil {
		return "", nil, fmt.Errorf("--metrics: %w", err)
	}
	var ps []string
	for _, p := range pickers {
		u, err := MetricsURL(p)
		if err != nil {
			return "", nil, fmt.Errorf("--picker: %w", err)
		}
		ps = append(ps, u)
	}
	return s, ps, nil
}

// DefaultServeMetrics is serve's metrics URL when only its gRPC address
// (target, HOST:PORT) is known: the same host on the port of serve's
// default HTTP address (httpAddr, [HOST]:PORT), over https when the gRPC
// API is spoken over TLS (serve's HTTP listener then is too).
func DefaultServeMetrics(target, httpAddr string, useTLS bool) string {
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		host = target
	}
	_, httpPort, err := net.SplitHostPort(httpAddr)
	if err != nil {
		httpPort = httpAddr
	}
	scheme := "http"
	if useTLS {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(host, httpPort) + "/metrics"
}
