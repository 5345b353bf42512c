package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/kvindex/kvindex/internal/demo"
	"github.com/spf13/cobra"
)

func newDemoCmd() *cobra.Command {
	var (
		cfg     = demo.Defaults()
		jsonOut bool
		outDir  string
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Compare routers on a simulated agent fleet: the fleet-wide cached-prefix fraction and the latency it buys",
		Long:  demo.Help(),
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.ValidateGiven(cmd.Flags().Changed); err != nil {
				return configUsage(err, flagNames(cmd.Flags()))
			}
			if outDir != "" {
				// Before the simulation, not after it.
				if err := checkWritableDir(outDir); err != nil {
					return err
				}
			}
			stderr := cmd.ErrOrStderr()
			bar := demo.NewProgressBar(stderr, !jsonOut && demo.IsTerminal(stderr))
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			start := time.Now()
			rep, err := demo.Run(ctx, demo.Options{Config: cfg, Progress: bar.Update})
			bar.Finish()
			if err != nil {
				return configUsage(err, flagNames(cmd.Flags()))
			}
			out := cmd.OutOrStdout()
			if outDir != "" {
				if err := writeCharts(outDir, rep); err != nil {
					return err
				}
			}
			if jsonOut {
				return demo.WriteJSON(out, rep)
			}
			if err := demo.WriteTable(out, rep); err != nil {
				return err
			}
			fmt.Fprintf(out, "(%d router runs in %.1fs)\n", len(rep.Routers)+len(rep.Extra), time.Since(start).Seconds())
			if outDir != "" {
				fmt.Fprintf(out, "wrote %s and %s\n", filepath.Join(outDir, "demo.svg"), filepath.Join(outDir, "demo.html"))
			}
			return nil
		},
	}
	// The run's settings, their defaults, help and limits come from
	// demo.Config; only the output flags are the command's own.
	settings := flag.NewFlagSet("demo", flag.ContinueOnError)
	cfg.RegisterFlags(settings)
	fs := cmd.Flags()
	fs.AddGoFlagSet(settings)
	fs.BoolVar(&jsonOut, "json", false, "print the results as JSON (no progress bar)")
	fs.StringVar(&outDir, "out", "", "directory to write demo.svg and demo.html to")
	return cmd
}

func writeCharts(dir string, rep *demo.Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, write := range map[string]func(io.Writer, *demo.Report) error{"demo.svg": demo.WriteSVG, "demo.html": demo.WriteHTML} {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		err = write(f, rep)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("writing %s: %w", name, err)
		}
	}
	return nil
}

// checkWritableDir creates dir if needed and checks that a file can be
// written in it.
func checkWritableDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("--out %s: cannot create the directory: %w", dir, pathCause(err))
	}
	f, err := os.CreateTemp(dir, ".kvindex-demo-*")
	if err != nil {
		return fmt.Errorf("--out %s: cannot write there: %w", dir, pathCause(err))
	}
	f.Close()
	return os.Remove(f.Name())
}

// pathCause drops the operation and path of a *fs.PathError, which the
// message names already.
func pathCause(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
