package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// Settings reach a command's flags from three sources, highest precedence
// first: the command line, environment variables named KVINDEX_<FLAG_NAME>
// (upper case, dashes as underscores: KVINDEX_GRPC_ADDR for --grpc-addr),
// and, for commands with a --config flag, a YAML file whose keys are flag
// names. The mapping walks the command's flag set, so a new flag is
// settable from all three without further code.

// envPrefix starts every environment variable that sets a flag.
const envPrefix = "KVINDEX_"

// maxConfigFile bounds a --config file.
const maxConfigFile = 1 << 20

// envName is the environment variable that sets flag name.
func envName(flag string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// notSettable are flags only the command line sets.
var notSettable = map[string]bool{"help": true, "version": true}

// repeatable reports whether a flag takes a list (each Set appends).
func repeatable(f *pflag.Flag) bool {
	_, ok := f.Value.(pflag.SliceValue)
	return ok
}

// applySettings fills the flags the command line left unset from the
// environment, then from the --config file if the command has one.
// lookupEnv is os.LookupEnv outside tests. Environment variables that name
// no flag of this command are ignored: one environment serves several
// commands (serve's KVINDEX_GRPC_ADDR means nothing to hash).
func applySettings(cmd *cobra.Command, lookupEnv func(string) (string, bool)) error {
	return applyFlagSettings(cmd.Flags(), cmd.CommandPath(), lookupEnv)
}

// applyFlagSettings is applySettings for one flag set; command names it in
// errors.
func applyFlagSettings(fs *pflag.FlagSet, command string, lookupEnv func(string) (string, bool)) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed || notSettable[f.Name] {
			return
		}
		v, ok := lookupEnv(envName(f.Name))
		if !ok {
			return
		}
		vals := []string{v}
		if repeatable(f) {
			vals = strings.Fields(v) // list items are separated by spaces or newlines
		}
		for _, s := range vals {
			if e := fs.Set(f.Name, s); e != nil {
				err = usagef("%s=%q: %v", envName(f.Name), v, e)
				return
			}
		}
	})
	if err != nil {
		return err
	}
	if cf := fs.Lookup("config"); cf != nil && cf.Value.String() != "" {
		return applyConfigFile(fs, cf.Value.String(), command)
	}
	return nil
}

// applyConfigFile reads a YAML mapping of flag names to values and sets
// every flag that neither the command line nor the environment set. A key
// that names no flag is an error, as is a list for a flag that takes one
// value.
func applyConfigFile(fs *pflag.FlagSet, path, command string) error {
	f, err := os.Open(path)
	if err != nil {
		return usagef("--config: %v", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigFile+1))
	if err != nil {
		return usagef("--config %s: %v", path, err)
	}
	if len(data) > maxConfigFile {
		return usagef("--config %s: larger than %d bytes", path, maxConfigFile)
	}
	var doc yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // an empty file sets nothing
		}
		return usagef("--config %s: %s", path, oneLine(err))
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil
	}
	if root.Kind != yaml.MappingNode {
		return usagef("--config %s: line %d: want a mapping of flag names to values", path, root.Line)
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		at := fmt.Sprintf("--config %s: line %d", path, k.Line)
		fl := fs.Lookup(k.Value)
		if fl == nil || notSettable[k.Value] || k.Value == "config" {
			return usagef("%s: unknown key %q (keys are the flag names of %s)", at, k.Value, command)
		}
		if seen[k.Value] {
			return usagef("%s: key %q given twice", at, k.Value)
		}
		seen[k.Value] = true
		if fl.Changed {
			continue // the command line or the environment wins
		}
		var vals []string
		switch {
		case v.Kind == yaml.ScalarNode && v.Tag == "!!null":
			continue
		case v.Kind == yaml.ScalarNode:
			vals = []string{v.Value}
		case v.Kind == yaml.SequenceNode && repeatable(fl):
			for _, item := range v.Content {
				if item.Kind != yaml.ScalarNode {
					return usagef("%s: %s: list items must be plain values", at, k.Value)
				}
				vals = append(vals, item.Value)
			}
		case v.Kind == yaml.SequenceNode:
			return usagef("%s: %s takes one value, not a list", at, k.Value)
		default:
			return usagef("%s: %s: want a plain value", at, k.Value)
		}
		for _, s := range vals {
			if err := fs.Set(k.Value, s); err != nil {
				return usagef("%s: %s: %v", at, k.Value, err)
			}
		}
	}
	return nil
}
