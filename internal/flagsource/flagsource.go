// Package flagsource fills a command's flags from the sources beside the
// command line: environment variables named PREFIX<FLAG_NAME> and a YAML
// file keyed by flag name. The mapping walks the flag set, so a new flag
// is settable from every source without further code.
//
// Errors are *configerr.Error naming the flag at fault by its name (the
// YAML file by its flag's, "config"); the command writes the names as
// its flags.
package flagsource

import (
	"bytes"
	"errors"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// Settings reach a command's flags from three sources, highest precedence
// first: the command line, environment variables named KVINDEX_<FLAG_NAME>
// (upper case, dashes as underscores: KVINDEX_GRPC_ADDR for --grpc-addr),
// and, for commands with a flag named ConfigFlag, a YAML file whose keys
// are flag names.

// EnvPrefix starts every environment variable that sets a flag.
const EnvPrefix = "KVINDEX_"

// ConfigFlag is the flag that names the YAML file of settings.
const ConfigFlag = "config"

// maxConfigFile bounds a configuration file.
const maxConfigFile = 1 << 20

// EnvName is the environment variable that sets flag name.
func EnvName(flag string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// UnknownEnv returns, sorted, the variables of environ (KEY=VALUE, as
// os.Environ gives them) named EnvPrefix... that set no flag of any of
// sets, each with the variable of fs's flags it most likely misspells
// ("" when none is close): Apply ignores them, so a typo would otherwise
// go unnoticed.
func UnknownEnv(environ []string, fs *pflag.FlagSet, sets ...*pflag.FlagSet) (names, guesses []string) {
	known := map[string]bool{}
	for _, set := range append(sets, fs) {
		set.VisitAll(func(f *pflag.Flag) { known[EnvName(f.Name)] = !notSettable[f.Name] })
	}
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, EnvPrefix) && !known[name] && !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		guess, best := "", 3 // further than 2 edits is no typo
		fs.VisitAll(func(f *pflag.Flag) {
			if d := editDistance(name, EnvName(f.Name)); d < best && !notSettable[f.Name] {
				guess, best = EnvName(f.Name), d
			}
		})
		guesses = append(guesses, guess)
	}
	return names, guesses
}

// editDistance is the Levenshtein distance of a and b, in bytes.
func editDistance(a, b string) int {
	row := make([]int, len(b)+1)
	for j := range row {
		row[j] = j
	}
	for i := 1; i <= len(a); i++ {
		diag := row[0]
		row[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			diag, row[j] = row[j], min(row[j]+1, row[j-1]+1, diag+cost)
		}
	}
	return row[len(b)]
}

// notSettable are flags only the command line sets.
var notSettable = map[string]bool{"help": true, "version": true}

// repeatable reports whether a flag takes a list (each Set appends).
func repeatable(f *pflag.Flag) bool {
	_, ok := f.Value.(pflag.SliceValue)
	return ok
}

// Apply fills the flags of fs the command line left unset from the
// environment, then from the configuration file if fs has ConfigFlag and
// it is set. lookupEnv is os.LookupEnv outside tests. Environment
// variables that name no flag of fs are ignored: one environment serves
// several commands (serve's KVINDEX_GRPC_ADDR means nothing to hash).
// command names the command in errors.
func Apply(fs *pflag.FlagSet, command string, lookupEnv func(string) (string, bool)) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed || notSettable[f.Name] {
			return
		}
		v, ok := lookupEnv(EnvName(f.Name))
		if !ok {
			return
		}
		vals := []string{v}
		if repeatable(f) {
			vals = strings.Fields(v) // list items are separated by spaces or newlines
		}
		for _, s := range vals {
			if e := fs.Set(f.Name, s); e != nil {
				err = configerr.New(configerr.Field(f.Name), "%s=%q: %v", EnvName(f.Name), v, e)
				return
			}
		}
	})
	if err != nil {
		return err
	}
	if cf := fs.Lookup(ConfigFlag); cf != nil && cf.Value.String() != "" {
		return applyConfigFile(fs, cf.Value.String(), command)
	}
	return nil
}

// applyConfigFile reads a YAML mapping of flag names to values and sets
// every flag that neither the command line nor the environment set. A key
// that names no flag is an error, as is a list for a flag that takes one
// value.
func applyConfigFile(fs *pflag.FlagSet, path, command string) error {
	config := configerr.Field(ConfigFlag)
	f, err := os.Open(path)
	if err != nil {
		return configErr("%v: %v", config, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigFile+1))
	if err != nil {
		return configErr("%v %s: %v", config, path, err)
	}
	if len(data) > maxConfigFile {
		return configErr("%v %s: larger than %d bytes", config, path, maxConfigFile)
	}
	var doc yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // an empty file sets nothing
		}
		return configErr("%v %s: %s", config, path, oneLine.Replace(err.Error()))
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil
	}
	if root.Kind != yaml.MappingNode {
		return configErr("%v %s: line %d: want a mapping of flag names to values", config, path, root.Line)
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		at := configerr.New(config, "%v %s: line %d", config, path, k.Line)
		fl := fs.Lookup(k.Value)
		if fl == nil || notSettable[k.Value] || k.Value == ConfigFlag {
			return configErr("%v: unknown key %q (keys are the flag names of %s)", at, k.Value, command)
		}
		if seen[k.Value] {
			return configErr("%v: key %q given twice", at, k.Value)
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
					return configErr("%v: %s: list items must be plain values", at, k.Value)
				}
				vals = append(vals, item.Value)
			}
		case v.Kind == yaml.SequenceNode:
			return configErr("%v: %s takes one value, not a list", at, k.Value)
		default:
			return configErr("%v: %s: want a plain value", at, k.Value)
		}
		for _, s := range vals {
			if err := fs.Set(k.Value, s); err != nil {
				return configErr("%v: %s: %v", at, k.Value, err)
			}
		}
	}
	return nil
}

// configErr is an error of the configuration file.
func configErr(format string, args ...any) error {
	return configerr.New(ConfigFlag, format, args...)
}

// oneLine keeps a YAML parser's message on one line.
var oneLine = strings.NewReplacer("\n", " ", "\r", " ")
