package tokenizer

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// qwenPath is Qwen2.5's tokenizer.json, written by testdata/gen_golden.js.
const qwenPath = "testdata/qwen2.5/tokenizer.json.gz"

// golden is testdata/golden.json: texts and, per tokenizer variant, the ids
// HuggingFace tokenizers gives them.
type golden struct {
	Tokenizers string   `json:"tokenizers"`
	Texts      []string `json:"texts"`
	Variants   []struct {
		Name             string                     `json:"name"`
		AddSpecialTokens bool                       `json:"add_special_tokens"`
		Patch            map[string]json.RawMessage `json:"patch"`
		IDs              [][]uint64                 `json:"ids"`
	} `json:"variants"`
}

func readGolden(t testing.TB, path string) *golden {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var g golden
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(g.Texts) == 0 || len(g.Variants) == 0 {
		t.Fatalf("%s: no texts or variants", path)
	}
	return &g
}

var (
	qwenOnce sync.Once
	qwenJSON []byte // decompressed tokenizer.json
	qwenTok  *Local
	qwenErr  error
)

// qwen returns the Qwen2.5 tokenizer (loaded once per test binary) and its
// decompressed tokenizer.json.
func qwen(t testing.TB) (*Local, []byte) {
	t.Helper()
	qwenOnce.Do(func() {
		var f *os.File
		if f, qwenErr = os.Open(qwenPath); qwenErr != nil {
			return
		}
		defer f.Close()
		var zr *gzip.Reader
		if zr, qwenErr = gzip.NewReader(f); qwenErr != nil {
			return
		}
		if qwenJSON, qwenErr = io.ReadAll(zr); qwenErr != nil {
			return
		}
		qwenTok, qwenErr = Load(bytes.NewReader(qwenJSON))
	})
	if qwenErr != nil {
		t.Fatal(qwenErr)
	}
	return qwenTok, qwenJSON
}

