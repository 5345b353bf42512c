// Package docgen checks the generated parts of the repository's documents:
// the text between a <!-- NAME:begin --> and a <!-- NAME:end --> marker
// that a test renders from the code, so that a fact the code defines is
// written by hand in one place only. Under the test's -update flag it
// rewrites the text instead.
package docgen

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
)

// Replace returns doc with the text between the markers of name replaced
// by body. The markers may sit inside a line (a sentence, a table cell:
// inline HTML comments, which Markdown does not show) or on lines of their
// own, body then starting and ending with a newline.
func Replace(doc []byte, name, body string) ([]byte, error) {
	begin, end := []byte("<!-- "+name+":begin -->"), []byte("<!-- "+name+":end -->")
	i, j := bytes.Index(doc, begin), bytes.Index(doc, end)
	if i < 0 || j < i+len(begin) {
		return nil, fmt.Errorf("markers <!-- %s:begin --> and <!-- %s:end --> not found", name, name)
	}
	if bytes.Count(doc, begin) > 1 || bytes.Count(doc, end) > 1 {
		return nil, fmt.Errorf("markers <!-- %s:begin --> and <!-- %s:end --> found more than once", name, name)
	}
	i += len(begin)
	return bytes.Join([][]byte{doc[:i], []byte(body), doc[j:]}, nil), nil
}

// Check compares the text between file's markers of name with body, or,
// with update, rewrites it.
func Check(t testing.TB, file, name, body string, update bool) {
	t.Helper()
	doc, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Replace(doc, name, body)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if bytes.Equal(doc, want) {
		return
	}
	if update {
		if err := os.WriteFile(file, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	test, _, _ := strings.Cut(t.Name(), "/")
	t.Errorf("%s: the text marked %s differs from what the code says (go test -run '^%s$' -update rewrites it); want:\n%s", file, name, test, body)
}
