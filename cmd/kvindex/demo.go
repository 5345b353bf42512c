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
	"strings"
	"sync"
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
			bar := newProgressBar(stderr, !jsonOut && isTerminal(stderr))
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			start := time.Now()
			rep, err := demo.Run(ctx, demo.Options{Config: cfg, Progress: bar.update})
			bar.finish()
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

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progressBar draws "[=====>    ] 45%" on one terminal line.
type progressBar struct {
	w    io.Writer
	on   bool
	mu   sync.Mutex
	last int // last percentage drawn
}

func newProgressBar(w io.Writer, on bool) *progressBar { return &progressBar{w: w, on: on, last: -1} }

func (p *progressBar) update(done, total int) {
	if !p.on || total <= 0 {
		return
	}
	pc := done * 100 / total
	p.mu.Lock()
	defer p.mu.Unlock()
	if pc == p.last {
		return
	}
	p.last = pc
	const width = 40
	fill := pc * width / 100
	bar := strings.Repeat("=", fill)
	if fill < width {
		bar += ">" + strings.Repeat(" ", width-fill-1)
	}
	fmt.Fprintf(p.w, "\r[%s] %3d%% simulating routers", bar, pc)
}

func (p *progressBar) finish() {
	if !p.on || p.last < 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprint(p.w, "\r"+strings.Repeat(" ", 70)+"\r")
}
