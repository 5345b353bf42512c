package main

import (
	"cmp"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/internal/service"
	"github.com/kvindex/kvindex/internal/top"
)

func newTopCmd() *cobra.Command {
	var (
		cf      clientFlags
		serve   string
		pickers []string
		every   time.Duration
		once    bool
	)
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Watch a running kvindex live: engines, event rates, cached fraction, picker fallbacks",
		Long: `top shows a running kvindex on one screen, redrawn every --interval: each
engine's health, blocks, events/s, gaps, replays, hash check and last event
(ListPods, serve's /metrics); the cached fraction as the engines, the picker's
responses and its predictions tell it; the picker's fallbacks by reason (the
/metrics of serve --picker or of each --picker). Rates take two scrapes, so
the first frame shows "-". q or Ctrl-C quits. When stdout is not a terminal,
or with --once, it prints one frame and exits (1 if kvindex was unreachable).`,
		Example: `  kvindex top
  kvindex top --server kvindex:50051 --metrics kvindex:8080 --picker picker:9090 --interval 2s`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if every <= 0 {
				return usagef("--interval must be positive, got %v", every)
			}
			addr, opts, err := cf.target()
			if err != nil {
				return err
			}
			_, useTLS, _ := client.ParseTarget(cf.server)
			p := &top.Poller{CallError: cf.callError, TokenFile: cf.sec.tokenFile, Timeout: cf.timeout}
			if p.Serve, p.Pickers, err = top.Pages(cmp.Or(serve, top.DefaultServeMetrics(addr, service.DefaultOptions().HTTPAddr, useTLS || cf.sec.tls())), pickers); err != nil {
				return usagef("%v", err)
			}
			tc, err := client.TLSConfig{CAFile: cf.sec.ca, CertFile: cf.sec.cert, KeyFile: cf.sec.key, ServerName: cf.sec.serverName}.Config()
			if err != nil {
				return usagef("%v", err)
			}
			c, err := client.New(addr, opts...)
			if err != nil {
				return err
			}
			defer c.Close()
			cf.addr, p.Pods, p.HTTP = addr, c.Index, top.HTTPClient(tc)
			return top.Run(cmd.Context(), p, top.Header{Server: cf.server, Interval: every}, once, cmd.InOrStdin(), cmd.OutOrStdout())
		},
	}
	cf.register(cmd.Flags())
	cmd.Flags().StringVar(&serve, "metrics", "", "serve's /metrics: URL or HOST:PORT (default: --server's host on serve's default HTTP port)")
	cmd.Flags().StringArrayVar(&pickers, "picker", nil, "a picker's /metrics (URL or HOST:PORT) for its cached fraction and fallbacks; repeatable")
	cmd.Flags().DurationVar(&every, "interval", top.DefaultInterval, "time between frames")
	cmd.Flags().BoolVar(&once, "once", false, "print one frame and exit (as when stdout is not a terminal)")
	return cmd
}
