package goldenfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestGenerator builds a small module in a temporary directory with a
// golden file at pkg/testdata/g.json and checks which "generator" fields
// are accepted.
func TestGenerator(t *testing.T) {
	for _, tc := range []struct {
		name    string
		golden  string // contents of pkg/testdata/g.json
		wantErr string // empty: accepted
	}{
		{"repository path", `{"generator": "pkg/testdata/gen.py"}`, ""},
		{"generator in another directory", `{"generator": "tools/gen_all.py"}`, ""},
		{"missing field", `{"source": "pkg/testdata/gen.py"}`, "no \"generator\" field"},
		{"empty field", `{"generator": ""}`, "no \"generator\" field"},
		{"not a string", `{"generator": 3}`, "cannot unmarshal"},
		{"not JSON", `generator: pkg/testdata/gen.py`, "invalid character"},
		{"outside the repository", `{"generator": "../shared/vectors/gen_vectors.py"}`, "not a clean path"},
		{"absolute", `{"generator": "/usr/bin/gen.py"}`, "not a clean path"},
		{"relative to the golden file", `{"generator": "./gen.py"}`, "not a clean path"},
		{"not clean", `{"generator": "pkg//testdata/gen.py"}`, "not a clean path"},
		{"backslashes", `{"generator": "pkg\\testdata\\gen.py"}`, "not a clean path"},
		{"prose", `{"generator": "copied from shared/vectors/vectors.json; regenerate there"}`, "not a file in the repository"},
		{"missing file", `{"generator": "pkg/testdata/gone.py"}`, "not a file in the repository"},
		{"directory", `{"generator": "pkg/testdata"}`, "not a file in the repository"},
		{"script of another file", `{"generator": "pkg/testdata/gen_other.py"}`, "never mentions g.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			write(t, root, "go.mod", "module example.com/m\n")
			write(t, root, "pkg/testdata/gen.py", "# writes g.json\n")
			write(t, root, "tools/gen_all.py", "# writes pkg/testdata/g.json and others\n")
			write(t, root, "pkg/testdata/gen_other.py", "# writes other.json\n")
			write(t, root, "pkg/testdata/g.json", tc.golden)
			t.Chdir(filepath.Join(root, "pkg"))
			gen, err := Generator("testdata/g.json")
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("rejected: %v", err)
			case tc.wantErr != "" && err == nil:
				t.Fatalf("accepted %q, want an error containing %q", gen, tc.wantErr)
			case tc.wantErr != "" && !strings.Contains(err.Error(), tc.wantErr):
				t.Fatalf("error %q, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func write(t *testing.T, root, name, contents string) {
	t.Helper()
	p := filepath.Join(root, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(contents), 0o644); err != nil {
		t.Fatal(err)
	}
}
