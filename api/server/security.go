package server

import (
	"github.com/prometheus/client_golang/prometheus"
)

// securityMetrics count what the security layer did: file reloads and
// refused callers.
type securityMetrics struct {
	reloads *prometheus.CounterVec
}

// setupSecurity loads the certificate (and auth) files of
// Config.Security and registers the security metrics.
func (s *Server) setupSecurity() error {
	sec := &s.cfg.Security
	if err := sec.Check(); err != nil {
		return err
	}
	if sec.ReloadCheck <= 0 {
		sec.ReloadCheck = DefaultReloadCheck
	}
	s.sec = securityMetrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_config_reloads_total",
			Help: "Reloads of changed certificate (tls) and auth (auth) files, by result (ok; error: the loaded version was kept).",
		}, []string{"file", "result"}),
	}
	for _, c := range []prometheus.Collector{s.sec.reloads} {
		if err := s.cfg.Registry.Register(c); err != nil {
			return err
		}
	}
	var err error
	if s.certs, err = s.newCertReloader(*sec); err != nil {
		return err
	}
	return nil
}

// reloaded returns the function counting reloads of file.
func (m *securityMetrics) reloaded(file string) func(ok bool) {
	okc, errc := m.reloads.WithLabelValues(file, "ok"), m.reloads.WithLabelValues(file, "error")
	return func(ok bool) {
		if ok {
			okc.Inc()
		} else {
			errc.Inc()
		}
	}
}
