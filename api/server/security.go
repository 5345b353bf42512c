package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/api/server/security"
)

// securityMetrics count what the security layer did: file reloads and
// refused callers.
type securityMetrics struct {
	reloads *prometheus.CounterVec
	refused *prometheus.CounterVec
}

// setupSecurity loads the certificate (and auth) files of
// Config.Security, to be reloaded when they change, and registers the
// security metrics.
func (s *Server) setupSecurity() error {
	sec := &s.cfg.Security
	if err := sec.Check(); err != nil {
		return err
	}
	if sec.ReloadCheck <= 0 {
		sec.ReloadCheck = security.DefaultReloadCheck
	}
	s.sec = securityMetrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_config_reloads_total",
			Help: "Reloads of changed certificate (tls) and auth (auth) files, by result (ok; error: the loaded version was kept).",
		}, []string{"file", "result"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_auth_refused_total",
			Help: "Requests refused by authorization, by reason (no_credentials, bad_token, unknown_identity, scope, tenant) and endpoint.",
		}, []string{"reason", "endpoint"}),
	}
	for _, c := range []prometheus.Collector{s.sec.reloads, s.sec.refused} {
		if err := s.cfg.Registry.Register(c); err != nil {
			return err
		}
	}
	var err error
	if s.certs, err = s.newCertReloader(*sec); err != nil {
		return err
	}
	switch {
	case sec.AuthFile != "":
		s.authMode = authFile
		s.auth, err = security.NewReloader("auth", []string{sec.AuthFile}, sec.ReloadCheck, s.now, s.log, s.sec.reloaded("auth"), func() (*security.Policy, error) {
			p, err := security.LoadPolicy(sec.AuthFile)
			if err == nil {
				s.log.Info("auth file loaded", "file", sec.AuthFile, "tokens", p.Tokens(), "identities", p.Identities())
			}
			return p, err
		})
	case sec.ClientCAFile != "":
		s.authMode = authCertOnly
	}
	return err
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
