package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// The documentation's facts that the code also states are checked here
// against the code, so each has one home: go test -run TestDocs -update
// rewrites the generated parts of the docs.
var updateDocs = flag.Bool("update", false, "rewrite the generated parts of README.md and api/README.md")

// replaceBetween returns doc with the text between the marker comments
// <!-- name:begin --> and <!-- name:end --> replaced by body.
func replaceBetween(t *testing.T, doc []byte, name, body string) []byte {
	t.Helper()
	begin, end := []byte("<!-- "+name+":begin -->\n"), []byte("<!-- "+name+":end -->")
	i, j := bytes.Index(doc, begin), bytes.Index(doc, end)
	if i < 0 || j < i {
		t.Fatalf("markers <!-- %s:begin --> and <!-- %s:end --> not found", name, name)
	}
	var out bytes.Buffer
	out.Write(doc[:i+len(begin)])
	out.WriteString(body)
	out.Write(doc[j:])
	return out.Bytes()
}

// checkGenerated compares the generated part name of file with body, or
// rewrites it under -update.
func checkGenerated(t *testing.T, file, name, body string) {
	t.Helper()
	doc, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	want := replaceBetween(t, doc, name, body)
	if bytes.Equal(doc, want) {
		return
	}
	if *updateDocs {
		if err := os.WriteFile(file, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s: the part %q differs from what the code says; run go test ./cmd/kvindex -run TestDocs -update\nwant:\n%s", file, name, body)
}

// flagTable renders a command's flags as a markdown table: the flag, its
// default and its help, straight from the flag set.
func flagTable(fs *pflag.FlagSet) string {
	var b strings.Builder
	b.WriteString("| flag | default | meaning |\n|---|---|---|\n")
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		name := "--" + f.Name
		if t := f.Value.Type(); t != "bool" {
			name += " " + strings.ToUpper(strings.TrimSuffix(t, "Array"))
		}
		def := f.DefValue
		switch def {
		case "", "[]", "false":
			def = ""
		default:
			def = "`" + def + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", name, def, strings.ReplaceAll(f.Usage, "|", `\|`))
	})
	return b.String()
}

func TestDocsServeFlags(t *testing.T) {
	var f serveFlags
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	f.register(fs)
	checkGenerated(t, "../../api/README.md", "serve-flags", flagTable(fs))
}
