package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/picker/gateway"
)

// kvindex serve --picker routes over its own index: a prompt an engine
// stored goes to that engine's endpoint through POST /v1/pick on serve's
// HTTP address, the ext_proc server answers its health checks, and the
// picker's metrics are on serve's /metrics.
func TestServePicker(t *testing.T) {
	t.Parallel() // its own service and engines on free ports
	pods := []string{"pod-a", "pod-b", "pod-c"}
	var extra []string
	for i, p := range pods {
		extra = append(extra, "--endpoint", fmt.Sprintf("%s=10.0.0.%d:8000", p, i+1))
	}
	x := startE2E(t, pods, append(extra, "--picker", "--extproc-addr", "127.0.0.1:0")...)
	toks := testutil.Seq(5000, 8*e2eBlockSize)
	if _, err := x.engines["pod-b"].Process(toks, nil); err != nil {
		t.Fatal(err)
	}
	x.awaitMatched(toks, map[string]uint32{"pod-a": 0, "pod-b": 8, "pod-c": 0})

	body := fmt.Sprintf(`{"model":%q,"prompt":[%s]}`, e2eModel, idsArg(toks))
	resp, err := http.Post("http://"+x.svc.HTTPAddr()+"/v1/pick", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/v1/pick: %d %s", resp.StatusCode, raw)
	}
	var d struct {
		Endpoint, Pod string
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	if d.Pod != "pod-b" || d.Endpoint != "10.0.0.2:8000" || resp.Header.Get(gateway.HeaderDestination) != d.Endpoint {
		t.Errorf("picked %s=%s (header %q); pod-b=10.0.0.2:8000 holds the prompt", d.Pod, d.Endpoint, resp.Header.Get(gateway.HeaderDestination))
	}

	conn, err := grpc.NewClient(x.svc.PickerAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hr, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: "readiness"})
	if err != nil || hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("ext_proc health: %v %v", hr, err)
	}

	// serve's own API is still there, and the picker's metrics with it.
	resp, err = http.Get("http://" + x.svc.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(raw), `kvindex_picker_picks_total{result="ok"} 1`) || !strings.Contains(string(raw), "kvindex_index_") {
		t.Errorf("/metrics lacks the picker's or the index's metrics")
	}
}

func TestServePickerFlags(t *testing.T) {
	base := []string{"--engine", "a=tcp://127.0.0.1:5557", "--model", "m"}
	for _, tt := range []struct {
		name string
		args []string
		want string // "" for valid
	}{
		{"no picker", nil, ""},
		{"picker", []string{"--picker", "--endpoint", "a=10.0.0.1:8000"}, ""},
		{"picker without endpoints", []string{"--picker"}, "--endpoint"},
		{"endpoints without picker", []string{"--endpoint", "a=10.0.0.1:8000"}, "needs --picker"},
		{"bad endpoint", []string{"--picker", "--endpoint", "a"}, "POD=HOST:PORT"},
		{"empty extproc address", []string{"--picker", "--endpoint", "a=10.0.0.1:8000", "--extproc-addr", ""}, "--extproc-addr"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o, _, err := parseServe(t, append(base, tt.args...)...)
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if (o.Picker != nil) != strings.Contains(strings.Join(tt.args, " "), "--picker") {
					t.Errorf("picker options %+v", o.Picker)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want one naming %q", err, tt.want)
			}
		})
	}
}

// With --auth-tokens, serve --picker's /v1/pick takes the callers its
// queries take: the query scope.
func TestServePickerAuth(t *testing.T) {
	t.Parallel() // its own service and engines on free ports
	p := newPKI(t)
	auth := writeAuthFile(t, p.dir, "")
	x := startE2EDial(t,
		[]grpc.DialOption{dialTLS(t, client.TLSConfig{CAFile: p.ca.CertFile}), client.WithToken("query-secret")},
		[]string{"pod-a"},
		"--tls-cert", p.server.CertFile, "--tls-key", p.server.KeyFile, "--auth-tokens", auth,
		"--picker", "--extproc-addr", "127.0.0.1:0", "--endpoint", "pod-a=10.0.0.1:8000")
	pem, err := os.ReadFile(p.ca.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	for _, tc := range []struct {
		name, token string
		want        int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"watch token", "watch-secret", http.StatusForbidden},
		{"query token", "query-secret", http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, "https://"+x.svc.HTTPAddr()+"/v1/pick",
				strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":[1,2,3]}`, e2eModel)))
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("/v1/pick: %d %s, want %d", resp.StatusCode, raw, tc.want)
			}
		})
	}
}
