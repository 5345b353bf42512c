// Command kvindex tells an LLM router which replica already holds a
// request's prompt in its KV cache.
//
// It subscribes to the KV-cache events of every engine (vLLM, SGLang),
// keeps a block-hash -> holders index that mirrors the engines' own chained
// prefix-block hashing, and answers, for a prompt, how long a cached prefix
// each pod holds. Run "kvindex help" for the subcommands.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line and returns the process exit code: 0 on
// success, 1 on any error, which is printed as one line on stderr.
func run(args []string, stdout, stderr io.Writer) int {
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.Execute(); err != nil {
		fmt.Fprintf(stderr, "kvindex: %v\n", oneLine(err))
		return 1
	}
	return 0
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "kvindex",
		Short: "Precise KV-cache index for prefix-aware LLM routing",
		Long: `kvindex subscribes to the KV-cache events of every inference engine (vLLM,
SGLang) over ZMQ, keeps a fleet-wide block-hash -> holders index that mirrors
the engines' own chained prefix-block hashing, and answers one question fast:
for this prompt, how long a cached prefix does each pod hold?`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newHashCmd())
	root.AddCommand(newServeCmd())
	root.AddCommand(newQueryCmd())
	root.AddCommand(newLookupCmd())
	root.AddCommand(newPodsCmd())
	root.AddCommand(newTailCmd())
	root.AddCommand(newDemoCmd())
	return root
}

// oneLine keeps an error message on a single line, as the CLI contract
// promises.
func oneLine(err error) string {
	msg := err.Error()
	out := make([]rune, 0, len(msg))
	for _, r := range msg {
		if r == '\n' || r == '\r' {
			r = ' '
		}
		out = append(out, r)
	}
	return string(out)
}

// usageError marks errors caused by bad flags or arguments.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return usageError{msg: fmt.Sprintf(format, args...)}
}
