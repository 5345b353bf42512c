package top

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A metrics page is read with the bearer token of the token file, read
// again at each scrape; what goes wrong is the line shown, not a panic.
func TestScrape(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer s3cret" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		w.Write([]byte("# TYPE kvindex_picker_picks_total counter\nkvindex_picker_picks_total{result=\"ok\"} 7\n"))
	})
	mux.HandleFunc("/html", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("<html>{</html>")) })
	srv := httptest.NewServer(mux)
	defer srv.Close()

	p := &Poller{TokenFile: tokenFile, Timeout: time.Minute}
	m, errLine := p.scrape(context.Background(), srv.URL+"/metrics")
	if errLine != "" {
		t.Fatal(errLine)
	}
	if v, ok := m.Sum(metricPicks, nil); !ok || v != 7 {
		t.Errorf("picks = %v, %v; want 7", v, ok)
	}
	for _, tc := range []struct {
		name, url, tokenFile, want string
	}{
		{"no token", srv.URL + "/metrics", "", "401"},
		{"missing token file", srv.URL + "/metrics", filepath.Join(t.TempDir(), "none"), "no such file"},
		{"not found", srv.URL + "/nothing", "", "404"},
		{"not metrics", srv.URL + "/html", "", "parsing metrics"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Poller{TokenFile: tc.tokenFile, Timeout: time.Minute}
			m, errLine := p.scrape(context.Background(), tc.url)
			if m != nil || !strings.Contains(errLine, tc.want) {
				t.Errorf("scrape = %v, %q; want an error with %q", m, errLine, tc.want)
			}
		})
	}
}
