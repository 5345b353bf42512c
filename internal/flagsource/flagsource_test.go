package flagsource_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/internal/flagsource"
)

// flags is a small command's flag set: a value, a list, a number and the
// configuration file's flag.
func flags() *pflag.FlagSet {
	fs := pflag.NewFlagSet("cmd", pflag.ContinueOnError)
	fs.String("grpc-addr", ":50051", "")
	fs.StringArray("engine", nil, "")
	fs.Int("max-engines", 8, "")
	fs.String(flagsource.ConfigFlag, "", "")
	return fs
}

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// The command line wins over the environment, which wins over the file;
// a list in the environment is split on spaces and newlines.
func TestPrecedence(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(file, []byte("grpc-addr: \":1\"\nmax-engines: 3\nengine: [a=tcp://h:1]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := flags()
	if err := fs.Parse([]string{"--max-engines", "5"}); err != nil {
		t.Fatal(err)
	}
	err := flagsource.Apply(fs, "kvindex cmd", env(map[string]string{
		"KVINDEX_CONFIG": file, "KVINDEX_ENGINE": "b=tcp://h:2\nc=tcp://h:3", "KVINDEX_UNKNOWN": "ignored",
	}))
	if err != nil {
		t.Fatal(err)
	}
	get := func(name string) string { return fs.Lookup(name).Value.String() }
	if get("grpc-addr") != ":1" || get("max-engines") != "5" || get("engine") != "[b=tcp://h:2,c=tcp://h:3]" {
		t.Errorf("grpc-addr %s, max-engines %s, engine %s", get("grpc-addr"), get("max-engines"), get("engine"))
	}
}

// Every refusal is a configuration error naming the flag at fault (the
// file by ConfigFlag), on one line.
func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		env        map[string]string
		field      configerr.Field
		want       string
	}{
		{"bad value in the environment", "", map[string]string{"KVINDEX_MAX_ENGINES": "many"}, "max-engines", `KVINDEX_MAX_ENGINES="many": `},
		{"unknown key", "grpc-adr: x\n", nil, "config", `line 1: unknown key "grpc-adr" (keys are the flag names of kvindex cmd)`},
		{"twice", "max-engines: 1\nmax-engines: 2\n", nil, "config", `line 2: key "max-engines" given twice`},
		{"list for a value", "grpc-addr: [a, b]\n", nil, "config", "grpc-addr takes one value, not a list"},
		{"mapping", "grpc-addr: {a: b}\n", nil, "config", "grpc-addr: want a plain value"},
		{"not a mapping", "- a\n", nil, "config", "want a mapping of flag names to values"},
		{"not YAML", "engine: [\n", nil, "config", "c.yaml: "},
		{"the file names itself", "config: other.yaml\n", nil, "config", `unknown key "config"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := map[string]string{}
			for k, v := range tc.env {
				e[k] = v
			}
			if tc.file != "" {
				file := filepath.Join(t.TempDir(), "c.yaml")
				if err := os.WriteFile(file, []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
				e["KVINDEX_CONFIG"] = file
			}
			err := flagsource.Apply(flags(), "kvindex cmd", env(e))
			ce, ok := configerr.As(err)
			if !ok || ce.Field != tc.field || !ce.Usage() || !strings.Contains(err.Error(), tc.want) || strings.ContainsAny(err.Error(), "\n\r") {
				t.Fatalf("error %v, want one line of %s saying %q", err, tc.field, tc.want)
			}
		})
	}
	// A missing file, and one too large.
	for _, path := range []string{filepath.Join(t.TempDir(), "missing.yaml"), bigFile(t)} {
		err := flagsource.Apply(flags(), "kvindex cmd", env(map[string]string{"KVINDEX_CONFIG": path}))
		if ce, ok := configerr.As(err); !ok || ce.Field != flagsource.ConfigFlag {
			t.Errorf("%s: %v", path, err)
		}
	}
	// An empty file sets nothing.
	empty := filepath.Join(t.TempDir(), "e.yaml")
	os.WriteFile(empty, nil, 0o600)
	if err := flagsource.Apply(flags(), "kvindex cmd", env(map[string]string{"KVINDEX_CONFIG": empty})); err != nil {
		t.Errorf("an empty file: %v", err)
	}
}

func bigFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(path, []byte("# "+strings.Repeat("x", 1<<20)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// FuzzApply: any file content is applied or refused with a configuration
// error, never a panic.
func FuzzApply(f *testing.F) {
	for _, s := range []string{"grpc-addr: \":1\"\n", "engine: [a, b]\n", "- a\n", "engine: [\n", "max-engines: {a: b}\n", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, content string) {
		file := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		err := flagsource.Apply(flags(), "kvindex cmd", env(map[string]string{"KVINDEX_CONFIG": file}))
		if _, ok := configerr.As(err); err != nil && !ok {
			t.Fatalf("not a configuration error: %v", err)
		}
	})
}

// KVINDEX_* variables that set no flag of any command are reported once
// each, sorted, with the command's variable they are a typo of (within
// two edits); other variables, and those of another command's flags, are
// not.
func TestUnknownEnv(t *testing.T) {
	other := pflag.NewFlagSet("other", pflag.ContinueOnError)
	other.String("server", "", "")
	other.Bool("help", false, "")
	for _, tc := range []struct {
		name           string
		environ        []string
		names, guesses []string
	}{
		{"none", []string{"HOME=/root", "KVINDEX_GRPC_ADDR=:1", "KVINDEX_SERVER=x", "NATS_USER=u"}, nil, nil},
		{"typo", []string{"KVINDEX_GRPC_ADR=:1"}, []string{"KVINDEX_GRPC_ADR"}, []string{"KVINDEX_GRPC_ADDR"}},
		{"far", []string{"KVINDEX_ZZZ=1", "KVINDEX_MAX_ENGINE=2", "KVINDEX_ZZZ=2"}, []string{"KVINDEX_MAX_ENGINE", "KVINDEX_ZZZ"}, []string{"KVINDEX_MAX_ENGINES", ""}},
		{"not settable", []string{"KVINDEX_HELP=1"}, []string{"KVINDEX_HELP"}, []string{""}},
		{"lower case", []string{"kvindex_grpc_addr=:1"}, nil, nil},
	} {
		names, guesses := flagsource.UnknownEnv(tc.environ, flags(), other)
		if !slices.Equal(names, tc.names) || !slices.Equal(guesses, tc.guesses) {
			t.Errorf("%s: %q %q, want %q %q", tc.name, names, guesses, tc.names, tc.guesses)
		}
	}
}