// patchJSON replaces top-level sections of a tokenizer.json; "model" is
// merged key by key. gen_golden.js applies the same patches.
func patchJSON(t testing.TB, base []byte, patch map[string]json.RawMessage) []byte {
	t.Helper()
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(base, &doc); err != nil {
		t.Fatal(err)
	}
	for k, v := range patch {
		if k != "model" {
			doc[k] = v
			continue
		}
		var model, over map[string]json.RawMessage
		if err := json.Unmarshal(doc["model"], &model); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(v, &over); err != nil {
			t.Fatal(err)
		}
		for mk, mv := range over {
			model[mk] = mv
		}
		doc["model"], _ = json.Marshal(model)
	}
	out, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var (
	qwenFileOnce sync.Once
	qwenFile     fileJSON
	qwenFileErr  error
)

// qwenParsed returns Qwen2.5's tokenizer.json parsed (once); callers must
// not modify it.
func qwenParsed(t testing.TB) *fileJSON {
	t.Helper()
	_, data := qwen(t)
	qwenFileOnce.Do(func() { qwenFileErr = json.Unmarshal(data, &qwenFile) })
	if qwenFileErr != nil {
		t.Fatal(qwenFileErr)
	}
	return &qwenFile
}

// buildPatched is patchJSON followed by Load, without re-encoding and
// re-parsing 7 MB of JSON per variant (slow under the race detector): it
// patches the parsed file, whose sections other than the model are kept
// raw. Model patches may only set scalar fields.
func buildPatched(t testing.TB, patch map[string]json.RawMessage) *Local {
	t.Helper()
	f := *qwenParsed(t)
	for k, v := range patch {
		var err error
		switch k {
		case "normalizer":
			f.Normalizer = v
		case "pre_tokenizer":
			f.PreTokenizer = v
		case "post_processor":
			f.PostProcessor = v
		case "added_tokens":
			f.AddedTokens = nil
			err = json.Unmarshal(v, &f.AddedTokens)
		case "model":
			m := *f.Model
			if bytes.Contains(v, []byte(`"vocab"`)) || bytes.Contains(v, []byte(`"merges"`)) {
				t.Fatalf("model patch %s replaces the vocabulary; use patchJSON", v)
			}
			err = json.Unmarshal(v, &m)
			f.Model = &m
		default:
			t.Fatalf("patch of %q not supported", k)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	tok, err := build(&f)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestPatchedBuild checks that buildPatched is the same as patching the
// JSON and loading it, on the variant that patches the most.
func TestPatchedBuild(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("re-encodes and loads 7 MB of JSON: slow with -short or -race")
	}
	_, data := qwen(t)
	g := readGolden(t, "testdata/golden.json")
	patch := map[string]json.RawMessage{"model": json.RawMessage(`{"ignore_merges":true}`), "normalizer": json.RawMessage(`{"type":"NFKC"}`)}
	for _, v := range g.Variants {
		if v.Name == "added_flags" {
			patch["added_tokens"] = v.Patch["added_tokens"]
		}
	}
	viaJSON, err := Load(bytes.NewReader(patchJSON(t, data, patch)))
	if err != nil {
		t.Fatal(err)
	}
	direct := buildPatched(t, patch)
	for i, text := range g.Texts {
		if a, b := viaJSON.Encode(text, true), direct.Encode(text, true); !slices.Equal(a, b) {
			t.Fatalf("text %d: via JSON %v, patched %v", i, a, b)
		}
	}
}

// TestGolden checks every golden id of every variant against HuggingFace's.
func TestGolden(t *testing.T) {
	base, _ := qwen(t)
	g := readGolden(t, "testdata/golden.json")
	for _, v := range g.Variants {
		t.Run(fmt.Sprintf("%s/special=%v", v.Name, v.AddSpecialTokens), func(t *testing.T) {
			tok := base
			if len(v.Patch) > 0 {
				tok = buildPatched(t, v.Patch)
			}
			checkGolden(t, tok, g.Texts, v.IDs, v.AddSpecialTokens)
		})
	}
}

func checkGolden(t *testing.T, tok *Local, texts []string, ids [][]uint64, special bool) {
	t.Helper()
	if len(ids) == 0 || len(ids) > len(texts) {
		t.Fatalf("%d id lists for %d texts", len(ids), len(texts))
	}
	bad := 0
	for j, want := range ids {
		got := tok.Encode(texts[j], special)
		if !slices.Equal(got, want) {
			bad++
			if bad <= 10 {
				t.Errorf("text %d %q:\n got %v\nwant %v", j, clip(texts[j]), clip(got), clip(want))
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d texts differ", bad, len(ids))
	}
}

func clip[T any](v T) any {
	switch x := any(v).(type) {
	case string:
		if len(x) > 200 {
			r := []rune(x)
			if len(r) > 80 {
				return string(r[:80]) + "…"
			}
		}
		return x
	case []uint64:
		if len(x) > 60 {
			return fmt.Sprintf("%v… (%d ids)", x[:60], len(x))
		}
		return x
	}
	return v
}

// TestGoldenExternal runs golden files for tokenizers that cannot be
// committed (Llama 3's licence). Set TOKENIZER_GOLDEN_DIR to a directory of
// <name>.json tokenizer files with <name>.golden.json written by
// "node gen_golden.js <name>.json <name>.golden.json".
func TestGoldenExternal(t *testing.T) {
	dir := os.Getenv("TOKENIZER_GOLDEN_DIR")
	if dir == "" {
		t.Skip("TOKENIZER_GOLDEN_DIR not set")
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.golden.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no *.golden.json in %s (%v)", dir, err)
	}
	for _, gf := range files {
		name := filepath.Base(gf[:len(gf)-len(".golden.json")])
		t.Run(name, func(t *testing.T) {
			tok, err := LoadFile(filepath.Join(dir, name+".json"))
			if err != nil {
				t.Fatal(err)
			}
			g := readGolden(t, gf)
			for _, v := range g.Variants {
				checkGolden(t, tok, g.Texts, v.IDs, v.AddSpecialTokens)
			}
		})
	}
}

// TestGoldenCorpus guards the corpus itself: it must keep covering the
// classes of text the package promises to handle.
func TestGoldenCorpus(t *testing.T) {
	g := readGolden(t, "testdata/golden.json")
	has := func(name string, f func(string) bool) {
		for _, s := range g.Texts {
			if f(s) {
				return
			}
		}
		t.Errorf("corpus has no %s", name)
	}
	contains := func(sub string) func(string) bool {
		return func(s string) bool { return strings.Contains(s, sub) }
	}
	anyRune := func(lo, hi rune) func(string) bool {
		return func(s string) bool {
			for _, r := range s {
				if lo <= r && r <= hi {
					return true
				}
			}
			return false
		}
	}
	has("empty text", func(s string) bool { return s == "" })
	has("CJK", anyRune(0x4E00, 0x9FFF))
	has("emoji", anyRune(0x1F300, 0x1FAFF))
	has("combining mark", anyRune(0x0300, 0x036F))
	has("NBSP", contains("\u00a0"))
	has("ZWSP", contains("\u200b"))
	has("long digit run", contains("12345678901234567890"))
	has("long whitespace run", contains("                                        "))
	has("chat special token", contains("<|im_start|>"))
	if n := len(g.Variants[0].IDs[len(g.Variants[0].IDs)-1]); n < 7000 {
		t.Errorf("long text has %d tokens, want ~8k", n)
	}
}
