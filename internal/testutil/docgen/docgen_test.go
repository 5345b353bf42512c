package docgen

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReplace(t *testing.T) {
	tests := []struct {
		doc, want, err string
	}{
		{"within <!-- x:begin -->10%<!-- x:end --> of it", "within <!-- x:begin -->20%<!-- x:end --> of it", ""},
		{"<!-- x:begin -->\nold\n<!-- x:end -->\n", "<!-- x:begin -->20%<!-- x:end -->\n", ""},
		{"<!-- x:begin --><!-- x:end -->", "<!-- x:begin -->20%<!-- x:end -->", ""},
		{"no markers", "", "not found"},
		{"<!-- x:end --> <!-- x:begin -->", "", "not found"},
		{"<!-- y:begin --><!-- y:end -->", "", "not found"},
		{"<!-- x:begin -->a<!-- x:end --> <!-- x:begin -->b<!-- x:end -->", "", "more than once"},
	}
	for _, tt := range tests {
		got, err := Replace([]byte(tt.doc), "x", "20%")
		switch {
		case tt.err != "":
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("Replace(%q) = %q, %v; want error %q", tt.doc, got, err, tt.err)
			}
		case err != nil || string(got) != tt.want:
			t.Errorf("Replace(%q) = %q, %v; want %q", tt.doc, got, err, tt.want)
		}
	}
}

func TestCheckUpdate(t *testing.T) {
	file := filepath.Join(t.TempDir(), "doc.md")
	if err := os.WriteFile(file, []byte("a <!-- x:begin -->old<!-- x:end --> b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	Check(t, file, "x", "new", true)
	got, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if want := "a <!-- x:begin -->new<!-- x:end --> b\n"; string(got) != want {
		t.Fatalf("after -update: %q, want %q", got, want)
	}
	Check(t, file, "x", "new", false) // now the same: passes
}
