package main

import (
	"strings"

	"github.com/kvindex/kvindex/internal/service"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// allowRules parses --engine-allow and checks it against the bind-mode
// flags it needs: a tcp --listen endpoint (only tcp connections have a
// source address) and a --replay-template that dials the engine's source
// address, so no topic chooses where kvindex connects.
func (f *serveFlags) allowRules() ([]zmqtransport.AllowRule, error) {
	if len(f.engineAllow) == 0 {
		return nil, nil
	}
	if f.listen == "" {
		return nil, usagef("--engine-allow applies to bind mode (--listen) only; in connect mode kvindex chooses the address it reads each engine from")
	}
	if ep := zmqtransport.TCPEndpoint(f.listen); !strings.HasPrefix(ep, "tcp://") {
		return nil, usagef("--engine-allow needs a tcp --listen endpoint, not %q: only tcp connections have a source address", f.listen)
	}
	rules := make([]zmqtransport.AllowRule, 0, len(f.engineAllow))
	seen := map[zmqtransport.AllowRule]string{}
	for _, s := range f.engineAllow {
		r, err := zmqtransport.ParseAllowRule(s)
		if err != nil {
			return nil, usagef("--engine-allow %q: %v", s, err)
		}
		if first, ok := seen[r]; ok {
			return nil, usagef("--engine-allow %q: the same rule as %q, given before", s, first)
		}
		seen[r] = s
		rules = append(rules, r)
	}
	if f.replayTemplate != "" {
		if err := zmqtransport.CheckSourceReplayTemplate(f.replayTemplate); err != nil {
			return nil, usagef("--replay-template %q: %s", f.replayTemplate, service.EndpointReason(err))
		}
	}
	return rules, nil
}
