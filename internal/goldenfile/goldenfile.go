package goldenfile

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// Generator reads the golden file at file (relative to the working
// directory, as tests open their testdata) and returns the generator its
// "generator" field names. It fails unless that is a clean, slash-separated
// path relative to the module root (the nearest directory above file that
// holds go.mod), names a regular file there, and that file mentions the
// golden file's base name (so a field copied from another file is caught).
func Generator(file string) (string, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	var doc struct {
		Generator *string `json:"generator"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return "", fmt.Errorf("%s: %w", file, err)
	}
	if doc.Generator == nil || *doc.Generator == "" {
		return "", fmt.Errorf("%s: no \"generator\" field naming the script that writes it", file)
	}
	gen := *doc.Generator
	if !filepath.IsLocal(gen) || path.Clean(gen) != gen || strings.Contains(gen, `\`) {
		return "", fmt.Errorf("%s: generator %q is not a clean path relative to the module root", file, gen)
	}
	root, err := moduleRoot(file)
	if err != nil {
		return "", err
	}
	src, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(gen)))
	if err != nil {
		return "", fmt.Errorf("%s: generator %q is not a file in the repository: %w", file, gen, err)
	}
	if name := filepath.Base(file); !strings.Contains(string(src), name) {
		return "", fmt.Errorf("%s: generator %q never mentions %s", file, gen, name)
	}
	return gen, nil
}

// moduleRoot is the nearest directory at or above file's that holds go.mod.
func moduleRoot(file string) (string, error) {
	abs, err := filepath.Abs(file)
	if err != nil {
		return "", err
	}
	for dir := filepath.Dir(abs); ; {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return "", err
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("%s: no go.mod above it", file)
		}
		dir = parent
	}
}
