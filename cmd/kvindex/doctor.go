package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/internal/doctor"
)

func newDoctorCmd() *cobra.Command {
	var (
		cf     clientFlags
		pods   podFilter
		seeds  []string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check a running kvindex end to end and print each problem with its fix",
		Long: `doctor asks a running kvindex about every engine it follows and prints what
keeps it from vouching for them, each with its fix: engines not ok
(disconnected, degraded, restored, unconfirmed, partial), failing replays,
undecodable events, a local tokenizer that disagrees with the engine's, a
skewed clock, hash mismatches. For an engine whose hashes kvindex cannot
recompute it searches the configuration that reproduces the engine's recent
events and prints the kvindex serve flags and the engine settings that align
the two, or says that the engine seeds its hashes randomly. Reading the
engines' events needs the admin scope. The search tries:
` + doctor.GridHelp() + `

With --json it prints {"server":..,"engines":N,"healthy":false,"findings":[
{"kind":"hash_mismatch","engine":"pod-a","problem":..,"fix":..,"hash":{..}}]}.
Exit status: 0 when healthy, 1 with findings, 2 on a usage error.`,
		Example: `  kvindex doctor --server kvindex:50051 --token-file admin.token
  kvindex doctor --pod pod-a --seed 1234 --json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := pods.validate(); err != nil {
				return err
			}
			var in doctor.Input
			if err := cf.call(cmd.Context(), func(ctx context.Context, c *client.Client) (err error) {
				in, err = doctor.Collect(ctx, c, seeds, pods)
				return err
			}); err != nil {
				return err
			}
			r := doctor.Build(in)
			var err error
			if asJSON {
				err = r.WriteJSON(cmd.OutOrStdout())
			} else {
				err = r.WriteText(cmd.OutOrStdout())
			}
			if err == nil && !r.Healthy {
				err = fmt.Errorf("%d findings", len(r.Findings))
			}
			return err
		},
	}
	cf.register(cmd.Flags())
	pods.register(cmd.Flags(), "only this pod's engines; repeatable (default: every pod)")
	cmd.Flags().StringArrayVar(&seeds, "seed", nil, "another PYTHONHASHSEED value the engines may run with, tried in the search; repeatable")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
