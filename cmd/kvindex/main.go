// Command kvindex tells an LLM router which replica already holds a
// request's prompt in its KV cache.
//
// It subscribes to the KV-cache events of every engine (vLLM, SGLang),
// keeps a block-hash -> holders index that mirrors the engines' own chained
// prefix-block hashing, and answers, for a prompt, how long a cached prefix
// each pod holds. Run "kvindex help" for the subcommands.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/internal/buildinfo"
	"github.com/kvindex/kvindex/internal/flagsource"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// Exit codes.
const (
	exitOK      = 0
	exitRuntime = 1 // the command ran and failed
	exitUsage   = 2 // bad flags, arguments or settings: nothing was done
)

// run executes the command line and returns the process exit code. An
// error is printed as one line on stderr; a usage error names the help
// command to run.
func run(args []string, stdout, stderr io.Writer) int {
	return runIn(args, os.Stdin, stdout, stderr)
}

// runIn is run with stdin as the input that "-" names (--tokens-file -,
// --messages-file -).
func runIn(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRootCmd()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteC()
	if err == nil {
		return exitOK
	}
	var ue usageError
	if errors.As(err, &ue) || isCobraUsageError(err) {
		if cmd == nil {
			cmd = root
		}
		fmt.Fprintf(stderr, "kvindex: %s (see '%s --help')\n", oneLine(err), cmd.CommandPath())
		return exitUsage
	}
	fmt.Fprintf(stderr, "kvindex: %s\n", oneLine(err))
	return exitRuntime
}

// isCobraUsageError recognises the errors cobra itself returns for an
// unknown subcommand; flag and argument errors are wrapped as usageError
// where they arise (SetFlagErrorFunc, noArgs).
func isCobraUsageError(err error) bool {
	return strings.HasPrefix(err.Error(), "unknown command ")
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "kvindex",
		Short: "Precise KV-cache index for prefix-aware LLM routing",
		Long: `kvindex subscribes to the KV-cache events of every inference engine (vLLM,
SGLang) over ZMQ, keeps a fleet-wide block-hash -> holders index that mirrors
the engines' own chained prefix-block hashing, and answers one question fast:
for this prompt, how long a cached prefix does each pod hold?

Every flag can also be set by an environment variable KVINDEX_<FLAG_NAME>
(e.g. KVINDEX_SERVER=kvindex:50051, KVINDEX_GRPC_ADDR=:50051); serve and
picker also read a YAML --config file keyed by flag name. The command line
wins over the environment, which wins over the file.

Exit status: 0 on success, 1 when the command failed, 2 on a usage error.`,
		Version:       buildinfo.Read().String(),
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			fs := cmd.Flags()
			warnUnknownEnv(cmd)
			return configUsage(flagsource.Apply(fs, cmd.CommandPath(), os.LookupEnv), flagNames(fs))
		},
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{msg: err.Error()} })
	root.AddCommand(newHashCmd(), newServeCmd(), newQueryCmd(), newLookupCmd(), newPodsCmd(), newTailCmd(),
		newPickerCmd(), newRelayCmd(), newDemoCmd(), newSimCmd(), newLoadgenCmd(), newTopCmd(), newDoctorCmd(), newVersionCmd())
	return root
}

// warnUnknownEnv warns of the KVINDEX_* variables that set no flag of any
// kvindex command: most likely misspelled, and otherwise ignored unseen.
func warnUnknownEnv(cmd *cobra.Command) {
	var sets []*pflag.FlagSet
	for _, c := range cmd.Root().Commands() {
		sets = append(sets, c.Flags())
	}
	names, guesses := flagsource.UnknownEnv(os.Environ(), cmd.Flags(), sets...)
	for i, name := range names {
		hint := ""
		if guesses[i] != "" {
			hint = " (did you mean " + guesses[i] + "?)"
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "kvindex: warning: %s sets no flag of any kvindex command; ignored%s\n", name, hint)
	}
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and Go version kvindex was built from",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), buildinfo.Read().String())
			return err
		},
	}
}

// noArgs rejects positional arguments as a usage error.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s takes no arguments, got %q", cmd.CommandPath(), args[0])
	}
	return nil
}

// oneLine keeps an error message on a single line, as the CLI contract
// promises.
func oneLine(err error) string { return lineBreaks.Replace(err.Error()) }

var lineBreaks = strings.NewReplacer("\n", " ", "\r", " ")

// usageError marks errors caused by bad flags or arguments.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return usageError{msg: fmt.Sprintf(format, args...)}
}
